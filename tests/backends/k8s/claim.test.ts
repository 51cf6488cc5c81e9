// The key claim's guard against duplicates (src/backends/k8s/claim.ts). On plain data: the
// confirmation bound, when a claim is quiet, when it is stale. On the real API server, each race
// played out step by step through a client that lets the "other" side act at the worst moment:
// - race 1: GC removes the claim while a node re-creates its identity from it — the node's touch
//   and GC's guarded delete exclude each other, whichever comes first;
// - race 2: a node stalls between its claim write and its identity create while the key is
//   collected and claimed anew — its create is confirmed against the claim and removed again;
// - the common paths keep their round trips (new key 2, join 1).
import assert from "node:assert/strict";
import {
  claimNames,
  claimQuiet,
  claimQuietMs,
  claimStaleness,
  confirmAfterMs,
  touchPatch,
} from "../../../src/backends/k8s/claim.ts";
import { countedClient, type KubeClient } from "../../../src/backends/k8s/kube.ts";
import {
  claimName,
  claimObject,
  identityObject,
  readClaim,
} from "../../../src/backends/k8s/layout.ts";
import { LEASES } from "../../../src/backends/k8s/options.ts";
import type { K8sSession } from "../../../src/backends/k8s/session.ts";
import { deadline, eventually, fixture, k8sTest } from "./_helpers.ts";

const settings = { heartbeatTimeoutMs: 4_000, maxClockSkewMs: 500 };

Deno.test("a create within half the lease TTL of the call's start needs no confirmation", () => {
  assert.equal(confirmAfterMs(3_000), 1_500);
  assert.equal(confirmAfterMs(60_001), 30_000);
});

Deno.test("a claim is quiet past half the heartbeat timeout plus the skew; hand-made ones are", () => {
  assert.equal(claimQuietMs(settings), 2_500);
  assert.equal(claimQuiet({ writtenAt: 10_000 }, 12_500, settings), false);
  assert.equal(claimQuiet({ writtenAt: 10_000 }, 12_501, settings), true);
  assert.equal(claimQuiet({}, 0, settings), true);
  // Every node's confirmation bound lies below it: its TTL is below the heartbeat timeout.
  assert.ok(confirmAfterMs(settings.heartbeatTimeoutMs - 1) < claimQuietMs(settings));
});

Deno.test("a claim is stale when its identity is gone or carries another key, not when damaged", () => {
  const claim = { name: "c", key: "k", id: 7, rv: "1" };
  assert.equal(claimStaleness(claim, "k"), undefined);
  assert.equal(claimStaleness(claim, null), undefined);
  assert.match(claimStaleness(claim, undefined)!, /does not exist/);
  assert.match(claimStaleness(claim, "j")!, /another key/);
  assert.equal(claimNames(claim, "k", 7), true);
  assert.equal(claimNames(claim, "k", 8), false);
});

Deno.test("a touch changes the nonce and write time under the version, not what the claim names", () => {
  const a = touchPatch("5", "n1", Date.UTC(2026, 0, 1)) as {
    metadata: { resourceVersion: string; annotations: Record<string, string>; labels?: unknown };
    spec: Record<string, unknown>;
  };
  const b = touchPatch("5", "n1", Date.UTC(2026, 0, 1)) as typeof a;
  assert.equal(a.metadata.resourceVersion, "5");
  assert.notEqual(
    a.metadata.annotations["idalloc.io/touch"],
    b.metadata.annotations["idalloc.io/touch"],
  );
  assert.equal(a.metadata.labels, undefined);
  assert.deepEqual(a.spec, { holderIdentity: "n1", renewTime: "2026-01-01T00:00:00.000000Z" });
});

// On the real API server.

type Fixture = Awaited<ReturnType<typeof fixture>>;

const KEY = "k8s:app=raced;";
const picker = (...ids: number[]) => (exclude: ReadonlySet<number>) =>
  ids.find((id) => !exclude.has(id));

/** The hooks a test's "other side" acts through, each run once before the call it names. */
interface Hooks {
  /** After this node read the key's claim. */
  afterClaimRead?: () => Promise<void>;
  /** Before this node creates an identity. */
  beforeIdentityCreate?: () => Promise<void>;
}

