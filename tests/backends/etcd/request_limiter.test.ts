/** The etcd request rate limiter (Cilium's `etcd.qps` token bucket) on a virtual clock. */
import assert from "node:assert/strict";
import { type LimiterClock, RequestLimiter } from "../../../src/backends/etcd/request_limiter.ts";

/** A clock whose sleeps advance virtual time instead of waiting. */
function virtualClock(): LimiterClock & { t: number } {
  const clock = {
    t: 0,
    now: () => clock.t,
    sleep: (ms: number) => {
      clock.t += ms;
      return Promise.resolve();
    },
  };
  return clock;
}

Deno.test("rate limiter: 10 requests at qps 4 need more than 1 s (virtual clock)", async () => {
  const clock = virtualClock();
  const limiter = new RequestLimiter(4, clock);
  for (let i = 0; i < 10; i++) await limiter.take();
  // Burst 4 goes at once; the other 6 come at 250 ms intervals.
  assert.ok(clock.t > 1000, `virtual time ${clock.t}`);
  assert.equal(limiter.stats().taken, 10);
  assert.equal(limiter.stats().delayed, 6);
});

Deno.test("rate limiter: at qps 100 the same 10 requests do not wait", async () => {
  const clock = virtualClock();
  const limiter = new RequestLimiter(100, clock);
  for (let i = 0; i < 10; i++) await limiter.take();
  assert.equal(clock.t, 0);
  assert.equal(limiter.stats().delayed, 0);
});

Deno.test("rate limiter: concurrent takers queue behind each other; tokens refill over time", async () => {
  const waits: number[] = [];
  const clock: LimiterClock = {
    now: () => 0,
    sleep: (ms) => {
      waits.push(ms);
      return Promise.resolve();
    },
  };
  const limiter = new RequestLimiter(2, clock);
  await Promise.all(Array.from({ length: 5 }, () => limiter.take()));
  assert.deepEqual(waits, [500, 1000, 1500]);
});

Deno.test("rate limiter: an aborted wait rejects with the reason and returns its token", async () => {
  const waits: number[] = [];
  const clock: LimiterClock = {
    now: () => 0,
    sleep: (ms, signal) => {
      waits.push(ms);
      return new Promise((_resolve, reject) => {
        if (signal?.aborted) return reject(signal.reason);
        signal?.addEventListener("abort", () => reject(signal.reason), { once: true });
        if (!signal) reject(new Error("test clock: this wait is never released"));
      });
    },
  };
  const limiter = new RequestLimiter(1, clock);
  await limiter.take();
  const pre = new AbortController();
  pre.abort(new DOMException("stop", "AbortError"));
  await assert.rejects(limiter.take(pre.signal), { name: "AbortError" });
  const ac = new AbortController();
  const reason = new Error("mine");
  const p = limiter.take(ac.signal);
  ac.abort(reason);
  await assert.rejects(p, (e) => e === reason);
  // The abandoned token went back: the next taker waits one interval, not two.
  const ac2 = new AbortController();
  const p2 = limiter.take(ac2.signal);
  ac2.abort(reason);
  await assert.rejects(p2, (e) => e === reason);
  assert.deepEqual(waits, [1000, 1000]);
});
