/**
 * The test servers' launcher, two commands:
 *
 * - `test -- <command…>`: starts ONE kube-apiserver (its etcd, Cilium's CRDs, the test users and
 *   their RBAC, as `startKubeApiServer` does) and one etcd for the etcd fixtures, runs the command
 *   with the environment that points every test process at them
 *   (`IDALLOC_KUBE_TEST_SERVER`: a JSON description, see `./attach.ts`;
 *   `IDALLOC_ETCD_TEST_SERVER`: the etcd's URL; `IDALLOC_TEST_SLOTS`: the directory that caps the
 *   private servers tests start, see `src/testing/slots.ts`), then stops both and exits with the
 *   command's code. `deno task test`, `test:node` and `test:bun` run through it. Without a
 *   kube-apiserver binary (or etcd) the command runs without that server: the tests skip loudly,
 *   or fail under `CI`, as they would alone.
 * - `apiserver`: a private kube-apiserver with Cilium's CRDs for trying the Kubernetes backend by
 *   hand (`deno task k8s:apiserver`): prints `export KUBECONFIG=…` and commands to try, runs until
 *   Ctrl-C, then stops and removes everything.
 *
 * Servers are started detached under a watchdog that kills them if this process dies.
 *
 * @example
 * ```sh
 * deno run -A src/backends/k8s/testing/launcher.ts test -- deno test -A tests/backends/k8s/
 * deno run -A src/backends/k8s/testing/launcher.ts apiserver
 * ```
 * @module
 */
