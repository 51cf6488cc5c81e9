// The deletions of this node's references against the session test double, one case per state:
// queued (cancelled by a re-acquisition, sent together behind a batch in flight), in flight (a
// re-acquisition waits for it), failed (sent again by the next retry, which the sync calls),
// abandoned (deleted unless the key is held) and close (lets deletions land, waits no longer than
// its bound). The conformance suites run the allocator's release paths on real stores.
import assert from "node:assert/strict";
import { ReferenceDeletions } from "../../src/allocator/deletions.ts";
import { LocalKeys } from "../../src/allocator/local_keys.ts";
import { SessionDouble } from "./_session_double.ts";

/** Deletions over a session double whose node references `keys` (key → ID). */
function deletionsOn(keys: Record<string, number>) {
  const session = new SessionDouble();
  for (const [key, id] of Object.entries(keys)) session.references.set(key, id);
  const local = new LocalKeys();
  const stop = new AbortController();
  const deletions = new ReferenceDeletions({ session, local, signal: stop.signal });
  return { session, local, deletions, stop };
}

/** A gate a scripted `release` waits for: the deletion stays in flight until it opens. */
function gate(): { promise: Promise<void>; open: () => void } {
  const { promise, resolve } = Promise.withResolvers<void>();
  return { promise, open: () => resolve() };
}

Deno.test("ReferenceDeletions: queued behind a batch in flight, they go out together once it lands", async () => {
  const { session, deletions } = deletionsOn({ "a;": 1, "b;": 2, "c;": 3 });
  const held = gate();
  session.releaseSteps.push(held.promise);
  deletions.schedule("a;", 1);
  deletions.schedule("b;", 2);
  deletions.schedule("c;", 3);
  assert.equal(deletions.state("a;"), "in flight");
  assert.equal(deletions.state("b;"), "queued");
  assert.deepEqual(session.calls, ["release a;/1"], "b; and c; wait for the batch in flight");
  const flushed = deletions.flush();
  held.open();
  await flushed;
  assert.deepEqual(session.calls, ["release a;/1", "release b;/2", "release c;/3"]);
  assert.equal(session.references.size, 0);
  assert.equal(deletions.pending, 0);
});

Deno.test("ReferenceDeletions: a queued deletion is cancelled when the key is acquired again", async () => {
  const { session, deletions } = deletionsOn({ "a;": 1, "b;": 2 });
  const held = gate();
  session.releaseSteps.push(held.promise);
  deletions.schedule("a;", 1);
  deletions.schedule("b;", 2);
  assert.equal(deletions.state("b;"), "queued");
  await deletions.settle("b;");
  assert.equal(deletions.state("b;"), undefined);
  held.open();
  await deletions.flush();
  assert.equal(session.references.get("b;"), 2, "the re-acquired key keeps its reference");
  assert.ok(!session.calls.includes("release b;/2"), session.calls.join("; "));
});

Deno.test("ReferenceDeletions: a re-acquisition waits until the deletion in flight has landed", async () => {
  const { session, deletions } = deletionsOn({ "a;": 1 });
  const held = gate();
  session.releaseSteps.push(held.promise);
  deletions.schedule("a;", 1);
  assert.equal(deletions.state("a;"), "in flight");
  const settled = deletions.settle("a;").then(() => session.references.has("a;"));
  held.open();
  assert.equal(await settled, false, "the deletion had landed when settle returned");
  assert.equal(deletions.state("a;"), undefined);
});

Deno.test("ReferenceDeletions: a failed deletion waits for the next retry, unless re-acquired", async () => {
  const { session, deletions } = deletionsOn({ "a;": 1, "b;": 2, "c;": 3 });
  session.releaseSteps.push(new Error("store down"), new Error("store down"));
  deletions.schedule("a;", 1);
  assert.equal(await deletions.deleteNow("b;", 2, new AbortController().signal), false);
  await deletions.flush();
  assert.equal(deletions.state("a;"), "failed");
  assert.equal(deletions.state("b;"), "failed");
  assert.equal(deletions.failed, 2);
  // flush does not retry: the failure is left to the sync.
  assert.equal(session.references.get("a;"), 1);
  // "b;" is acquired again before the retry: its failed deletion must not run.
  await deletions.settle("b;");
  await deletions.retry();
  assert.equal(session.references.has("a;"), false, "the retry deleted a;");
  assert.equal(session.references.get("b;"), 2);
  assert.equal(deletions.failed, 0);
  // A retry that fails again keeps the deletion for the next one.
  session.releaseSteps.push(new Error("store down"));
  deletions.schedule("c;", 3);
  await deletions.flush();
  session.releaseSteps.push(new Error("still down"));
  await deletions.retry();
  assert.equal(deletions.state("c;"), "failed");
  await deletions.retry();
  assert.equal(session.references.has("c;"), false);
});

Deno.test("ReferenceDeletions: an abandoned acquisition's reference is deleted unless the key is held", async () => {
  const { session, local, deletions } = deletionsOn({ "lost;": 4, "kept;": 5 });
  deletions.abandoned("lost;");
  await deletions.flush();
  assert.equal(session.references.has("lost;"), false);
  // A key held when the deletion goes out (a re-check's aborted re-acquisition) keeps it.
  local.add("kept;", 5);
  const held = gate();
  session.releaseSteps.push(held.promise);
  deletions.schedule("other;", 6);
  deletions.abandoned("kept;");
  assert.equal(deletions.state("kept;"), "queued");
  held.open();
  await deletions.flush();
  assert.equal(session.references.get("kept;"), 5);
  assert.equal(deletions.state("kept;"), undefined);
  assert.ok(!session.calls.some((c) => c.startsWith("release kept;")), session.calls.join("; "));
});

Deno.test("ReferenceDeletions: close lets deletions land, and waits no longer than its bound", async () => {
  const landing = deletionsOn({ "a;": 1, "b;": 2 });
  landing.deletions.schedule("a;", 1);
  landing.deletions.schedule("b;", 2);
  await landing.deletions.close();
  assert.equal(landing.session.references.size, 0);

  const { session, deletions, stop } = deletionsOn({ "stuck;": 1 });
  session.releaseSteps.push(new Promise(() => {})); // never lands
  deletions.schedule("stuck;", 1);
  await deletions.close(10);
  assert.equal(deletions.state("stuck;"), "in flight", "close returned while it was in flight");
  // The owner's closing signal stops it; it is then a failed deletion.
  stop.abort(new Error("closed"));
  await deletions.flush();
  assert.equal(deletions.state("stuck;"), "failed");
});
