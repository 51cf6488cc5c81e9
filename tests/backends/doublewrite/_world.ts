/**
 * Helpers of the double-write tests: a private API server and its etcd as Cilium's two stores,
 * nodes on either side alone or on both (library allocators), the CLI's store options in each of
 * Cilium's modes, and each side read directly (ID → label set).
 */
import { Allocator } from "../../../mod.ts";
import type { Backend } from "../../../src/allocator/backend.ts";
import {
  DoubleWriteBackend,
  type IdentityAllocationMode,
  isDoubleWrite,
  listMasters,
} from "../../../src/backends/doublewrite/mod.ts";
import { EtcdBackend } from "../../../src/backends/etcd/mod.ts";
import { K8sBackend } from "../../../src/backends/k8s/mod.ts";
import {
  type KubeTestCluster,
  startKubeApiServer,
} from "../../../src/backends/k8s/testing/cluster.ts";

/** The namespace of the idalloc nodes' Leases (and of the tests' CiliumEndpoints). */
export const NAMESPACE = "default";

/** Options of the nodes the tests open. */
export interface NodeOptions {
  /** The IDs it allocates from (default 256–65535, Cilium's). */
  readonly min?: number;
  readonly max?: number;
  /** The CRD side's heartbeat timeout (its GC grace), in ms. */
  readonly heartbeatTimeoutMs?: number;
}

/** The kvstore side alone, as node `node`. */
export function openKvstore(etcd: string, node: string): Promise<EtcdBackend> {
  return EtcdBackend.connect({ endpoints: [etcd], node });
}

/** The CRD side alone, as node `node` (the kubeconfig's context `test`). */
export function openCrd(
  kubeconfig: string,
  node: string,
  options: NodeOptions = {},
): Promise<K8sBackend> {
  return K8sBackend.connect({
    node,
    kubeconfig,
    context: "test",
    namespace: NAMESPACE,
    maxClockSkewMs: 500,
    ...(options.heartbeatTimeoutMs === undefined
      ? {}
      : { heartbeatTimeoutMs: options.heartbeatTimeoutMs }),
  });
}

/** Where a node of some mode connects. */
export interface ModeConfig {
  readonly etcd: string;
  readonly kubeconfig: string;
  readonly mode: IdentityAllocationMode;
  readonly node: string;
}

/** A backend of one of Cilium's modes and what closes it. */
export interface OpenedMode {
  readonly backend: Backend;
  close(): Promise<void>;
}

/** The backend of `config.mode`: etcd alone, Kubernetes alone, or both composed. */
export async function openMode(config: ModeConfig, options: NodeOptions = {}): Promise<OpenedMode> {
  const { etcd, kubeconfig, mode, node } = config;
  if (mode === "kvstore") {
    const kv = await openKvstore(etcd, node);
    return { backend: kv, close: () => kv.close() };
  }
  if (mode === "crd") {
    const crd = await openCrd(kubeconfig, node, options);
    return { backend: crd, close: () => crd.close() };
  }
  const kvstore = await openKvstore(etcd, node);
  const crd = await openCrd(kubeconfig, node, options);
  return {
    backend: new DoubleWriteBackend({ mode, kvstore, crd }),
    async close() {
      await crd.close();
      await kvstore.close();
    },
  };
}

/** One idalloc node: its allocator and backend, closed together. */
export interface TestNode extends AsyncDisposable {
  readonly alloc: Allocator<string>;
  readonly backend: Backend;
}

/**
 * A private API server (test copies of Cilium's CRDs) and its etcd as the two stores; disposing
 * stops them.
 */
export async function startStores(): Promise<Stores & AsyncDisposable> {
  const cluster = await startKubeApiServer();
  const kubeconfig = await cluster.kubeconfig("admin", { context: "test", namespace: NAMESPACE });
  return Object.assign(new Stores(cluster, kubeconfig), {
    [Symbol.asyncDispose]: () => cluster.close(),
  });
}

/** Writes label sets as Cilium's node and `_migration_node.ts` read them (`-labels`) into `dir`. */
export function labelsWriter(
  dir: string,
): (sets: readonly (readonly string[])[]) => Promise<string> {
  let files = 0;
  return async (sets) => {
    const path = `${dir}/labels-${++files}.json`;
    await Deno.writeTextFile(path, JSON.stringify(sets));
    return path;
  };
}

/** One side's entry written by {@linkcode Stores.plant}. */
export interface Planted extends AsyncDisposable {
  /** Drops the reference (the entry stays). */
  release(): Promise<void>;
}

