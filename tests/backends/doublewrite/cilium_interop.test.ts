// idalloc's double-write backend beside a real Cilium 1.17.0-dev node (`interop117 -mode …`, Cilium's
// own pkg/kvstore/allocator/doublewrite, pkg/k8s/identitybackend and pkg/allocator), on a private
// API server with Cilium's CRDs and its etcd as the kvstore: in both double-write modes, both ways
// (Cilium creates and idalloc reads from either side; idalloc creates and Cilium reads in either
// mode), every ID agrees and both stores hold every identity once. Not in CI (no Cilium build
// there): skipped loudly where `interop117` is not built. Figures go to stderr.
import assert from "node:assert/strict";
import { existsSync } from "node:fs";
import { join } from "node:path";
import process from "node:process";
import { Allocator } from "../../../mod.ts";
import {
  DoubleWriteBackend,
  type DoubleWriteMode,
  identityDrift,
} from "../../../src/backends/doublewrite/mod.ts";
import { EtcdBackend } from "../../../src/backends/etcd/mod.ts";
import { K8sBackend } from "../../../src/backends/k8s/mod.ts";
import { etcdUnavailable } from "../../../src/backends/etcd/testing/cluster.ts";
import {
  type CiliumCrdNode,
  ciliumCrdNode,
  runCilium,
  startCiliumCluster,
} from "../../../src/backends/k8s/testing/cilium.ts";
import { kubeApiserverUnavailable } from "../../../src/backends/k8s/testing/cluster.ts";
import { keyOf, labelSets, NAMESPACE } from "../k8s/_cilium.ts";
import { labelsWriter } from "./_world.ts";

const MODES = ["doublewrite-readkvstore", "doublewrite-readcrd"] as const;

/** The 1.17.0-dev node (`$CILIUM_INTEROP117`, else beside the v1.16 build), or why it is absent. */
function cilium117(): CiliumCrdNode | { readonly why: string } {
  const v116 = ciliumCrdNode();
  const work = process.env.CILIUM_WORK ??
    join(process.env.XDG_CACHE_HOME ?? join(process.env.HOME ?? "", ".cache"), "cilium-node");
  const bin = process.env.CILIUM_INTEROP117 ?? join(work, "bin", "interop117");
  if (!("bin" in v116)) return v116;
  if (!existsSync(bin)) {
    return {
      why: `the Cilium 1.17.0-dev node is not built here (missing ${bin}): run ` +
        "'bash ../shared/cilium-node/build.sh --v117 <git dir>' (../shared/cilium-node/README.md), " +
        "or point CILIUM_INTEROP117 at the binary",
    };
  }
  return { bin, crds: v116.crds };
}

const node117 = cilium117();
const missing = kubeApiserverUnavailable() ?? etcdUnavailable() ??
  ("why" in node117 ? node117.why : undefined);
if (missing !== undefined) {
  const bar = "!".repeat(100);
  console.error(
    `\n${bar}\n!!! SKIPPING THE CILIUM DOUBLE-WRITE INTEROP TESTS: ${missing}\n${bar}\n`,
  );
}

/** An idalloc node in `mode` on the world's etcd and API server. */
async function idalloc(etcd: string, kubeconfig: string, node: string, mode: DoubleWriteMode) {
  const kvstore = await EtcdBackend.connect({ endpoints: [etcd], node });
  const crd = await K8sBackend.connect({
    node,
    kubeconfig,
    context: "test",
    namespace: NAMESPACE,
    maxClockSkewMs: 500,
  });
  const backend = new DoubleWriteBackend({ mode, kvstore, crd });
  const alloc = await Allocator.open(backend, { min: 256, max: 65535, leaseTtlMs: 3_000 });
  return {
    alloc,
    backend,
    async [Symbol.asyncDispose]() {
      await alloc.close();
      await crd.close();
      await kvstore.close();
    },
  };
}

Deno.test({
  name: "interop117: idalloc and Cilium agree on every ID in both double-write modes, both ways",
  ignore: missing !== undefined,
  async fn() {
    const node = node117 as CiliumCrdNode;
    await using cluster = await startCiliumCluster(node);
    const etcd = cluster.etcd.endpoints[0];
    const kubeconfig = await cluster.kubeconfig("admin", { context: "test", namespace: NAMESPACE });
    const dir = await Deno.makeTempDir({ prefix: "idalloc-dw-interop-" });
    const labels = labelsWriter(dir);
    const ciliumArgs = (mode: DoubleWriteMode, name: string) => [
      ...["-mode", mode, "-etcd", etcd, "-kubeconfig", kubeconfig, "-node", name],
    ];
    try {
      await using rk = await idalloc(etcd, kubeconfig, "i-rk", "doublewrite-readkvstore");
      await using rc = await idalloc(etcd, kubeconfig, "i-rc", "doublewrite-readcrd");
      const byMode = { "doublewrite-readkvstore": rk, "doublewrite-readcrd": rc };
      let expected = 0;
      for (const mode of MODES) {
        // Cilium creates; idalloc joins in the same mode and reads from either side.
        const ciliumFirst = labelSets(`c-${mode}`, 20);
        const [c1] = await runCilium(node, [
          ...ciliumArgs(mode, `c1-${mode}`),
          ...["-concurrency", "4", "-labels", await labels(ciliumFirst)],
        ]);
        assert.deepEqual(c1.errors, [], `${mode}: Cilium's errors`);
        assert.equal(c1.is_new, 20);
        let joined = 0;
        for (const set of ciliumFirst) {
          const key = keyOf(set);
          const r = await byMode[mode].alloc.allocate(key);
          assert.equal(r.id, c1.mapping?.[key], `${mode}: ${key}: idalloc and Cilium disagree`);
          assert.equal(r.isNew, false, key);
          assert.equal(await rk.alloc.getNoCache(key), r.id, `${key} on the kvstore side`);
          assert.equal(await rc.alloc.getNoCache(key), r.id, `${key} on the CRD side`);
          joined++;
        }
        // idalloc creates; Cilium finds every ID in both double-write modes.
        const idallocFirst = labelSets(`i-${mode}`, 20);
        const ids = new Map<string, number>();
        for (const set of idallocFirst) {
          const r = await byMode[mode].alloc.allocate(keyOf(set));
          assert.equal(r.isNew, true);
          ids.set(keyOf(set), r.id);
        }
        let agreed = 0;
        for (const readMode of MODES) {
          const [c2] = await runCilium(node, [
            ...ciliumArgs(readMode, `c2-${mode}-${readMode}`),
            ...["-concurrency", "4", "-labels", await labels(idallocFirst)],
          ]);
          assert.deepEqual(c2.errors, []);
          assert.equal(c2.is_new, 0, `${readMode}: Cilium created nothing: it found idalloc's`);
          for (const [key, id] of ids) {
            assert.equal(c2.mapping?.[key], id, `${readMode}: ${key}: Cilium and idalloc disagree`);
            agreed++;
          }
        }
        expected += 40;
        const drift = await identityDrift(rk.backend, AbortSignal.timeout(30_000));
        assert.deepEqual(drift, {
          crd: { total: expected, only: 0 },
          kvstore: { total: expected, only: 0 },
          differing: [],
        });
        console.error(
          `interop117 ${mode}: Cilium first ${joined}/20 joined by idalloc at Cilium's IDs and read ` +
            `back from both sides; idalloc first ${agreed}/40 found by Cilium in both modes; ` +
            `identities per side ${JSON.stringify(drift)}`,
        );
      }
    } finally {
      await Deno.remove(dir, { recursive: true });
    }
  },
});
