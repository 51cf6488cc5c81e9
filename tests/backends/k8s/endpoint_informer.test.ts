// GC's endpoint and slice informers (`endpoint_informer.ts`). On a fake API: the index follows
// the list and the watch's events, a 410 lists again and the watch resumes from the new list's
// version, a failing watch makes a pass list in full until an event comes, a resource that is not
// installed counts as none and is asked for again only after MISSING_RECHECK_MS. On the real API server: after the
// first GC pass, further passes send no LIST of endpoints or slices, and still keep an identity an
// endpoint created after the informer started names, and delete (marked, then a later pass) one
// whose endpoint was removed.
import assert from "node:assert/strict";
import { EventQueue } from "../../../src/allocator/event_queue.ts";
import { StoreUnavailableError } from "../../../src/errors.ts";
import {
  EndpointIndex,
  EndpointInformer,
  EndpointUsers,
  MISSING_RECHECK_MS,
} from "../../../src/backends/k8s/endpoint_informer.ts";
import { KubeApiError, ResourceNotInstalledError } from "../../../src/backends/k8s/errors.ts";
import type { K8sContext } from "../../../src/backends/k8s/context.ts";
import type {
  KubeClient,
  KubeList,
  KubeObject,
  KubeResource,
  KubeWatchEvent,
} from "../../../src/backends/k8s/kube.ts";
import { K8sBackend } from "../../../src/backends/k8s/backend.ts";
import type { K8sSession } from "../../../src/backends/k8s/session.ts";
import type { GcCandidate } from "../../../src/allocator/backend.ts";
import { deadline, eventually, fixture, k8sTest } from "./_helpers.ts";

const CEPS: KubeResource = {
  group: "x.io",
  version: "v2",
  plural: "ciliumendpoints",
  namespaced: true,
};

function cep(name: string, id: number, rv = "1"): KubeObject {
  return {
    metadata: { name, namespace: "ns", resourceVersion: rv },
    status: { identity: { id } },
  };
}

/** A fake API of one resource: scripted list answers, and watches the test feeds. */
function fakeApi() {
  const lists: (KubeList | Error)[] = [];
  const watches: { from: string; events: EventQueue<KubeWatchEvent | Error> }[] = [];
  let listed = 0;
  const clock = { now: 1_000_000 };
  const client = {
    list(_res: KubeResource) {
      listed++;
      const next = lists.shift();
      if (next instanceof Error) return Promise.reject(next);
      return next ? Promise.resolve(next) : Promise.reject(new Error("no list scripted"));
    },
    async *watch(_res: KubeResource, o: { resourceVersion: string; signal: AbortSignal }) {
      const events = new EventQueue<KubeWatchEvent | Error>();
      watches.push({ from: o.resourceVersion, events });
      o.signal.addEventListener("abort", () => events.end(), { once: true });
      for await (const e of events) {
        if (e instanceof Error) throw e;
        yield e;
      }
    },
  } as unknown as KubeClient;
  return {
    lists,
    watches,
    listed: () => listed,
    clock,
    ctx: { client, endpoints: CEPS, settings: { now: () => clock.now } } as unknown as K8sContext,
  };
}

/** A running informer's parts, stopped with the returned `stop`. */
function informerOf(ctx: K8sContext) {
  const controller = new AbortController();
  const tasks: Promise<void>[] = [];
  const informer = new EndpointInformer(
    ctx,
    CEPS,
    "CiliumEndpoint",
    controller.signal,
    (t) => tasks.push(t),
  );
  const count = async (id: number) => {
    const read = await informer.current(deadline());
    return read.state === "live" ? read.index.count(id) : -1;
  };
  const stop = async () => {
    controller.abort();
    await Promise.all(tasks);
  };
  return { informer, count, stop, tasks };
}

Deno.test("endpoint index: one count per object naming an ID, replaced and removed by name", () => {
  const index = new EndpointIndex();
  index.set("a", [300]);
  index.set("ces", [300, 301]);
  assert.deepEqual([index.size, index.count(300), index.count(301)], [2, 2, 1]);
  index.set("a", []);
  assert.deepEqual([index.size, index.count(300)], [1, 1], "naming nothing: gone");
  index.delete("ces");
  index.delete("ces");
  assert.deepEqual([index.size, index.count(300), index.count(301)], [0, 0, 0]);
});

