// Liveness on a real kube-apiserver, where it depends on more than the protocol: the coordination
// namespace (nodes and tools from kubeconfig contexts with different default namespaces agree,
// a caller configured with another namespace is refused), clocks (a node whose clock is slow
// keeps its references; one too far off is refused), lapsed node Leases collected by GC, and a
// holder leaving an identity relabelled under it.
import assert from "node:assert/strict";
import { Allocator } from "../../../src/allocator/allocator.ts";
import { K8sBackend } from "../../../src/backends/k8s/backend.ts";
import { ServerClock } from "../../../src/backends/k8s/clock.ts";
import {
  DEFAULT_NAMESPACE,
  LEASE_NAMESPACE_ANNOTATION,
} from "../../../src/backends/k8s/coordination.ts";
import { isStatus, type KubeClient } from "../../../src/backends/k8s/kube.ts";
import { nodeLeaseName } from "../../../src/backends/k8s/layout.ts";
import { LEASES } from "../../../src/backends/k8s/options.ts";
import { NAMESPACE_RESOURCE } from "../../../src/backends/k8s/testing/crds.ts";
import { deadline, eventually, fixture, k8sTest } from "./_helpers.ts";

/** Creates namespace `name` unless it exists. */
async function ensureNamespace(client: KubeClient, name: string): Promise<void> {
  try {
    await client.create(NAMESPACE_RESOURCE, {
      apiVersion: "v1",
      kind: "Namespace",
      metadata: { name },
    }, { signal: deadline() });
  } catch (err) {
    if (!isStatus(err, 409)) throw err;
  }
}

Deno.test("the server clock: in step it stays 0; slow or fast it is corrected from the writes", () => {
  let local = 10_000_000;
  const inStep = new ServerClock(() => local);
  inStep.sample(10_000_000, 9_999_900, 10_000_050);
  assert.equal(inStep.offset, 0);
  const slow = new ServerClock(() => local);
  slow.sample(10_030_000, 10_000_000, 10_000_040);
  assert.equal(slow.offset, 29_960, "the least correction the write allows");
  slow.sample(10_031_000, 10_000_900, 10_000_950);
  assert.equal(slow.offset, 30_050, "narrowed by a second write");
  const fast = new ServerClock(() => local);
  fast.sample(9_990_000, 10_000_000, 10_000_040);
  assert.equal(fast.offset, -9_000);
  local += 5;
  assert.equal(fast.now(), local - 9_000);
});

