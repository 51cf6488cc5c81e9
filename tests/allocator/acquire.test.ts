// Acquisition's retry and lock-wait policy, and what it asks the session, against the session
// test double (the conformance suite runs the same paths on real stores).
import assert from "node:assert/strict";
import { Acquirer, retrying, type RetryPolicy } from "../../src/allocator/acquire.ts";
import type { AcquireRequest, AttemptTrail } from "../../src/allocator/backend.ts";
import { IdCache } from "../../src/allocator/cache.ts";
import { IdPool } from "../../src/allocator/id_pool.ts";
import { IdSpace } from "../../src/allocator/id_space.ts";
import {
  AllocationFailedError,
  InvalidIdError,
  InvalidKeyError,
  KeyLockedError,
  PoolExhaustedError,
  StoreUnavailableError,
} from "../../src/errors.ts";
import { SessionDouble } from "./_session_double.ts";

const FAST = { initialMs: 1, maxMs: 2, factor: 1 };
const never = new AbortController().signal;

function counting(
  outcomes: (Error | string)[],
): { calls: () => number; run: () => Promise<string> } {
  let calls = 0;
  return {
    calls: () => calls,
    run: () => {
      const next = outcomes[Math.min(calls++, outcomes.length - 1)];
      return next instanceof Error ? Promise.reject(next) : Promise.resolve(next);
    },
  };
}

Deno.test("retrying: retryable failures are tried again, up to maxAttempts in all", async () => {
  const policy: RetryPolicy = { maxAttempts: 3, lockWaitMs: 0, backoff: FAST };
  const ok = counting([new StoreUnavailableError("down"), new StoreUnavailableError("down"), "x"]);
  const retried: unknown[] = [];
  assert.equal(await retrying(policy, "k", never, ok.run, (e) => retried.push(e)), "x");
  assert.equal(ok.calls(), 3);
  assert.equal(retried.length, 2);

  const failing = counting([new StoreUnavailableError("down")]);
  const err = await retrying(policy, "k", never, failing.run).catch((e) => e);
  assert.ok(err instanceof AllocationFailedError);
  assert.equal(failing.calls(), 3);
  assert.ok(err.cause instanceof StoreUnavailableError);
});

Deno.test("retrying: a failure that is not retryable is thrown at once", async () => {
  const policy: RetryPolicy = { maxAttempts: 5, lockWaitMs: 0, backoff: FAST };
  const bad = counting([new InvalidKeyError("too long")]);
  await assert.rejects(retrying(policy, "k", never, bad.run), InvalidKeyError);
  assert.equal(bad.calls(), 1);
});

Deno.test("retrying: another writer's lock is waited out without spending attempts", async () => {
  const policy: RetryPolicy = { maxAttempts: 2, lockWaitMs: 5_000, backoff: FAST };
  const locked = () => new KeyLockedError("k", ["cilium/lock"]);
  // Five lock waits, then success: more calls than maxAttempts, none of them an attempt.
  const waits = counting([locked(), locked(), locked(), locked(), locked(), "x"]);
  assert.equal(await retrying(policy, "k", never, waits.run), "x");
  assert.equal(waits.calls(), 6);
});

Deno.test("retrying: lockWaitMs 0 fails a held lock at once; a spent wait counts attempts", async () => {
  const locked = counting([new KeyLockedError("k", ["cilium/lock"])]);
  await assert.rejects(
    retrying({ maxAttempts: 5, lockWaitMs: 0, backoff: FAST }, "k", never, locked.run),
    KeyLockedError,
  );
  assert.equal(locked.calls(), 1);
  const short = counting([new KeyLockedError("k", ["cilium/lock"])]);
  await assert.rejects(
    retrying(
      { maxAttempts: 2, lockWaitMs: 1, backoff: { ...FAST, initialMs: 5 } },
      "k",
      never,
      short.run,
    ),
    AllocationFailedError,
  );
  assert.ok(short.calls() >= 2);
});

Deno.test("retrying: an abort between attempts rejects with the signal's reason", async () => {
  const stop = new AbortController();
  const policy: RetryPolicy = {
    maxAttempts: 100,
    lockWaitMs: 0,
    backoff: { ...FAST, initialMs: 50, maxMs: 50 },
  };
  const down = counting([new StoreUnavailableError("down")]);
  const run = retrying(policy, "k", stop.signal, down.run);
  setTimeout(() => stop.abort(new Error("stop")), 20);
  await assert.rejects(run, /stop/);
  assert.ok(down.calls() < 5);
});