/** A session of `node` whose client runs `hooks` (each once) around its calls; dispose it. */
async function hookedSession(
  fx: Fixture,
  node: string,
  hooks: Hooks,
): Promise<K8sSession & AsyncDisposable> {
  const real = fx.client;
  const once = (name: keyof Hooks) => {
    const hook = hooks[name];
    delete hooks[name];
    return hook?.() ?? Promise.resolve();
  };
  const client: KubeClient = {
    ...countedClient(real, { count: 0 }), // the real client's calls, as own methods
    get: async (res, name, o) => {
      const obj = await real.get(res, name, o);
      if (res.plural === "leases" && name.startsWith("idalloc-key-")) await once("afterClaimRead");
      return obj as never;
    },
    create: async (res, obj, o) => {
      if (res.plural === "ciliumidentities") await once("beforeIdentityCreate");
      return await real.create(res, obj, o) as never;
    },
  };
  const { K8sBackend } = await import("../../../src/backends/k8s/backend.ts");
  const backend = await K8sBackend.connect(fx.options(node), { client });
  const session = await backend.openSession({
    leaseTtlMs: 3_000,
    readOnly: false,
    onLeaseReplaced: () => {},
  }) as K8sSession;
  await session.informer.waitSynced(deadline());
  return Object.assign(session, { [Symbol.asyncDispose]: () => backend.close() });
}

/** A stall that outlasts the confirmation bound of the sessions here (half their 3 s TTL). */
function stall(): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, confirmAfterMs(3_000) + 100));
}

function claimOf(fx: Fixture, key: string) {
  return fx.client.get(LEASES, claimName(`ciliumidentities.${fx.group}`, key), {
    namespace: fx.namespace,
    signal: deadline(),
  });
}

/** Writes the claim of `key` naming `id` as another node would. */
async function plantClaim(fx: Fixture, key: string, id: number) {
  const name = claimName(`ciliumidentities.${fx.group}`, key);
  await fx.client.delete(LEASES, name, { namespace: fx.namespace, signal: deadline() });
  return await fx.client.create(LEASES, claimObject(name, key, id, "other", Date.now()), {
    namespace: fx.namespace,
    signal: deadline(),
  });
}

k8sTest(
  "race 1: a re-creation from the claim touches it first, so GC's guarded delete of it is refused",
  async () => {
    await using fx = await fixture();
    await plantClaim(fx, KEY, 300); // identity 300 is gone (collected); its claim is still there
    let gcRead: string | undefined;
    await using s = await hookedSession(fx, "a", {
      // GC reads the claim just after the node did, before either writes.
      afterClaimRead: async () =>
        void (gcRead = String((await claimOf(fx, KEY))!.metadata.resourceVersion)),
    });
    const { id } = await s.acquire({ key: KEY, pickCandidate: picker(400), signal: deadline() });
    assert.equal(id, 300, "re-created under the claim's ID");
    assert.ok(gcRead);
    const name = claimName(`ciliumidentities.${fx.group}`, KEY);
    await assert.rejects(
      fx.client.delete(LEASES, name, {
        namespace: fx.namespace,
        resourceVersion: gcRead,
        signal: deadline(),
      }),
      { name: "KubeApiError", code: 409 },
      "GC's delete at the version it read is refused: the claim stays, naming the identity",
    );
    assert.equal(readClaim((await claimOf(fx, KEY))!)?.id, 300);
  },
);

k8sTest(
  "race 1, other order: GC removed the claim first, so the node's touch fails and it claims the key anew",
  async () => {
    await using fx = await fixture();
    await plantClaim(fx, KEY, 300);
    const name = claimName(`ciliumidentities.${fx.group}`, KEY);
    await using s = await hookedSession(fx, "a", {
      // GC's guarded delete of the claim lands between the node's read and its next write.
      afterClaimRead: async () => {
        await fx.client.delete(LEASES, name, { namespace: fx.namespace, signal: deadline() });
      },
    });
    const { id } = await s.acquire({ key: KEY, pickCandidate: picker(400), signal: deadline() });
    assert.equal(id, 400, "the new-key path");
    assert.equal(await fx.identity(300), undefined, "no identity without a claim naming it");
    assert.equal(readClaim((await claimOf(fx, KEY))!)?.id, 400, "the claim names the answer");
  },
);

k8sTest(
  "race 2: a node stalled past half its lease TTL before its create confirms the claim, and removes what it created when the key was claimed anew",
  async () => {
    await using fx = await fixture();
    await using s = await hookedSession(fx, "a", {
      beforeIdentityCreate: async () => {
        // Meanwhile: the key was created, collected with its claim, and claimed anew under 500.
        await plantClaim(fx, KEY, 500);
        await fx.client.create(
          fx.identities,
          identityObject(
            { apiVersion: `${fx.group}/v2`, kind: "CiliumIdentity" },
            500,
            KEY,
            {},
          ),
          { signal: deadline() },
        );
        await stall();
      },
    });
    const { id } = await s.acquire({ key: KEY, pickCandidate: picker(400), signal: deadline() });
    assert.equal(id, 500, "the key's one identity");
    assert.equal(await fx.identity(400), undefined, "the stalled create was removed again");
    assert.deepEqual((await fx.records()).filter((r) => r.key === KEY).map((r) => r.id), [500]);
  },
);

