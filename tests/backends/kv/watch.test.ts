import assert from "node:assert/strict";
import type { BackendEvent } from "../../../src/allocator/backend.ts";
import { Clock, KV_FIXTURE_PREFIX, never, request, TestStore } from "./_helpers.ts";

const P = KV_FIXTURE_PREFIX;
const ROOT = new URL("../../../", import.meta.url).pathname;
const CHILD = new URL("./_child_node.ts", import.meta.url).pathname;

/** Aborts after `ms` so that a broken feed ends the test instead of hanging it. */
function hangGuard(ms: number): AbortController & Disposable {
  const ctl = new AbortController();
  const timer = setTimeout(() => ctl.abort(new Error(`watch hang guard (${ms} ms)`)), ms);
  return Object.assign(ctl, { [Symbol.dispose]: () => clearTimeout(timer) });
}

/** Applies events to a map, as a cache would. */
class View {
  readonly ids = new Map<number, string>();
  synced = false;
  apply(ev: BackendEvent): void {
    if (ev.type === "synced") this.synced = true;
    else if (ev.type === "upsert") this.ids.set(ev.id, ev.key);
    else this.ids.delete(ev.id);
  }
  /** Pulls events until `done()` holds; false if the feed ended first. */
  async until(it: AsyncIterator<BackendEvent>, done: () => boolean): Promise<boolean> {
    while (!done()) {
      const next = await it.next();
      if (next.done) return false;
      this.apply(next.value);
    }
    return true;
  }
}

async function runChild(args: string[]): Promise<unknown> {
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", CHILD, ...args],
    cwd: ROOT,
    stdout: "piped",
    stderr: "piped",
  }).output();
  const stderr = new TextDecoder().decode(out.stderr);
  assert.equal(out.code, 0, `child failed: ${stderr}`);
  const lines = new TextDecoder().decode(out.stdout).trim().split("\n");
  return JSON.parse(lines.at(-1)!);
}

Deno.test("kv watch: initial list, synced, then in-process changes via kv.watch (no poll)", async () => {
  await using store = await TestStore.create();
  // Polling is effectively off: only kv.watch on another handle in this process can wake it.
  const a = await store.session("a", { pollIntervalMs: 600_000, logRetentionMs: 3_600_000 });
  const b = await store.session("b");
  await b.acquire(request("k0", { first: 1 }));
  using guard = hangGuard(10_000);
  const it = a.watch(guard.signal)[Symbol.asyncIterator]();
  const view = new View();
  assert.ok(await view.until(it, () => view.synced));
  assert.deepEqual(view.ids, new Map([[1, "k0"]]));
  const r = await b.acquire(request("k1", { first: 2 }));
  const events: BackendEvent[] = [];
  while (events.length === 0 || events.at(-1)!.type !== "upsert") {
    const next = await it.next();
    assert.ok(!next.done, "feed ended before the change arrived");
    events.push(next.value);
  }
  const { at, ...change } = events.at(-1) as BackendEvent & { at?: number };
  assert.deepEqual(change, { type: "upsert", id: 2, key: "k1", version: r.version });
  // Dated by the writer's clock (the change-feed entry's time), for the watch-lag metric.
  assert.ok(at !== undefined && Math.abs(Date.now() - at) < 10_000, `at: ${at}`);
  guard.abort();
  assert.deepEqual(await it.next(), { done: true, value: undefined });
  assert.ok(a.backgroundStats.reads >= 2);
});

Deno.test("kv watch: a change written by another process is found by the poll", async () => {
  await using store = await TestStore.create();
  const a = await store.session("a", { pollIntervalMs: 20 });
  using guard = hangGuard(30_000);
  const it = a.watch(guard.signal)[Symbol.asyncIterator]();
  const view = new View();
  assert.ok(await view.until(it, () => view.synced));
  const spec = JSON.stringify(store.fixture.spec());
  const ids = await runChild([spec, "child", "acquire", "10", "c1", "c2", "c3"]) as Record<
    string,
    number
  >;
  assert.deepEqual(ids, { c1: 10, c2: 11, c3: 12 });
  assert.ok(await view.until(it, () => view.ids.size === 3), "feed ended early");
  assert.deepEqual(view.ids, new Map([[10, "c1"], [11, "c2"], [12, "c3"]]));

  // A second process (same node name: its old references die with the new lease) collects them.
  const deleted = await runChild([spec, "child", "collect"]);
  assert.deepEqual(deleted, [10, 11, 12]);
  assert.ok(await view.until(it, () => view.ids.size === 0), "feed ended early");
  guard.abort();
  await it.return?.();
});

Deno.test("kv watch: a create and a delete between two polls leave the right state", async () => {
  await using store = await TestStore.create();
  const a = await store.session("a", { pollIntervalMs: 20 });
  const b = await store.session("b");
  using guard = hangGuard(10_000);
  const it = a.watch(guard.signal)[Symbol.asyncIterator]();
  const view = new View();
  assert.ok(await view.until(it, () => view.synced));
  await b.acquire(request("gone", { first: 1 }));
  await b.release("gone", 1, never);
  for (let pass = 0; pass < 2; pass++) {
    for await (const c of b.gcList({ min: 1, max: 10 }, never)) {
      if (pass === 1) assert.equal(await b.gcDelete(c, never), true);
    }
  }
  await b.acquire(request("stays", { first: 2 }));
  assert.ok(await view.until(it, () => view.ids.has(2)));
  assert.deepEqual(view.ids, new Map([[2, "stays"]]));
  guard.abort();
  await it.return?.();
});

