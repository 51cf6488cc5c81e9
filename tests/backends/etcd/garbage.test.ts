/**
 * Garbage in etcd (issue 13): GC never stops on one bad entry (a 1.4 MB master, a value that is not
 * UTF-8, a key Go's path cleaning moves, an entry or a reference range over the response limit),
 * paged lists step over an entry that alone exceeds the limit, and the damage report with its
 * guarded removal.
 */
import assert from "node:assert/strict";
import { Buffer } from "node:buffer";
import type { GcCandidate } from "../../../src/allocator/backend.ts";
import type { DamageFinding, GcSkip } from "../../../src/allocator/damage.ts";
import { LiveEntryError } from "../../../src/errors.ts";
import { TxnBatcher } from "../../../src/backends/etcd/batch.ts";
import { EtcdClient } from "../../../src/backends/etcd/client.ts";
import type { EtcdContext } from "../../../src/backends/etcd/context.ts";
import { gcList } from "../../../src/backends/etcd/gc.ts";
import { resolveEtcdOptions } from "../../../src/backends/etcd/options.ts";
import { rangePages } from "../../../src/backends/etcd/paging.ts";
import { RequestLimiter } from "../../../src/backends/etcd/request_limiter.ts";
import { prefixRange, text } from "../../../src/backends/etcd/txn.ts";
import {
  deadline,
  etcdTest,
  listUntilSynced,
  type Namespace,
  namespace,
  openSession,
  picker,
  withLease,
} from "./_helpers.ts";

/** A GC context on `ns` with its own client (receive limit `maxResponseBytes`). */
function gcContext(ns: Namespace, maxResponseBytes?: number): EtcdContext & AsyncDisposable {
  const settings = resolveEtcdOptions({ endpoints: [...ns.endpoints], node: "gc" });
  const client = new EtcdClient(settings, new RequestLimiter(undefined), { maxResponseBytes });
  return {
    client,
    layout: ns.layout,
    node: "gc",
    // GC reads and deletes; it never takes a lease.
    leases: undefined as never,
    ciliumLocks: true,
    txns: new TxnBatcher(client, new AbortController().signal),
    [Symbol.asyncDispose]: () => client.close(),
  };
}

async function pass(
  ctx: EtcdContext,
  max = 1000,
): Promise<{ candidates: GcCandidate[]; skipped: GcSkip[] }> {
  const candidates: GcCandidate[] = [];
  const skipped: GcSkip[] = [];
  const onSkip = (s: GcSkip) => void skipped.push(s);
  for await (const c of gcList(ctx, { min: 1, max }, deadline(30_000), { onSkip })) {
    candidates.push(c);
  }
  return { candidates, skipped };
}

etcdTest(
  "etcd garbage: GC skips and reports masters it cannot judge, and judges the rest",
  async () => {
    await using ns = await namespace();
    const a = await ns.backend("a");
    await using sa = await openSession(a);
    const signal = deadline();
    await sa.acquire({ key: "used;", pickCandidate: picker(10), signal });
    await sa.acquire({ key: "idle;", pickCandidate: picker(11), signal });
    await sa.release("idle;", 11, signal);
    await ns.raw.put(ns.layout.masterKey(5)).value("k".repeat(1_400_000));
    await ns.raw.put(ns.layout.masterKey(6)).value(Buffer.from([0xff, 0xfe]));
    await ns.raw.put(ns.layout.masterKey(7)).value("../id/10");
    await ns.raw.put(ns.layout.masterKey(8)).value("");
    await ns.raw.put(`${ns.layout.masterRange}eight`).value("x;");
    await using ctx = gcContext(ns);
    const { candidates, skipped } = await pass(ctx);
    assert.deepEqual(candidates.map((c) => [c.id, c.key, c.inUse]), [
      [10, "used;", true],
      [11, "idle;", false],
    ]);
    assert.deepEqual(skipped.map((s) => s.kind).sort(), [
      "master-bad-id",
      "master-empty",
      "master-oversized",
      "master-oversized",
      "master-undecodable",
    ]);
    assert.ok(skipped.every((s) => s.entry.length < 400 && s.reason.length < 400));
    // Through a session too: the pass does not throw, and collects the idle ID.
    for (let round = 0; round < 2; round++) {
      for await (const c of sa.gcList({ min: 1, max: 1000 }, signal)) {
        if (!c.inUse && round === 1) assert.equal(await sa.gcDelete(c, signal), true);
      }
    }
    assert.equal(await ns.raw.get(ns.layout.masterKey(11)).string(), null);
    // The watch skips the master that is not UTF-8 instead of inventing a key for it.
    await using reader = await openSession(a, { readOnly: true });
    const listed = await listUntilSynced(reader, signal);
    const ids = listed.flatMap((e) => e.type === "upsert" ? [e.id] : []);
    assert.ok(!ids.includes(6) && !ids.includes(8), `${ids}`);
  },
);