k8sTest(
  "coordination namespace: nodes and tools from contexts with different default namespaces agree; another namespace is refused",
  async () => {
    await using fx = await fixture();
    // The contexts' namespaces exist, so that a caller taking its namespace from the context
    // (as before) works there too, only apart.
    for (const ns of ["ctx-a", "ctx-b", "elsewhere", DEFAULT_NAMESPACE]) {
      await ensureNamespace(fx.client, ns);
    }
    const kubeconfigA = await fx.cluster.kubeconfig("admin", { context: "a", namespace: "ctx-a" });
    const kubeconfigB = await fx.cluster.kubeconfig("admin", { context: "b", namespace: "ctx-b" });
    const suffix = crypto.randomUUID().slice(0, 6);
    const backends: K8sBackend[] = [];
    const connect = async (node: string, kubeconfig: string, context: string, ns?: string) => {
      const b = await K8sBackend.connect({
        node: `${node}-${suffix}`,
        kubeconfig,
        context,
        ...(ns === undefined ? {} : { namespace: ns }),
        resource: { group: fx.group },
        maxClockSkewMs: 500,
      });
      backends.push(b);
      return b;
    };
    const allocators: Allocator<string>[] = [];
    const open = async (backend: K8sBackend, gcGraceMs?: number) => {
      const a = await Allocator.open(backend, {
        min: 256,
        max: 65535,
        leaseTtlMs: 3_000,
        ...(gcGraceMs === undefined ? {} : { gcGraceMs }),
      });
      allocators.push(a);
      return a;
    };
    try {
      const holderBackend = await connect("holder", kubeconfigA, "a");
      assert.equal(holderBackend.namespace, DEFAULT_NAMESPACE, "not the context's");
      const holder = await open(holderBackend);
      const { id } = await holder.allocate("web;");
      const identity = await fx.identity(id);
      assert.equal(
        identity?.metadata.annotations?.[LEASE_NAMESPACE_ANNOTATION],
        DEFAULT_NAMESPACE,
        "recorded on the identity",
      );

      // A tool of context b sees the holder live, refuses to release its reference, and GC
      // keeps its ID.
      const tool = await connect("tool", kubeconfigB, "b");
      const refs = [];
      for await (const r of tool.admin().references(deadline())) refs.push(r);
      assert.deepEqual(refs.map((r) => [r.node, r.id, r.live]), [[`holder-${suffix}`, id, true]]);
      await assert.rejects(
        () => tool.admin().deleteReference("web;", `holder-${suffix}`, deadline()),
        { name: "LiveEntryError" },
      );
      const gc = await open(tool, 0);
      await gc.runGc();
      assert.deepEqual((await gc.runGc()).deletedIds, []);
      assert.ok(await fx.identity(id), "a live node's ID stays");

      // Claims are shared: nodes of both contexts racing for new keys give each key one ID.
      const left = await open(await connect("left", kubeconfigA, "a"));
      const right = await open(await connect("right", kubeconfigB, "b"));
      for (let i = 0; i < 8; i++) {
        const key = `race-${i};`;
        const [l, r] = await Promise.all([left.allocate(key), right.allocate(key)]);
        assert.equal(l.id, r.id, `one ID for ${key}`);
      }
      const ids = new Map<string, number[]>();
      for (const r of await fx.records()) ids.set(r.key, [...(ids.get(r.key) ?? []), r.id]);
      for (const [key, of] of ids) assert.equal(of.length, 1, `${key}: ${of}`);

      // A caller configured with another namespace is refused, naming both and the fix.
      const stranger = await connect("stranger", kubeconfigB, "b", "elsewhere");
      const refused = {
        name: "CoordinationNamespaceError",
        message: new RegExp(
          `namespace '${DEFAULT_NAMESPACE}' .*not 'elsewhere'.*--namespace ${DEFAULT_NAMESPACE}`,
        ),
      };
      await assert.rejects(async () => {
        for await (const _ of stranger.admin().references(deadline()));
      }, refused);
      await assert.rejects(
        () => stranger.admin().deleteReference("web;", `holder-${suffix}`, deadline()),
        refused,
      );
      const strangerAlloc = await open(stranger, 0);
      await assert.rejects(() => strangerAlloc.allocate("web;"), refused);
      await assert.rejects(() => strangerAlloc.runGc(), refused);
      assert.ok(await fx.identity(id), "still there");
    } finally {
      for (const a of allocators.reverse()) await a.close().catch(() => {});
      for (const b of backends) await b.close();
    }
  },
);

