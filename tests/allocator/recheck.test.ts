// The re-check of held keys against the session test double: a lapsed claim fences every held
// key until a pass that starts after the renewal proves them; a conflict moves a key to the ID the
// store gives it now, announced as `reassigned`; a failed release is retried by the sync; master-key
// protection re-creates a deleted master. The conformance suites run the same paths on real stores.
import assert from "node:assert/strict";
import { Acquirer } from "../../src/allocator/acquire.ts";
import { IdCache } from "../../src/allocator/cache.ts";
import { CacheFeed } from "../../src/allocator/cache_feed.ts";
import { Fence } from "../../src/allocator/fence.ts";
import { IdPool } from "../../src/allocator/id_pool.ts";
import { IdSpace } from "../../src/allocator/id_space.ts";
import { KeyedMutex } from "../../src/allocator/keyed_mutex.ts";
import { LocalKeys } from "../../src/allocator/local_keys.ts";
import { Recheck } from "../../src/allocator/recheck.ts";
import type { AllocatorEvent } from "../../src/allocator/types.ts";
import { TaskGroup } from "../../src/task_group.ts";
import { AllocatorTelemetry } from "../../src/telemetry/allocator.ts";
import { eventually } from "../_support/eventually.ts";
import { SessionDouble } from "./_session_double.ts";

const BACKOFF = { initialMs: 1, maxMs: 5, factor: 1 };

function parts(session: SessionDouble) {
  const tasks = new TaskGroup("test");
  const space = new IdSpace(1, 100, 0);
  const cache = new IdCache<string>((k) => k);
  const pool = new IdPool(1, 100);
  const local = new LocalKeys();
  const fence = new Fence();
  const mutex = new KeyedMutex();
  const telemetry = new AllocatorTelemetry({ backend: "session-double", prefix: "p", node: "n" });
  const hooks = {
    conflict: (key: string, why: string) => recheck.conflict(key, why),
    deletedHeld: (key: string, id: number) => recheck.deletedHeld(key, id),
  };
  const codec = { encode: (k: string) => k, decode: (k: string) => k };
  const feed = new CacheFeed<string>({
    session,
    cache,
    pool,
    space,
    local,
    codec,
    backoff: BACKOFF,
    telemetry,
    hooks,
  });
  const acquirer = new Acquirer<string>({
    session,
    cache,
    pool,
    space,
    policy: { maxAttempts: 3, lockWaitMs: 0, backoff: BACKOFF },
    record: (key, id, version) => feed.insertLocal(key, id, version),
    abandoned: (key) => recheck.dropAbandoned(key),
    onRetry: () => {},
  });
  const recheck: Recheck<string> = new Recheck({
    session,
    fence,
    local,
    mutex,
    cache,
    feed,
    acquirer,
    codec,
    tasks,
    telemetry,
    node: "n",
    backoff: BACKOFF,
    masterKeyProtection: true,
    readOnly: false,
  });
  tasks.spawn(feed.run(tasks.signal));
  recheck.start();
  return {
    recheck,
    fence,
    local,
    cache,
    feed,
    tasks,
    async hold(key: string): Promise<number> {
      await feed.waitForInitialSync(tasks.signal);
      using _lock = await mutex.lock(key, tasks.signal);
      const { id } = await acquirer.acquire(key, tasks.signal);
      local.add(key, id);
      return id;
    },
    [Symbol.asyncDispose]: () =>
      tasks.close(() => {
        recheck.stop();
        feed.close(new Error("closed"));
      }),
  };
}

Deno.test("Recheck: a lapsed claim fences held keys until a pass after the renewal proves them", async () => {
  const session = new SessionDouble();
  await using p = parts(session);
  await p.hold("k;");
  assert.equal(p.recheck.answersFromMemory(), true);
  // The claim runs out (a stall): the next answer sees it, and nothing is answered from memory.
  session.claimUntil = Date.now() - 1;
  assert.equal(p.recheck.answersFromMemory(), false);
  assert.equal(p.fence.isSuspect("k;"), true);
  // The fence resolution renews (the double then grants a minute) and proves the key.
  await eventually(() => !p.fence.active, "the fence comes down");
  assert.ok(session.calls.includes("renew"), session.calls.join("; "));
  assert.ok(session.calls.some((c) => c.startsWith("ensure k;")), session.calls.join("; "));
  assert.equal(p.recheck.answersFromMemory(), true);
});