etcdTest(
  "etcd garbage: entries and reference ranges over the response limit are stepped over",
  async () => {
    await using ns = await namespace();
    const a = await ns.backend("a");
    await using sa = await openSession(a);
    const signal = deadline();
    await sa.acquire({ key: "a;", pickCandidate: picker(1), signal });
    await sa.release("a;", 1, signal);
    await ns.raw.put(ns.layout.masterKey(2)).value("b;".padEnd(300_000, "b"));
    await sa.acquire({ key: "c;", pickCandidate: picker(3), signal });
    await sa.release("c;", 3, signal);
    await sa.acquire({ key: "d;", pickCandidate: picker(4), signal });
    // Key "d;" has a reference range over the limit: a huge foreign reference under it.
    await ns.raw.put(ns.layout.refKey("d;", "junk")).value("9".repeat(300_000));
    await using ctx = gcContext(ns, 256 * 1024);

    const pages = [];
    for await (
      const p of rangePages(ctx.client, "t", prefixRange(ns.layout.masterRange), signal)
    ) {
      pages.push(p);
    }
    assert.deepEqual(pages.flatMap((p) => p.tooLarge.map((kv) => text(kv.key))), [
      ns.layout.masterKey(2),
    ]);
    const listed = pages.flatMap((p) => p.kvs.map((kv) => text(kv.key)));
    assert.deepEqual(listed, [1, 3, 4].map((id) => ns.layout.masterKey(id)), "the rest in order");

    const { candidates, skipped } = await pass(ctx);
    assert.deepEqual(candidates.map((c) => [c.id, c.inUse]), [[1, false], [3, false]]);
    assert.deepEqual(skipped.map((s) => [s.kind, s.entry]), [
      ["master-oversized", ns.layout.masterKey(2)],
      ["master-oversized", ns.layout.masterKey(4)],
    ]);
  },
);

etcdTest(
  "etcd garbage: the damage report lists bad references; removal is guarded, never of a leased one",
  async () => {
    await using ns = await namespace();
    const a = await ns.backend("a");
    await using sa = await openSession(a);
    const signal = deadline();
    await sa.acquire({ key: "ok;", pickCandidate: picker(10), signal });
    await ns.raw.put(ns.layout.refKey("ok;", "no-lease")).value("10");
    await ns.raw.put(ns.layout.refKey("bad;", "n")).value("ten");
    await ns.raw.put(`${ns.layout.valuePrefix}/`).value("10");
    await withLease(ns.raw, 60, async (lease) => {
      await ns.raw.put(ns.layout.refKey("far;", "n")).value("70000").lease(lease).exec();
      // A key that is not UTF-8 is removable too (raw bytes, not text, in the token).
      await ns.raw.put(Buffer.concat([Buffer.from(ns.layout.masterRange), Buffer.from([0xff])]))
        .value("x;");
      const found: DamageFinding[] = [];
      for await (const f of a.findDamage({ range: { min: 1, max: 1000 } })) found.push(f);
      assert.deepEqual(found.map((f) => [f.kind, f.key ?? null]).sort(), [
        ["master-bad-id", null],
        ["reference-bad-key", null],
        ["reference-out-of-range", "far;"],
        ["reference-undecodable", "bad;"],
        ["reference-without-lease", "ok;"],
      ]);
      // The out-of-range reference sits on a live lease: held by its node, never deleted.
      const far = found.find((f) => f.kind === "reference-out-of-range")!;
      assert.deepEqual(far.heldBy, ["n"]);
      assert.deepEqual(found.filter((f) => f.heldBy !== undefined), [far]);
      await assert.rejects(
        a.removeDamage(far),
        (e) => e instanceof LiveEntryError && e.holders.join() === "n",
      );
      const noLease = found.find((f) => f.kind === "reference-without-lease")!;
      // Rewritten since the listing: kept.
      await ns.raw.put(ns.layout.refKey("ok;", "no-lease")).value("10");
      assert.equal(await a.removeDamage(noLease), false);
      for (const f of found) {
        if (f !== noLease && f !== far) assert.equal(await a.removeDamage(f), true, f.entry);
      }
      const again: DamageFinding[] = [];
      for await (const f of a.findDamage({ range: { min: 1, max: 1000 } })) again.push(f);
      assert.deepEqual(again.map((f) => f.kind).sort(), [
        "reference-out-of-range",
        "reference-without-lease",
      ]);
      assert.equal(await a.removeDamage(again.find((f) => f !== far && !f.heldBy)!), true);
    });
    // The node's own live reference and master are untouched.
    const left = (await ns.dump()).map((kv) => kv.key);
    assert.deepEqual(left, [ns.layout.masterKey(10), ns.layout.refKey("ok;", "a")]);
  },
);

etcdTest(
  "etcd admin: deleteReference deletes a lease-less reference, never a leased one",
  async () => {
    await using ns = await namespace();
    const a = await ns.backend("a");
    await using sa = await openSession(a);
    await sa.acquire({ key: "held;", pickCandidate: picker(10), signal: deadline() });
    await ns.raw.put(ns.layout.refKey("held;", "by-hand")).value("10");
    const admin = a.admin();
    await assert.rejects(
      admin.deleteReference("held;", "a", deadline()),
      (e) => e instanceof LiveEntryError && e.holders.join() === "a" && /on lease/.test(e.entry),
    );
    assert.equal(await admin.deleteReference("held;", "by-hand", deadline()), true);
    assert.equal(await admin.deleteReference("held;", "by-hand", deadline()), false);
    assert.deepEqual((await ns.dump()).map((kv) => kv.key), [
      ns.layout.masterKey(10),
      ns.layout.refKey("held;", "a"),
    ]);
  },
);