k8sTest(
  "race 2 in ensure: a slow re-creation whose claim moved meanwhile is removed again and reported a conflict",
  async () => {
    await using fx = await fixture();
    const hooks: Hooks = {};
    await using s = await hookedSession(fx, "a", hooks);
    const { id } = await s.acquire({ key: KEY, pickCandidate: picker(300), signal: deadline() });
    await fx.client.delete(fx.identities, String(id), { signal: deadline() });
    hooks.beforeIdentityCreate = async () => {
      await plantClaim(fx, KEY, 500);
      await stall();
    };
    // Held keys are checked from the watch: until the deletion reaches it, ensure sees no damage.
    let [report] = await s.ensure([{ key: KEY, id }], deadline());
    await eventually(async () => {
      if (report.master === "ok") [report] = await s.ensure([{ key: KEY, id }], deadline());
      return report.master !== "ok";
    }, "ensure sees the identity gone");
    assert.equal(report.master, "conflict");
    assert.equal(await fx.identity(id), undefined, "the re-created identity was removed again");
  },
);

k8sTest("a claim that names no key or ID (planted garbage) costs no key: it is moved", async () => {
  await using fx = await fixture();
  const name = claimName(`ciliumidentities.${fx.group}`, KEY);
  await fx.client.create(LEASES, {
    apiVersion: "coordination.k8s.io/v1",
    kind: "Lease",
    metadata: {
      name,
      labels: { "app.kubernetes.io/managed-by": "idalloc", "idalloc.io/role": "claim" },
    },
    spec: { holderIdentity: "garbage" },
  }, { namespace: fx.namespace, signal: deadline() });
  const s = await fx.session("a");
  const { id } = await s.acquire({ key: KEY, pickCandidate: picker(400), signal: deadline() });
  assert.equal(id, 400);
  assert.equal(readClaim((await claimOf(fx, KEY))!)?.id, 400, "the claim names the answer now");
});

k8sTest(
  "a damaged identity of a held key is repaired by a joining node and by the holder's ensure, never replaced",
  async () => {
    await using fx = await fixture();
    const a = await fx.session("a");
    const { id } = await a.acquire({ key: KEY, pickCandidate: picker(300), signal: deadline() });
    const corrupt = () =>
      fx.client.patch(fx.identities, String(id), [
        { op: "replace", path: "/security-labels", value: { "idalloc:key": "k8s:corrupt=1;" } },
      ], { type: "json", signal: deadline() });
    await corrupt();
    const b = await fx.session("b");
    const joined = await b.acquire({ key: KEY, pickCandidate: picker(400), signal: deadline() });
    assert.equal(joined.id, id, "no second ID for the key");
    const keyOf = async () => (await fx.records()).find((r) => r.id === id)?.key;
    assert.equal(await keyOf(), KEY, "repaired");
    assert.equal(await fx.identity(400), undefined);
    await corrupt();
    // ensure reads what the informer shows wrong: a damaged identity leaves the index.
    await eventually(() => a.informer.index.get(id) === undefined, "a's informer saw the damage");
    const [report] = await a.ensure([{ key: KEY, id }], deadline());
    assert.deepEqual([report.master, report.reference], ["recreated", "recreated"]);
    assert.equal(await keyOf(), KEY, "repaired by the holder");
  },
);

k8sTest(
  "an older identity of the key that a Cilium node creates while the acquire writes is the answer: joined, and the younger one left",
  async () => {
    await using fx = await fixture();
    const hooks: Hooks = {};
    await using s = await hookedSession(fx, "a", hooks);
    hooks.beforeIdentityCreate = async () => {
      // A Cilium agent (no lock) creates the key's identity first; this node's index sees it.
      await fx.createIdentity(200, { "k8s:app": "raced" });
      await eventually(() => s.informer.index.get(200) !== undefined, "the index shows 200");
    };
    const result = await s.acquire({ key: KEY, pickCandidate: picker(400), signal: deadline() });
    // Same creation second: the lower ID is Cilium's answer (else the older, which is 200 too).
    assert.deepEqual([result.id, result.created], [200, false]);
    const held = await fx.held("a");
    assert.equal(held.get(200), s.lease!.epoch);
    assert.equal(held.has(400), false, "left: GC may collect it");
  },
);