Deno.test("endpoint informer: one list, then the watch's events; 410 lists again and watches from the new list", async () => {
  const api = fakeApi();
  api.lists.push({ items: [cep("a", 300)], resourceVersion: "10" });
  const { count, stop } = informerOf(api.ctx);
  try {
    assert.equal(await count(300), 1);
    await eventually(() => api.watches.length === 1, "the watch starts");
    assert.equal(api.watches[0].from, "10", "from the list's version");
    const [w] = api.watches;
    w.events.push({ type: "ADDED", object: cep("b", 301, "11") });
    await eventually(async () => await count(301) === 1, "the added endpoint counts");
    w.events.push({ type: "MODIFIED", object: cep("a", 302, "12") });
    await eventually(async () => await count(302) === 1, "the modified endpoint moves");
    assert.equal(await count(300), 0);
    w.events.push({ type: "DELETED", object: cep("b", 301, "13") });
    await eventually(async () => await count(301) === 0, "the deleted endpoint goes");
    assert.equal(api.listed(), 1, "no list after the first");

    api.lists.push({ items: [cep("c", 303)], resourceVersion: "20" });
    w.events.push(KubeApiError.fromStatus({ kind: "Status", code: 410, reason: "Expired" }, 410));
    await eventually(async () => await count(303) === 1, "the re-list is applied");
    assert.deepEqual([await count(302), api.listed()], [0, 2], "the re-list replaces the index");
    await eventually(() => api.watches.length === 2, "the watch resumes");
    assert.equal(api.watches[1].from, "20");
  } finally {
    await stop();
  }
});

Deno.test("endpoint informer: while the watch fails a pass lists in full; an event makes it live again", async () => {
  const api = fakeApi();
  api.lists.push({ items: [cep("a", 300)], resourceVersion: "10" });
  const controller = new AbortController();
  const tasks: Promise<void>[] = [];
  const users = new EndpointUsers(api.ctx, controller.signal, (t) => tasks.push(t));
  try {
    assert.deepEqual((await users.read(deadline())).get(300), ["CiliumEndpoint"]);
    await eventually(() => api.watches.length === 1, "the watch starts");
    api.watches[0].events.push(new StoreUnavailableError("connection reset"));
    const [informer] = users.informers;
    await eventually(
      async () => (await informer.current(deadline())).state === "stale",
      "the informer is not trusted",
    );
    // The full list of the pass shows what the broken watch missed.
    api.lists.push({ items: [cep("a", 300), cep("b", 300)], resourceVersion: "15" });
    const listed = await users.read(deadline());
    assert.deepEqual(listed.get(300), ["CiliumEndpoint ns/a", "CiliumEndpoint ns/b"]);
    assert.equal(api.listed(), 2);
    await eventually(() => api.watches.length === 2, "the watch is tried again");
    assert.equal(api.watches[1].from, "10", "from the last version it saw");
    api.watches[1].events.push({ type: "ADDED", object: cep("b", 300, "11") });
    await eventually(
      async () => (await informer.current(deadline())).state === "live",
      "live again after an event",
    );
    assert.deepEqual((await users.read(deadline())).get(300), ["CiliumEndpoint ×2"]);
    assert.equal(api.listed(), 2, "no list while live");
  } finally {
    controller.abort();
    await Promise.all(tasks);
  }
});

Deno.test("endpoint informer: a resource that is not installed counts as none, asked for again after a while", async () => {
  const api = fakeApi();
  api.lists.push(new ResourceNotInstalledError("not served", "ciliumendpoints.x.io"));
  const { informer, count, stop, tasks } = informerOf(api.ctx);
  try {
    assert.deepEqual(await informer.current(deadline()), { state: "missing" });
    assert.equal(tasks.length, 0, "no watch");
    api.lists.push({ items: [cep("a", 300)], resourceVersion: "3" });
    api.clock.now += MISSING_RECHECK_MS - 1;
    assert.deepEqual(await informer.current(deadline()), { state: "missing" }, "not asked yet");
    assert.equal(api.listed(), 1);
    api.clock.now += 1;
    assert.equal(await count(300), 1, "installed since");
    assert.equal(api.listed(), 2);
    await eventually(() => api.watches.length === 1, "the watch starts");
    // The CRD removed: the watch ends, the index empties and the next pass lists again.
    api.watches[0].events.push(new ResourceNotInstalledError("gone", "ciliumendpoints.x.io"));
    api.lists.push(new ResourceNotInstalledError("gone", "ciliumendpoints.x.io"));
    await eventually(
      async () => (await informer.current(deadline())).state === "missing",
      "missing again",
    );
    assert.equal(api.listed(), 3, "the pass after the removal asked");
  } finally {
    await stop();
  }
});

