// The re-check of held keys against the session test double: a lapsed claim fences every held
// key until a pass that starts after the renewal proves them; a conflict moves a key to the ID the
// store gives it now, announced as `reassigned`; the sync has failed reference deletions retried;
// master-key protection re-creates a deleted master. The conformance suites run the same paths on
// real stores.
import assert from "node:assert/strict";
import { resolveOptions } from "../../src/allocator/options.ts";
import { buildParts, closeParts, startParts } from "../../src/allocator/parts.ts";
import type { AllocatorEvent } from "../../src/allocator/types.ts";
import { eventually } from "../_support/eventually.ts";
import { SessionDouble } from "./_session_double.ts";

/** What the parts read of a backend: its names (it has no admin view here). */
const BACKEND = {
  kind: "session-double",
  node: "n",
  admin: (): never => {
    throw new Error("no admin view");
  },
};

/** The allocator's parts on `session`, built and started as the allocator builds them. */
function parts(session: SessionDouble) {
  const settings = resolveOptions<string>({
    min: 1,
    max: 100,
    maxAttempts: 3,
    lockWaitMs: 0,
    backoff: { initialMs: 1, maxMs: 5, factor: 1 },
  });
  const p = buildParts(BACKEND, session, settings);
  startParts(p, settings, () => Promise.resolve());
  const { tasks, feed, mutex, acquirer, local } = p;
  return {
    ...p,
    async hold(key: string): Promise<number> {
      await feed.waitForInitialSync(tasks.signal);
      using _lock = await mutex.lock(key, tasks.signal);
      const { id } = await acquirer.acquire(key, tasks.signal);
      local.add(key, id);
      return id;
    },
    [Symbol.asyncDispose]: () => closeParts(p),
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
  // Each pass of the fence's resolution renews first; a second renewal means a whole pass ran
  // (renewal, re-check of k;) with the claim still out, and the fence stayed up through it.
  const renewals = () => session.calls.filter((c) => c === "renew").length;
  await eventually(() => renewals() >= 2, "a whole pass ran and another began");
  assert.ok(session.calls.some((c) => c.startsWith("ensure k;")), session.calls.join("; "));
  assert.equal(p.fence.active, true, "no pass completes while the claim is out");
  assert.equal(p.recheck.answersFromMemory(), false);
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

Deno.test("Recheck: the sync retries failed reference deletions, not those of keys held again", async () => {
  const session = new SessionDouble();
  await using p = parts(session);
  const gone = await p.hold("gone;");
  const back = await p.hold("back;");
  // Both last releases fail to delete their reference; "back;" is then acquired again.
  session.releaseSteps.push(new Error("store down"), new Error("store down"));
  for (const [key, id] of [["gone;", gone], ["back;", back]] as const) {
    p.local.release(key);
    assert.equal(await p.deletions.deleteNow(key, id, p.tasks.signal), false);
  }
  await p.deletions.settle("back;");
  await p.hold("back;");
  await p.recheck.requestSync("requested");
  assert.equal(session.references.has("gone;"), false);
  assert.equal(session.references.get("back;"), back);
  assert.equal(p.deletions.failed, 0);
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