/** The two stores of a test cluster. */
export class Stores {
  /** The etcd endpoint (the kvstore; the API server's own etcd, as in the interop tests). */
  readonly etcd: string;
  /** The API server (with Cilium's CRDs). */
  readonly cluster: KubeTestCluster;
  /** An admin kubeconfig with the context `test`. */
  readonly kubeconfig: string;

  /**
   * @param cluster the API server (with Cilium's CRDs)
   * @param kubeconfig an admin kubeconfig with the context `test`
   */
  constructor(cluster: KubeTestCluster, kubeconfig: string) {
    this.cluster = cluster;
    this.kubeconfig = kubeconfig;
    this.etcd = cluster.etcd.endpoints[0];
  }

  /** The kvstore side alone, as node `node`. */
  kvstore(node: string): Promise<EtcdBackend> {
    return openKvstore(this.etcd, node);
  }

  /** The CRD side alone, as node `node`. */
  crd(node: string, options: NodeOptions = {}): Promise<K8sBackend> {
    return openCrd(this.kubeconfig, node, options);
  }

  /** The backend of `mode` as node `node` and what closes it. */
  backend(
    mode: IdentityAllocationMode,
    node: string,
    options: NodeOptions = {},
  ): Promise<OpenedMode> {
    return openMode({ etcd: this.etcd, kubeconfig: this.kubeconfig, mode, node }, options);
  }

  /** An idalloc node in `mode`. */
  async node(
    mode: IdentityAllocationMode,
    node: string,
    options: NodeOptions = {},
  ): Promise<TestNode> {
    const { backend, close } = await this.backend(mode, node, options);
    const alloc = await Allocator.open(backend, {
      min: options.min ?? 256,
      max: options.max ?? 65535,
      leaseTtlMs: 3_000,
    });
    await alloc.waitForInitialSync();
    return {
      alloc,
      backend,
      async [Symbol.asyncDispose]() {
        await alloc.close();
        await close();
      },
    };
  }

  /**
   * Writes `key` → `id` on one side alone, through that side's own session (its allocation path,
   * offering that ID only): planted drift. The reference is held until released or disposed.
   */
  async plant(side: "kvstore" | "crd", node: string, key: string, id: number): Promise<Planted> {
    const backend = side === "kvstore" ? await this.kvstore(node) : await this.crd(node);
    const session = await backend.openSession({
      leaseTtlMs: 3_000,
      readOnly: false,
      onLeaseReplaced: () => {},
    });
    const signal = AbortSignal.timeout(60_000);
    const got = await session.acquire({
      key,
      signal,
      pickCandidate: (exclude) => (exclude.has(id) ? undefined : id),
    });
    if (got.id !== id) throw new Error(`${side}: ${key} got ID ${got.id}, not ${id}`);
    return {
      release: () => session.release(key, id, signal),
      async [Symbol.asyncDispose]() {
        await session.close();
        await backend.close();
      },
    };
  }

  /** Each side's identities as stored (ID → label set), read now. */
  async sides(): Promise<{ kvstore: Map<number, string>; crd: Map<number, string> }> {
    const read = async (backend: Backend & AsyncDisposable) => {
      await using b = backend;
      const session = await b.openSession({
        leaseTtlMs: 60_000,
        readOnly: true,
        onLeaseReplaced: () => {},
      });
      try {
        return await listMasters(session, AbortSignal.timeout(60_000));
      } finally {
        await session.close();
      }
    };
    const [kvstore, crd] = await Promise.all([
      read(await this.kvstore("reader")),
      read(await this.crd("reader")),
    ]);
    return { kvstore, crd };
  }

  /**
   * The CLI's options for `mode`: `--store etcd://…` for the kvstore side, the kubeconfig (as
   * `--store k8s:…` in `crd` mode, else `--kubeconfig`) and the Kubernetes options for the CRD
   * side; `extra` Kubernetes options go with them (`--heartbeat-timeout 1s`).
   */
  cli(mode: IdentityAllocationMode, extra: readonly string[] = []): string[] {
    const k8s = [
      ...["--context", "test", "--namespace", NAMESPACE, "--clock-skew", "1s"],
      ...extra,
    ];
    // A loaded machine (the suites run beside other work) may take more than the default 5 s.
    const common = ["--identity-allocation-mode", mode, "--lease-ttl", "3s", "--timeout", "60s"];
    const etcd = ["--store", `etcd://${new URL(this.etcd).host}`];
    if (mode === "kvstore") return [...etcd, ...common];
    if (mode === "crd") return ["--store", `k8s:${this.kubeconfig}`, ...common, ...k8s];
    if (!isDoubleWrite(mode)) throw new Error(mode);
    return [...etcd, ...common, "--kubeconfig", this.kubeconfig, ...k8s];
  }
}
