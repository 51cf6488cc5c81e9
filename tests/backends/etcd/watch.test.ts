/**
 * List-and-watch of the masters (paging itself: paging.test.ts): list at one revision, `synced` once, live events,
 * corrupt entries skipped, re-list with deletes after compaction.
 */
import assert from "node:assert/strict";
import { configure, type LogRecord, reset } from "@logtape/logtape";
import type { BackendEvent } from "../../../src/allocator/backend.ts";
import { startEtcd } from "../../../src/backends/etcd/testing/cluster.ts";
import { deadline, etcdTest, namespace, openSession, picker, plain } from "./_helpers.ts";

/** Pulls events from `it` until `pred` holds for one of them; returns everything pulled. */
async function pullUntil(
  it: AsyncIterator<BackendEvent>,
  pred: (e: BackendEvent) => boolean,
): Promise<BackendEvent[]> {
  const out: BackendEvent[] = [];
  for (;;) {
    const { value, done } = await it.next();
    if (done) assert.fail(`watch ended early after ${JSON.stringify(out)}`);
    out.push(value);
    if (pred(value)) return out;
  }
}

etcdTest("list, synced once, then live upserts and deletes; corrupt entries skipped", async () => {
  const records: LogRecord[] = [];
  await configure({
    sinks: { buf: (r) => records.push(r) },
    loggers: [
      { category: ["idalloc", "etcd"], lowestLevel: "warning", sinks: ["buf"] },
      { category: ["logtape", "meta"], lowestLevel: "error", sinks: [] },
    ],
  });
  await using _resetLogs = { [Symbol.asyncDispose]: () => reset() };
  await using ns = await namespace();
  const a = await ns.backend("a");
  await using sa = await openSession(a);
  const signal = deadline();
  await sa.acquire({ key: "k1;", pickCandidate: picker(1), signal });
  await ns.raw.put(`${ns.layout.masterRange}not-a-number`).value("x;");
  await ns.raw.put(ns.layout.masterKey(99)).value("");
  await ns.raw.put(`${ns.prefix}/locks/k1;/abc`).value("");

  const ac = new AbortController();
  const it = sa.watch(AbortSignal.any([ac.signal, signal]))[Symbol.asyncIterator]();
  try {
    const listed = await pullUntil(it, (e) => e.type === "synced");
    assert.deepEqual(plain(listed), [{ type: "upsert", id: 1, key: "k1;" }, { type: "synced" }]);
    await sa.acquire({ key: "k2;", pickCandidate: picker(2), signal });
    await ns.raw.put(ns.layout.masterKey(98)).value(""); // corrupt, live: skipped
    await ns.raw.delete().key(ns.layout.masterKey(1));
    const events = await pullUntil(it, (e) => e.type === "delete");
    assert.deepEqual(plain(events), [{ type: "upsert", id: 2, key: "k2;" }, {
      type: "delete",
      id: 1,
    }]);
    const up = events[0];
    assert.ok(up.type === "upsert" && /^[0-9]+$/.test(up.version), "version is the mod revision");
    // Each corrupt master was logged under ["idalloc", "etcd"] with its key.
    const logged = records.filter((r) => r.category.join(".") === "idalloc.etcd")
      .map((r) => String(r.properties.etcdKey));
    for (
      const bad of [
        `${ns.layout.masterRange}not-a-number`,
        ns.layout.masterKey(99),
        ns.layout.masterKey(98),
      ]
    ) {
      assert.ok(logged.includes(bad), `${bad} logged`);
    }
  } finally {
    ac.abort();
    await it.return?.();
  }
});

etcdTest("compaction while away: re-list reports what vanished and what appeared", async () => {
  await using etcd = await startEtcd();
  await using ns = await namespace(etcd);
  const a = await ns.backend("a");
  await using sa = await openSession(a);
  const signal = deadline();
  await sa.acquire({ key: "stay;", pickCandidate: picker(1), signal });
  await sa.acquire({ key: "gone;", pickCandidate: picker(2), signal });

  const ac = new AbortController();
  const it = sa.watch(AbortSignal.any([ac.signal, signal]))[Symbol.asyncIterator]();
  try {
    const listed = await pullUntil(it, (e) => e.type === "synced");
    assert.equal(listed.length, 3);
    // The generator is suspended at `synced`: its watch starts only on the next pull. Change the
    // store and compact the history it would need to catch up from.
    await ns.raw.delete().key(ns.layout.masterKey(2));
    await ns.raw.put(ns.layout.masterKey(3)).value("new;");
    await etcd.compact();
    const after = await pullUntil(it, (e) => e.type === "delete");
    assert.deepEqual(plain(after), [{ type: "upsert", id: 3, key: "new;" }, {
      type: "delete",
      id: 2,
    }]);
    // And the watch goes on live after the re-list, without a second `synced`.
    await sa.acquire({ key: "later;", pickCandidate: picker(4), signal });
    const live = await pullUntil(it, (e) => e.type === "upsert" && e.id === 4);
    assert.ok(live.every((e) => e.type !== "synced"));
  } finally {
    ac.abort();
    await it.return?.();
  }
});