function acquirer(session: SessionDouble, space = new IdSpace(1, 10, 0)) {
  const cache = new IdCache<string>((k) => k);
  const pool = new IdPool(space.min, space.max);
  const recorded: [string, number][] = [];
  const abandoned: string[] = [];
  const a = new Acquirer({
    session,
    cache,
    pool,
    space,
    policy: { maxAttempts: 2, lockWaitMs: 0, backoff: FAST },
    record: (key, id, version) => {
      recorded.push([key, id]);
      pool.remove(space.unmask(id));
      cache.insertLocal(key, id, version);
    },
    deletions: { abandoned: (key) => abandoned.push(key) },
    onRetry: () => {},
  });
  return { a, cache, pool, recorded, abandoned };
}

Deno.test("Acquirer: the ID is masked for the store, checked, recorded; the hint stays in range", async () => {
  const session = new SessionDouble();
  const space = new IdSpace(1, 10, 1 << 16);
  const { a, cache, recorded } = acquirer(session, space);
  const result = await a.acquire("k;", never);
  assert.ok(result.id > 1 << 16 && space.contains(result.id));
  assert.deepEqual(recorded, [["k;", result.id]]);
  assert.deepEqual(session.acquireRequests[0].range, space.stored);
  // A cached master of the key outside the range (another cluster's) is never the hint.
  cache.upsert(3, "far;", "far;", "v");
  await a.acquire("far;", never);
  assert.equal(session.acquireRequests[1].hint, undefined);
  // One inside is.
  await a.acquire("k;", never);
  assert.deepEqual(session.acquireRequests[2].hint, { id: result.id, version: "1" });
});

Deno.test("Acquirer: a store answer outside the range is refused; exhaustion names the range", async () => {
  const session = new SessionDouble();
  const { a } = acquirer(session);
  session.acquireSteps.push({ id: 99, created: true });
  await assert.rejects(a.acquire("k;", never), InvalidIdError);
  session.acquireSteps.push(new PoolExhaustedError(0, 0), new PoolExhaustedError(0, 0));
  const err = await a.acquire("k;", never).catch((e) => e);
  assert.ok(err instanceof AllocationFailedError);
  assert.ok(err.cause instanceof PoolExhaustedError);
  assert.match(err.cause.message, /\[1, 10\]/);
});

Deno.test("Acquirer: an aborted attempt reports the key as abandoned (its write may have landed)", async () => {
  const session = new SessionDouble();
  const { a, abandoned } = acquirer(session);
  const stop = new AbortController();
  session.acquireSteps.push(new StoreUnavailableError("slow"));
  stop.abort(new Error("caller gave up"));
  await assert.rejects(a.acquire("k;", stop.signal), /caller gave up/);
  // Aborted before any attempt: nothing was sent, so nothing is abandoned.
  assert.deepEqual(abandoned, []);
  const late = new AbortController();
  const { a: b, abandoned: bAbandoned } = acquirer(
    Object.assign(new SessionDouble(), {
      acquire: () => {
        late.abort(new Error("caller gave up"));
        return Promise.reject(new StoreUnavailableError("aborted"));
      },
    }),
  );
  await assert.rejects(b.acquire("k;", late.signal), /caller gave up/);
  assert.deepEqual(bAbandoned, ["k;"]);
});

Deno.test("Acquirer: a master an attempt created and then failed after is reported created by the retry", async () => {
  const session = new SessionDouble();
  const { a } = acquirer(session);
  const trails: AttemptTrail[] = [];
  session.acquire = (req: AcquireRequest) => {
    trails.push(req.trail!);
    // The first attempt creates master 3, then a later step of it fails; the retry joins 3.
    if (trails.length === 1) {
      req.trail!.created = 3;
      return Promise.reject(new StoreUnavailableError("a later step failed"));
    }
    return Promise.resolve({ id: 3, created: false, version: "7" });
  };
  assert.deepEqual(await a.acquire("k;", never), { id: 3, created: true, version: "7" });
  assert.equal(trails.length, 2);
  assert.equal(trails[0], trails[1], "the attempts of one call share a trail");
  // The next call has a trail of its own: joining the master is no creation.
  assert.deepEqual(await a.acquire("k;", never), { id: 3, created: false, version: "7" });
  assert.notEqual(trails[2], trails[1]);
});