import { mkdir, mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import {
  ETCD_SLOTS,
  ETCD_TEST_SERVER_ENV,
  type EtcdCluster,
  findEtcd,
  startEtcd,
} from "../../etcd/testing/cluster.ts";
import { runChild } from "../../../testing/child_command.ts";
import { SLOTS_ENV } from "../../../testing/slots.ts";
import { DEFAULT_NAMESPACE } from "../coordination.ts";
import { KUBE_TEST_SERVER_ENV, kubeTestServerInfo } from "./attach.ts";
import {
  findKubeApiserver,
  KUBE_APISERVER_SLOTS,
  type KubeTestCluster,
  startKubeApiServer,
} from "./cluster.ts";
import { fixtureGroupPool, pooledGroups } from "./crd_pool.ts";
import { ciliumCrdNames, leftovers } from "./leftovers.ts";

const USAGE = `usage:
  launcher.ts test -- <command…>   run <command> with one shared kube-apiserver and etcd
  launcher.ts apiserver            a private kube-apiserver with Cilium's CRDs until Ctrl-C`;

const BUILD_HINT = "build it with `bash .ci/kube-apiserver.sh` (v1.20.2 from Debian's source " +
  "package, about 4 minutes the first time, cached in ~/.cache/idalloc-kube-apiserver), or set " +
  "KUBE_APISERVER to a kube-apiserver binary";

/** Set once SIGINT or SIGTERM arrived (checked between the start's steps). */
let interrupted = false;
const interrupts: (() => void)[] = [];
const INTERRUPTS = ["SIGINT", "SIGTERM"] as const;

function onInterrupt(): void {
  interrupted = true;
  for (const wake of interrupts.splice(0)) wake();
}

/** Resolves at the next SIGINT or SIGTERM (at once if one came already). */
function untilInterrupted(): Promise<void> {
  return interrupted ? Promise.resolve() : new Promise((resolve) => interrupts.push(resolve));
}

const log = (line: string) => console.error(`launcher: ${line}`);

/** The servers of one test run and the environment naming them. */
interface RunServers {
  readonly env: Record<string, string>;
  readonly kube?: KubeTestCluster;
  close(): Promise<void>;
}

async function startRunServers(): Promise<RunServers> {
  const runDir = await mkdtemp(join(tmpdir(), "idalloc-test-run-"));
  const slots = join(runDir, "slots");
  await mkdir(slots);
  const env: Record<string, string> = { [SLOTS_ENV]: slots };
  let etcd: EtcdCluster | undefined;
  let kube: KubeTestCluster | undefined;
  const close = async () => {
    await Promise.allSettled([kube?.close(), etcd?.close()]);
    await rm(runDir, { recursive: true, force: true });
  };
  try {
    if (findEtcd() !== undefined) {
      etcd = await startEtcd({ slot: false });
      env[ETCD_TEST_SERVER_ENV] = etcd.endpoints[0];
    } else log("no etcd here: the etcd tests start none (and skip, or fail under CI)");
    if (interrupted) return { env, close };
    if (findKubeApiserver() !== undefined) {
      kube = await startKubeApiServer({ attempts: 2, readyTimeoutMs: 300_000 });
      const description = join(runDir, "kube-apiserver.json");
      await writeFile(description, JSON.stringify(kubeTestServerInfo(kube), null, 2));
      env[KUBE_TEST_SERVER_ENV] = description;
    } else {log(
        `no kube-apiserver here: the Kubernetes tests skip (or fail under CI); ${BUILD_HINT}`,
      );}
  } catch (err) {
    await close();
    throw err;
  }
  const shared = [
    ...(kube ? [`one kube-apiserver (${kube.server}, pid ${kube.pid})`] : []),
    ...(etcd ? [`one etcd (${etcd.endpoints[0]})`] : []),
  ];
  log(
    `${shared.join(" and ") || "no shared server"} for every test process; tests that need ` +
      `their own start at most ${KUBE_APISERVER_SLOTS} kube-apiservers and ${ETCD_SLOTS} etcds ` +
      `at once (run files in ${runDir})`,
  );
  return { env, kube, close };
}

/** `test -- <command…>`: the command's exit code. */
async function test(command: readonly string[]): Promise<number> {
  if (command.length === 0) {
    console.error(USAGE);
    return 2;
  }
  const servers = await startRunServers();
  try {
    if (interrupted) return 130;
    // `deno` is this Deno, as `deno task` itself reads it (CI runs Deno through npx, off PATH).
    const [program, ...args] = command;
    const code = await runChild(
      [program === "deno" ? Deno.execPath() : program, ...args],
      { ...servers.env, ...parallelJobs() },
    );
    if (servers.kube) {
      const pooled = pooledGroups(fixtureGroupPool(servers.env[KUBE_TEST_SERVER_ENV]));
      const left = await leftovers(servers.kube, pooled).catch((err) => `unknown (${err})`);
      log(`left on the shared kube-apiserver: ${left}`);
    }
    return code;
  } finally {
    await servers.close();
  }
}

/** At least this many test modules at once under `test` (see {@linkcode parallelJobs}). */
const MIN_PARALLEL_JOBS = 3;

/**
 * Test modules `deno test --parallel` runs at once: `DENO_JOBS` if set, else one per core but at
 * least {@linkcode MIN_PARALLEL_JOBS}. The suite spends most of its time waiting on leases, stalls
 * and servers: on 2 cores, two modules at once kept the CPU 56 % busy (1,580 test-seconds in 17 min
 * of wall time), so a third module fills time the machine has.
 */
function parallelJobs(): Record<string, string> {
  if (Deno.env.get("DENO_JOBS") !== undefined) return {};
  return { DENO_JOBS: String(Math.max(MIN_PARALLEL_JOBS, navigator.hardwareConcurrency)) };
}

/** `apiserver`: runs until Ctrl-C. */
async function apiserver(): Promise<number> {
  if (findKubeApiserver() === undefined) {
    console.error(`kube-apiserver is not built here: ${BUILD_HINT}.`);
    return 1;
  }
  console.error("starting etcd and kube-apiserver (Cilium's CRDs, RBAC on)…");
  const cluster = await startKubeApiServer({ attempts: 2, readyTimeoutMs: 300_000 });
  try {
    const kubeconfig = await cluster.kubeconfig("admin", {
      context: "idalloc",
      namespace: "default",
      current: true,
    });
    console.log(
      `kube-apiserver at ${cluster.server} (pid ${cluster.pid}), etcd at ${
        cluster.etcd.endpoints[0]
      }
CRDs: ${(await ciliumCrdNames(cluster)).join(", ")} (Cilium's CRD mode)
Admin kubeconfig (context "idalloc"); idalloc's Leases and key claims go to namespace ${DEFAULT_NAMESPACE}
(created here; on a cluster: kubectl create namespace ${DEFAULT_NAMESPACE}). In another shell:

  export KUBECONFIG=${kubeconfig}
  deno task idalloc --store k8s:$KUBECONFIG identity allocate k8s:app=web
  deno task idalloc --store k8s:$KUBECONFIG identity list
  deno task idalloc --store k8s:$KUBECONFIG allocate 'app=db;'
  deno task idalloc --store k8s:$KUBECONFIG status

Ctrl-C stops both servers and removes their files (${cluster.dir}).`,
    );
    await untilInterrupted();
    console.error("stopping…");
    return 0;
  } finally {
    await cluster.close();
  }
}

/**
 * Runs the launcher's command `args`; its exit code. SIGINT and SIGTERM stop it in order (the
 * servers stopped, their files removed) instead of ending the process at once.
 */
export async function main(args: readonly string[]): Promise<number> {
  const [command, ...rest] = args;
  for (const signal of INTERRUPTS) Deno.addSignalListener(signal, onInterrupt);
  try {
    if (command === "test") return await test(rest[0] === "--" ? rest.slice(1) : rest);
    if (command === "apiserver" && rest.length === 0) return await apiserver();
    console.error(USAGE);
    return 2;
  } finally {
    for (const signal of INTERRUPTS) Deno.removeSignalListener(signal, onInterrupt);
  }
}

if (import.meta.main) Deno.exit(await main(Deno.args));