k8sTest(
  "clocks: a node whose clock is 20 s slow keeps its references live for every judge; one 100 s off is refused",
  async () => {
    await using fx = await fixture();
    // The claims' rule allows half the heartbeat timeout less half the lease TTL, plus the margin.
    const slowClock = { now: () => Date.now() - 20_000, heartbeatTimeoutMs: 120_000 };
    const slow = await fx.allocator("slow", {}, slowClock);
    const { id } = await slow.allocate("k;");
    // The judges run on the real clock; the holder's references stay live through renewals.
    const judge = await fx.backend("judge");
    const gc = await fx.allocator("gc", { gcGraceMs: 0 });
    for (let round = 0; round < 3; round++) {
      const refs = [];
      for await (const r of judge.admin().references(deadline())) refs.push(r);
      assert.deepEqual(refs.map((r) => [r.node, r.live]), [["slow", true]]);
      await gc.runGc();
      await new Promise((resolve) => setTimeout(resolve, 1_000));
    }
    assert.ok((await fx.held("slow")).has(id));
    const obj = await fx.client.get(LEASES, nodeLeaseName("slow"), {
      namespace: fx.namespace,
      signal: deadline(),
    });
    const renewTime = Date.parse(String((obj!.spec as { renewTime: string }).renewTime));
    assert.ok(Math.abs(renewTime - Date.now()) < 3_000, "renewTime on the server's clock");

    const wild = await fx.backend("wild", { ...slowClock, now: () => Date.now() - 100_000 });
    await assert.rejects(
      () => Allocator.open(wild, { min: 256, max: 65535, leaseTtlMs: 3_000 }),
      { name: "ClockSkewError", message: /node wild is (99|10\d)\.\d s behind the API server's/ },
    );
    const left = await fx.client.get(LEASES, nodeLeaseName("wild"), {
      namespace: fx.namespace,
      signal: deadline(),
    });
    assert.equal(left, undefined, "the refused node's Lease is removed");
  },
);

k8sTest(
  "clocks: a restarted node's first Lease write, and a renewal retried after a refused write, measure the clock afresh",
  async () => {
    await using fx = await fixture();
    const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));
    const renewTimeOf = async (node: string) => {
      const obj = await fx.client.get(LEASES, nodeLeaseName(node), {
        namespace: fx.namespace,
        signal: deadline(),
      });
      return Date.parse(String((obj!.spec as { renewTime: string }).renewTime));
    };
    // The API server stamps a write's time into `managedFields` only when the writer's set of
    // fields changes (`clock.ts`), and this test's clocks are the server's: a write that set the
    // stamp annotation the Lease already carried would answer with the time of the write before,
    // and the node would measure its clock ahead by the time since.
    //
    // 1. A node restarting on its own Lease (seed 3 of the mixed Kubernetes runs: worker w3 killed
    // and restarted 4 s after its last renewal measured "4.7 s ahead" and exited with
    // ClockSkewError). The first process wrote the Lease three times (a 30 s lease: no timed
    // renewal within the test; a restart after an odd count of writes met the stamp it sets
    // first) and holds a reference, so its Lease stays when it ends.
    const first = await fx.session("r", {}, { leaseTtlMs: 30_000 });
    await first.lease!.renewNow();
    await first.lease!.renewNow();
    await first.acquire({ key: "k;", pickCandidate: () => 300, signal: deadline() });
    await first.close();
    await sleep(3_500);
    // The skew the key claims allow here: 4 s / 2 − 3 s / 2 + 0.5 s = 1 s, less than the 2.5 s a
    // stale answer would show.
    const restarted = await fx.session("r", { heartbeatTimeoutMs: 4_000 }, {
      leaseTtlMs: 3_000,
      restart: true,
    });
    await restarted.close();

    // 2. A renewal refused (someone else wrote the Lease) and retried at the version read: its
    // retry must stamp too, or the write after it carries a `renewTime` corrected by a false skew.
    // The other write changes a value only: this admin client's requests carry the same field
    // manager as the node's (`idalloc`), and a field it added would stamp the time itself.
    const q = await fx.session("q", {}, { leaseTtlMs: 30_000 });
    await q.lease!.renewNow();
    await sleep(2_500);
    await fx.client.patch(LEASES, nodeLeaseName("q"), {
      spec: { acquireTime: "2020-01-01T00:00:00.000000Z" },
    }, { type: "merge", namespace: fx.namespace, signal: deadline() });
    await q.lease!.renewNow();
    assert.equal(q.lease!.lastError, undefined);
    const before = Date.now();
    await q.lease!.renewNow();
    const renewed = await renewTimeOf("q");
    assert.ok(
      renewed >= before - 1,
      `renewTime ${
        renewed - before
      } ms from the renewal's start: on the server's clock, not shifted`,
    );
  },
);

k8sTest(
  "GC collects lapsed node Leases, never a live one",
  async () => {
    await using fx = await fixture();
    const gone = await fx.session("gone");
    await gone.acquire({ key: "k;", pickCandidate: () => 300, signal: deadline() });
    await gone.close(); // holds a reference: its Lease stays, and lapses
    const live = await fx.session("live");
    await live.acquire({ key: "j;", pickCandidate: () => 301, signal: deadline() });
    const gc = await fx.session("gc");
    const leaseOf = (node: string) =>
      fx.client.get(LEASES, nodeLeaseName(node), { namespace: fx.namespace, signal: deadline() });
    assert.ok(await leaseOf("gone"));
    await eventually(async () => {
      for await (const _ of gc.gcList({ min: 1, max: 65535 }, deadline()));
      return await leaseOf("gone") === undefined;
    }, "the lapsed Lease is collected");
    assert.ok(await leaseOf("live"), "a live node's Lease stays");
    assert.ok(await leaseOf("gc"));
  },
);

k8sTest(
  "a holder whose identity was relabelled under it removes its reference from what it left",
  async () => {
    await using fx = await fixture();
    const s = await fx.session("a");
    const { id } = await s.acquire({ key: "a;", pickCandidate: () => 300, signal: deadline() });
    await fx.patchIdentity(id, { "security-labels": { "idalloc:key": "b;" } });
    await eventually(() => s.informer.index.get(id)?.key === "b;", "the informer saw it");
    const [report] = await s.ensure([{ key: "a;", id }], deadline());
    assert.equal(report.master, "conflict");
    assert.equal((await fx.held("a")).has(id), false, "its reference is gone");

    // A reference to a key the node holds is kept, relabelled or not.
    const held = await s.acquire({ key: "c;", pickCandidate: () => 301, signal: deadline() });
    await s.acquire({ key: "d;", pickCandidate: () => 302, signal: deadline() });
    await fx.patchIdentity(held.id, { "security-labels": { "idalloc:key": "d;" } });
    await eventually(() => s.informer.index.get(held.id)?.key === "d;", "the informer saw it");
    await s.ensure([{ key: "c;", id: held.id }], deadline());
    assert.ok((await fx.held("a")).has(held.id));
  },
);
