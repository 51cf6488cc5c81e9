/**
 * Connection loss and recovery, connect checks, the request rate limit and status.
 */
import assert from "node:assert/strict";
import { Allocator } from "../../../mod.ts";
import type { BackendEvent } from "../../../src/allocator/backend.ts";
import { EtcdBackend } from "../../../src/backends/etcd/mod.ts";
import { IdallocError, StoreUnavailableError } from "../../../src/errors.ts";
import { freePort, startEtcd } from "../../../src/backends/etcd/testing/cluster.ts";
import { deadline, etcdTest, eventually, namespace, openSession, picker } from "./_helpers.ts";

etcdTest("connect: nothing listening → StoreUnavailableError within dialTimeoutMs", async () => {
  const port = await freePort();
  // A refused connection has its own class, a retryable StoreUnavailableError
  // (connect_errors.test.ts covers every such failure).
  await assert.rejects(
    EtcdBackend.connect({ endpoints: [`http://127.0.0.1:${port}`], node: "a", dialTimeoutMs: 300 }),
    (e) =>
      e instanceof StoreUnavailableError && e.retryable && e.name === "StoreConnectionRefusedError",
  );
});

etcdTest(
  "etcd down: typed retryable errors within the deadline; back up: everything resumes",
  async () => {
    await using etcd = await startEtcd();
    await using ns = await namespace(etcd);
    const backend = await ns.backend("a", { requestTimeoutMs: 800 });
    await using alloc = await Allocator.open(backend, {
      min: 1,
      max: 1000,
      leaseTtlMs: 2_000,
      maxAttempts: 3,
      backoff: { initialMs: 10, maxMs: 50, factor: 2 },
    });
    const before = await alloc.allocate("before;");
    const reader = await ns.backend("reader", { requestTimeoutMs: 800 });
    await using session = await openSession(reader, { readOnly: true });
    const ac = new AbortController();
    const it = session.watch(ac.signal)[Symbol.asyncIterator]();
    const pull = async (pred: (e: BackendEvent) => boolean) => {
      for (;;) {
        const { value, done } = await it.next();
        assert.ok(!done, "watch ended");
        if (pred(value)) return value;
      }
    };
    try {
      await pull((e) => e.type === "synced");

      await etcd.kill(0);
      // A call fails with the store's typed error, retryable, not later than its request timeout…
      await assert.rejects(
        session.getById(before.id, deadline(5_000)),
        (e) => e instanceof StoreUnavailableError && e.retryable,
      );
      // …and with the caller's own reason when the caller's deadline is shorter.
      const short = AbortSignal.timeout(100);
      await assert.rejects(session.get("before;", short), (e) => e === short.reason);
      await assert.rejects(
        alloc.allocate("during;", { signal: deadline(5_000) }),
        (e) => e instanceof IdallocError,
      );
      await eventually(() => !session.status().healthy, "status reports unhealthy");
      assert.ok(session.status().lastError);

      await etcd.restart(0);
      // Written right after the restart, likely before the watch is back: resuming from the last
      // revision seen still delivers it.
      await ns.raw.put(ns.layout.masterKey(777)).value("while-reconnecting;");
      const seen = await pull((e) => e.type === "upsert" && e.id === 777);
      assert.deepEqual(seen.type === "upsert" && seen.key, "while-reconnecting;");

      let after: { id: number } | undefined;
      await eventually(async () => {
        after = await alloc.allocate("after;", { signal: deadline(3_000) }).catch(() => undefined);
        return after !== undefined;
      }, "allocation works again");
      assert.equal((await alloc.allocate("before;")).id, before.id, "IDs survive the outage");
      assert.notEqual(after!.id, before.id);
      await eventually(() => session.status().healthy, "status reports healthy again");
    } finally {
      ac.abort();
      await it.return?.();
    }
  },
);

etcdTest(
  "qps: every request takes a token; 10 reads at qps 4 wait, at qps 1000 they don't",
  async () => {
    await using ns = await namespace();
    const slow = await ns.backend("slow", { qps: 4 });
    const fast = await ns.backend("fast", { qps: 1000 });
    const signal = deadline();
    await using s1 = await openSession(slow, { readOnly: true });
    await using s2 = await openSession(fast, { readOnly: true });
    const base = slow.requestStats();
    await Promise.all(Array.from({ length: 10 }, (_, i) => s1.getById(i + 1, signal)));
    const after = slow.requestStats();
    assert.equal(after.qps, 4);
    assert.ok(after.taken - base.taken >= 10);
    // The burst (4) was spent by connect and open; the reads themselves had to wait.
    assert.ok(after.delayed - base.delayed >= 6, `delayed ${after.delayed - base.delayed}`);
    const fb = fast.requestStats();
    await Promise.all(Array.from({ length: 10 }, (_, i) => s2.getById(i + 1, signal)));
    assert.equal(fast.requestStats().delayed - fb.delayed, 0);
  },
);

etcdTest("status: endpoints, leader, leases, health", async () => {
  await using ns = await namespace();
  const a = await ns.backend("a");
  await using sa = await openSession(a);
  await sa.acquire({ key: "k;", pickCandidate: picker(1), signal: deadline() });
  await eventually(() => sa.status().leader !== undefined, "the leader is known");
  const st = sa.status();
  assert.equal(st.backend, "etcd");
  assert.equal(st.node, "a");
  assert.deepEqual(st.endpoints, ns.endpoints);
  assert.match(st.leader!, /^m0 \([0-9]+\)$/);
  assert.equal(st.leases, 1);
  assert.ok(st.leaseExpiresAt! > Date.now());
  assert.equal(st.healthy, true);
  await sa.close();
  assert.equal(sa.status().healthy, false);
  await assert.rejects(sa.get("k;", deadline()), { name: "ClosedError" });
});

etcdTest(
  "sessions opened one after another on one backend each sync with one list request",
  async () => {
    // Closing a session cancels its watch and keepalive streams. That used to count as a failure
    // of the member (etcd3's markFailed): the member was skipped for a second and the next
    // session's initial list was retried until then (seven requests, ~1.3 s).
    await using ns = await namespace();
    const backend = await ns.backend("a");
    const lists = () => backend.requestStats().operations["list masters"] ?? 0;
    for (let round = 0; round < 3; round++) {
      const before = lists();
      // Each round is node a restarting: the last round's lease still carries its key.
      const alloc = await Allocator.open(backend, {
        min: 1,
        max: 1000,
        leaseTtlMs: 2_000,
        restart: true,
      });
      try {
        await alloc.waitForInitialSync();
        assert.equal(lists() - before, 1, `round ${round}: the initial list was not retried`);
        assert.equal(alloc.status().session.lastError, undefined, `round ${round}: no failure`);
        const { isNew } = await alloc.allocate(`k${round};`);
        assert.equal(isNew, true);
      } finally {
        await alloc.close();
      }
    }
  },
);