Deno.test("kv watch: corrupt entries are skipped, never fatal", async () => {
  await using store = await TestStore.create();
  const a = await store.session("a", { pollIntervalMs: 20 });
  const b = await store.session("b");
  await store.fixture.plantCorruptEntries();
  await b.acquire(request("k1", { first: 1 }));
  using guard = hangGuard(10_000);
  const it = a.watch(guard.signal)[Symbol.asyncIterator]();
  const view = new View();
  assert.ok(await view.until(it, () => view.synced));
  assert.deepEqual(view.ids, new Map([[1, "k1"]]));
  // More garbage in the live feed window, then a real change.
  await store.kv.set([...P, "log", Date.now(), "ghost", "y"], { id: "x", key: 5 });
  await store.kv.set([...P, "log", "not-a-time"], { id: 3, key: "k3" });
  await b.acquire(request("k2", { first: 2 }));
  assert.ok(await view.until(it, () => view.ids.has(2)));
  assert.deepEqual(view.ids, new Map([[1, "k1"], [2, "k2"]]));
  assert.equal(a.status().lastError, undefined);
  // The planted entries are still there, untouched.
  assert.equal((await store.kv.get([...P, "id", 9_999])).value, "not an object");
  guard.abort();
  await it.return?.();
});

Deno.test("kv watch: missed log entries trigger a re-list", async () => {
  await using store = await TestStore.create();
  const a = await store.session("a", { pollIntervalMs: 20 });
  using guard = hangGuard(10_000);
  const it = a.watch(guard.signal)[Symbol.asyncIterator]();
  const view = new View();
  assert.ok(await view.until(it, () => view.synced));
  // A master whose log entry is missing (a writer far off in time): gen says one entry exists.
  await store.kv.atomic()
    .set([...P, "id", 7], { key: "k7" })
    .set([...P, "key", "k7"], { id: 7 })
    .set([...P, "log", 0, "far-past", "n"], { id: 7, key: "k7" })
    .sum([...P, "gen"], 1n)
    .commit();
  assert.ok(await view.until(it, () => view.ids.has(7)));
  assert.equal(view.ids.get(7), "k7");
  guard.abort();
  await it.return?.();
});

Deno.test("kv watch: the periodic resync reports an unlogged deletion", async () => {
  await using store = await TestStore.create();
  const clock = new Clock(Date.now());
  const a = await store.session("a", {
    pollIntervalMs: 20,
    resyncIntervalMs: 60_000,
    now: clock.now,
  });
  await a.acquire(request("k1", { first: 1 }));
  await a.acquire(request("k2", { first: 2 }));
  using guard = hangGuard(10_000);
  const it = a.watch(guard.signal)[Symbol.asyncIterator]();
  const view = new View();
  assert.ok(await view.until(it, () => view.synced && view.ids.size === 2));
  await store.fixture.deleteMaster(1); // an operator's direct delete: no log entry, no gen
  clock.advance(60_000);
  const events: BackendEvent[] = [];
  while (!events.some((e) => e.type === "delete")) {
    const next = await it.next();
    assert.ok(!next.done);
    events.push(next.value);
  }
  assert.deepEqual(events, [{ type: "delete", id: 1 }]);
  guard.abort();
  await it.return?.();
});

Deno.test("kv watch: abort and session close end the feed", async () => {
  await using store = await TestStore.create();
  const a = await store.session("a", { pollIntervalMs: 20 });
  const ctl = new AbortController();
  const one = a.watch(ctl.signal)[Symbol.asyncIterator]();
  const two = a.watch(never)[Symbol.asyncIterator]();
  assert.deepEqual(await one.next(), { done: false, value: { type: "synced" } });
  assert.deepEqual(await two.next(), { done: false, value: { type: "synced" } });
  const pending = one.next();
  ctl.abort();
  assert.deepEqual(await pending, { done: true, value: undefined });
  const pendingTwo = two.next();
  await a.close();
  assert.deepEqual(await pendingTwo, { done: true, value: undefined });
});

Deno.test("a consumer that breaks out of the feed before any abort ends it cleanly", async () => {
  await using store = await TestStore.create();
  const session = await store.session("a");
  await session.acquire(request("k;", { first: 7 }));
  // An in-process kv.watch notification parks the wake-up pump until the next poll; leaving
  // without an abort must still end the feed (it used to wait forever).
  for await (const event of session.watch(never)) {
    if (event.type === "synced") break;
  }
  await session.acquire(request("k2;", { first: 9 }));
  let seen = 0;
  for await (const event of session.watch(never)) {
    if (event.type === "upsert") seen++;
    if (event.type === "synced") break;
  }
  assert.equal(seen, 2);
});