Deno.test("Recheck: the claim timer fences a node nobody asks anything", async () => {
  const session = new SessionDouble();
  session.claimUntil = Date.now() + 100;
  // Renewals fail to extend the claim: the fence must stay up.
  session.onRenew = () => {};
  await using p = parts(session);
  await p.hold("k;");
  await eventually(() => p.fence.active, "the timer raised the fence");
  await new Promise((r) => setTimeout(r, 50));
  assert.equal(p.fence.active, true, "no pass completes while the claim is out");
  assert.equal(p.recheck.answersFromMemory(), false);
  assert.ok(session.calls.includes("renew"), "the fenced node tried to renew");
});

Deno.test("Recheck: a conflict moves the key to the store's ID and announces it", async () => {
  const session = new SessionDouble();
  await using p = parts(session);
  const oldId = await p.hold("k;");
  const events: AllocatorEvent<string>[] = [];
  const stop = new AbortController();
  const watching = (async () => {
    for await (const e of p.feed.subscribe(stop.signal)) events.push(e);
  })();
  // The store gives the held ID to another key: `ensure` reports the conflict, and the store's
  // own rule gives k; a new ID.
  session.masters.set(oldId, "thief;");
  session.ensureReport = (held) => ({
    ...held,
    master: held.id === oldId ? "conflict" : "ok",
    reference: "ok",
  });
  p.recheck.conflict("k;", "ID taken");
  await eventually(() => !p.fence.active, "the key is re-acquired");
  const newId = p.local.get("k;")!.id;
  assert.notEqual(newId, oldId);
  assert.ok(session.calls.includes(`release k;/${oldId}`), session.calls.join("; "));
  await eventually(
    () => events.some((e) => e.type === "reassigned"),
    "reassigned is announced",
  );
  assert.deepEqual(events.find((e) => e.type === "reassigned"), {
    type: "reassigned",
    key: "k;",
    oldId,
    newId,
  });
  stop.abort();
  await watching;
});

Deno.test("Recheck: a key moved to an older master it had not seen is announced from the ID it held", async () => {
  const session = new SessionDouble();
  await using p = parts(session);
  // The node created master 10 for k; (the newest); its watch shows master 20 of k; only later,
  // older (Cilium's UpdateKey wrote it just before, its reference just after).
  session.acquireSteps.push({ id: 10, created: true, version: "50" });
  assert.equal(await p.hold("k;"), 10);
  const events: AllocatorEvent<string>[] = [];
  const stop = new AbortController();
  const watching = (async () => {
    for await (const e of p.feed.subscribe(stop.signal)) {
      if (e.type === "reassigned") events.push(e);
    }
  })();
  // The store's rule (the references now agree on 20) gives k; the older master: the master this
  // node just left is no newer master to wait for, and the move is announced from 10.
  session.masters.set(20, "k;");
  session.push({ type: "upsert", id: 20, key: "k;", version: "40" });
  await eventually(() => events.length > 0, "the move is announced");
  assert.deepEqual(events, [{ type: "reassigned", key: "k;", oldId: 10, newId: 20 }]);
  await eventually(() => !p.fence.active, "the fence comes down");
  assert.equal(p.local.get("k;")?.id, 20);
  stop.abort();
  await watching;
});

Deno.test("Recheck: a failed release is retried by the sync, unless the key is held again", async () => {
  const session = new SessionDouble();
  await using p = parts(session);
  session.references.set("gone;", 7);
  session.references.set("back;", 8);
  p.recheck.releaseFailed("gone;", 7);
  p.recheck.releaseFailed("back;", 8);
  p.recheck.heldAgain("back;");
  await p.recheck.requestSync("requested");
  assert.equal(session.references.has("gone;"), false);
  assert.equal(session.references.get("back;"), 8);
});

Deno.test("Recheck: master-key protection re-creates a held ID's deleted master", async () => {
  const session = new SessionDouble();
  await using p = parts(session);
  const id = await p.hold("k;");
  session.ensureReport = (held) => ({ ...held, master: "recreated", reference: "ok" });
  session.masters.delete(id);
  session.push({ type: "delete", id });
  await eventually(
    () => session.calls.includes("ensure k;"),
    "protection asks the store to re-create it",
  );
  assert.equal(p.cache.entry(id)?.key, "k;", "consumers saw no delete");
});
