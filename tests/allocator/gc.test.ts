// GarbageCollector against the session test double: without `gcMark` (Deno KV, etcd) the marks
// live in the process and a delete needs two passes over the same version; with `gcMark`
// (Kubernetes) the first unused sighting marks in the store, the delete is guarded by the version
// the mark left, and a mark found in the store counts its grace from its own time.
import assert from "node:assert/strict";
import type { GcCandidate } from "../../src/allocator/backend.ts";
import { GarbageCollector, RateLimiter } from "../../src/allocator/gc.ts";
import { SessionDouble } from "./_session_double.ts";

/** The double with a scripted store of GC candidates and recorded marks and deletes. */
class GcSession extends SessionDouble {
  candidates: GcCandidate[] = [];
  readonly deletes: GcCandidate[] = [];
  override async *gcList(): AsyncIterable<GcCandidate> {
    yield* this.candidates;
  }
  // Optional only because the double's own `gcDelete` takes nothing; the collector always passes it.
  override gcDelete(candidate?: GcCandidate): Promise<boolean> {
    this.deletes.push(candidate!);
    this.candidates = this.candidates.filter((c) => c.id !== candidate!.id);
    return Promise.resolve(true);
  }
}

/** The double whose store keeps marks: `gcMark` bumps the version and records the time. */
class MarkingSession extends GcSession {
  readonly marks: GcCandidate[] = [];
  /** What `gcMark` finds: `changed` makes it fail as if the object moved on. */
  changed = false;
  gcMark(candidate: GcCandidate): Promise<string | undefined> {
    this.marks.push(candidate);
    if (this.changed) return Promise.resolve(undefined);
    const version = `${candidate.version}m`;
    this.candidates = this.candidates.map((c) =>
      c.id === candidate.id ? { ...c, version, markedAt: Date.now() } : c
    );
    return Promise.resolve(version);
  }
}

const RANGE = { min: 1, max: 100 };
const collector = (s: SessionDouble, graceMs = 0) =>
  new GarbageCollector(s, RANGE, new RateLimiter(1_000, 1_000), graceMs);
const signal = () => AbortSignal.timeout(5_000);

Deno.test("without gcMark: two passes over one version delete, a changed version re-marks", async () => {
  const s = new GcSession();
  s.candidates = [
    { id: 1, key: "a", version: "v1", inUse: false },
    { id: 2, key: "b", version: "v1", inUse: true },
    { id: 3, key: "c", version: "v1", inUse: false },
  ];
  const gc = collector(s);
  assert.deepEqual(await gc.run(signal()), {
    alive: 3,
    deleted: 0,
    marked: 2,
    deletedIds: [],
    skipped: 0,
  });
  s.candidates = s.candidates.map((c) => (c.id === 3 ? { ...c, version: "v2" } : c));
  const second = await gc.run(signal());
  assert.deepEqual(second.deletedIds, [1]);
  assert.equal(second.marked, 1, "3 changed: marked again, not deleted");
  assert.deepEqual((await gc.run(signal())).deletedIds, [3]);
});

Deno.test("with gcMark: the first pass marks in the store, the next deletes at the marked version", async () => {
  const s = new MarkingSession();
  s.candidates = [
    { id: 1, key: "a", version: "v1", inUse: false },
    { id: 2, key: "b", version: "v1", inUse: true },
  ];
  const gc = collector(s);
  const first = await gc.run(signal());
  assert.deepEqual([first.deleted, first.marked], [0, 1]);
  assert.deepEqual(s.marks.map((c) => [c.id, c.version]), [[1, "v1"]]);
  const second = await gc.run(signal());
  assert.deepEqual(second.deletedIds, [1]);
  assert.equal(s.deletes[0].version, "v1m", "the delete is guarded by the version the mark left");
  assert.equal(s.marks.length, 1, "a marked candidate is not marked again");
});

Deno.test("with gcMark: a use between passes removes the mark, and the candidate is marked anew", async () => {
  const s = new MarkingSession();
  s.candidates = [{ id: 1, key: "a", version: "v1", inUse: false }];
  const gc = collector(s);
  await gc.run(signal());
  // An acquire removed the mark (a new version, no markedAt), then a release left it unused.
  s.candidates = [{ id: 1, key: "a", version: "v3", inUse: false }];
  const second = await gc.run(signal());
  assert.deepEqual([second.deleted, second.marked], [0, 1]);
  assert.deepEqual(s.marks.map((c) => c.version), ["v1", "v3"]);
});

Deno.test("with gcMark: a mark written elsewhere counts its grace from its own time", async () => {
  const s = new MarkingSession();
  const now = Date.now();
  s.candidates = [
    // Marked by an earlier process (or Cilium's operator) an hour ago: past the grace.
    { id: 1, key: "old", version: "v7", inUse: false, markedAt: now - 3_600_000 },
    // Marked a moment ago: within the grace.
    { id: 2, key: "new", version: "v8", inUse: false, markedAt: now },
    // Marked, but in use (an endpoint names it): left alone.
    { id: 3, key: "used", version: "v9", inUse: true, markedAt: now - 3_600_000 },
  ];
  const gc = collector(s, 60_000);
  const stats = await gc.run(signal());
  assert.deepEqual(stats.deletedIds, [1]);
  assert.equal(stats.marked, 1);
  assert.equal(s.marks.length, 0, "nothing is marked twice");
  assert.deepEqual((await gc.run(signal())).deletedIds, [], "2 is still within its grace");
});

Deno.test("with gcMark: a candidate that changed under the mark is neither remembered nor deleted", async () => {
  const s = new MarkingSession();
  s.changed = true;
  s.candidates = [{ id: 1, key: "a", version: "v1", inUse: false }];
  const gc = collector(s);
  const first = await gc.run(signal());
  assert.deepEqual([first.deleted, first.marked], [0, 0]);
  const second = await gc.run(signal());
  assert.deepEqual([second.deleted, s.marks.length], [0, 2], "marked again next pass");
});