/** `client` with every call counted by `<verb> <plural>`. */
function counting(client: KubeClient): { client: KubeClient; calls: Map<string, number> } {
  const calls = new Map<string, number>();
  const verbs = new Set(["get", "list", "create", "update", "patch", "delete", "watch"]);
  const proxy = new Proxy(client, {
    get(target, prop) {
      const value = Reflect.get(target, prop);
      if (typeof value !== "function") return value;
      if (typeof prop !== "string" || !verbs.has(prop)) return value.bind(target);
      return (res: KubeResource, ...rest: unknown[]) => {
        const what = `${prop} ${res.plural}`;
        calls.set(what, (calls.get(what) ?? 0) + 1);
        return value.call(target, res, ...rest);
      };
    },
  });
  return { client: proxy, calls };
}

async function candidates(s: K8sSession): Promise<Map<number, GcCandidate>> {
  const out = new Map<number, GcCandidate>();
  for await (const c of s.gcList({ min: 1, max: 65535 }, deadline())) out.set(c.id, c);
  return out;
}

k8sTest(
  "GC passes after the first list no endpoints or slices, keep an identity a later endpoint names and delete one whose endpoint went",
  async () => {
    await using fx = await fixture();
    const a = await fx.session("a");
    const ids = { kept: 300, dropped: 301, sliced: 302 };
    for (const [key, id] of Object.entries(ids)) {
      const got = await a.acquire({ key: `${key};`, pickCandidate: () => id, signal: deadline() });
      assert.equal(got.id, id);
      await a.release(`${key};`, id, deadline());
    }
    await fx.endpoint("ep-dropped", ids.dropped);
    await fx.endpointSlice("ces-1", [ids.sliced]);

    const { client, calls } = counting(fx.client);
    await using backend = await K8sBackend.connect(fx.options("gc"), { client });
    await using gc = await backend.openSession({
      leaseTtlMs: 3_000,
      readOnly: false,
      onLeaseReplaced: () => {},
      gcGraceMs: 0,
    }) as K8sSession;

    const pass1 = await candidates(gc);
    assert.deepEqual(
      [pass1.get(ids.kept)?.inUse, pass1.get(ids.dropped)?.inUse, pass1.get(ids.sliced)?.inUse],
      [false, true, true],
    );
    const lists = () => [calls.get("list ciliumendpoints"), calls.get("list ciliumendpointslices")];
    assert.deepEqual(lists(), [1, 1], "the first pass lists each once");
    assert.ok(await gc.gcMark(pass1.get(ids.kept)!, deadline()), "the unused one is marked");

    // Made after the informer started: an endpoint naming the marked identity, and the removal
    // of the one that kept the other.
    await fx.endpoint("ep-kept", ids.kept);
    await fx.client.delete(fx.endpoints, "ep-dropped", {
      namespace: fx.namespace,
      signal: deadline(),
    });
    let pass = pass1;
    await eventually(async () => {
      pass = await candidates(gc);
      return pass.get(ids.kept)?.inUse === true && pass.get(ids.dropped)?.inUse === false;
    }, "the watch shows both changes");
    assert.equal(await gc.gcDelete(pass.get(ids.kept)!, deadline()), false, "in use: kept");
    assert.ok(await gc.gcMark(pass.get(ids.dropped)!, deadline()));
    const marked = (await candidates(gc)).get(ids.dropped)!;
    assert.deepEqual([marked.inUse, marked.markedAt !== undefined], [false, true]);
    assert.equal(await gc.gcDelete(marked, deadline()), true, "unused and marked: deleted");

    const after = await candidates(gc);
    assert.deepEqual(
      [after.has(ids.kept), after.has(ids.dropped), after.get(ids.sliced)?.inUse],
      [true, false, true],
    );
    assert.ok(await fx.identity(ids.kept));
    assert.equal(await fx.identity(ids.dropped), undefined);
    assert.deepEqual(lists(), [1, 1], "later passes listed no endpoint nor slice");
    assert.deepEqual(
      [calls.get("watch ciliumendpoints"), calls.get("watch ciliumendpointslices")],
      [1, 1],
      "one watch each",
    );
  },
);
