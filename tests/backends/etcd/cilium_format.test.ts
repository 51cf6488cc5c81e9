/**
 * Interoperability with Cilium's Go allocator, proven on raw bytes: a store written in Cilium's
 * exact format (by the etcd3 client here, as `kvstoreBackend` writes it) is read correctly through
 * the session, and what the session writes is what Cilium's code paths read.
 */
import assert from "node:assert/strict";
import { CILIUM_IDENTITIES_PREFIX } from "../../../src/backends/etcd/mod.ts";
import { KeyLockedError } from "../../../src/errors.ts";
import { goJoin, prefixMatchesKey } from "../../../src/backends/etcd/layout.ts";
import { startEtcd } from "../../../src/backends/etcd/testing/cluster.ts";
import { b } from "../../../src/backends/etcd/testing/fixture.ts";
import {
  deadline,
  etcdTest,
  listUntilSynced,
  namespace,
  openSession,
  picker,
  plain,
  requestsDuring,
  withLease,
} from "./_helpers.ts";
import type { Etcd3 } from "etcd3";

const FOO = "k8s:app=foo;k8s:io.kubernetes.pod.namespace=default;";
// Cilium's TestAllocator (pkg/identity/cache): a label value with "//", which Go's path.Join cleans in the value path.
const SLASHY = "unspec:blah=%%//!!;unspec:id=foo;unspec:user=anna;";
// A key that is a prefix of another key with "/" after it: the range trap.
const SHORT = "k8s:a=1;";
const LONG = "k8s:a=1;/k8s:b=2;";

/** Cilium's `Get`: ListPrefix(path.Join(valuePrefix, key)), first pair matching exactly, ParseUint. */
async function ciliumGet(raw: Etcd3, base: string, key: string): Promise<number> {
  const prefix = goJoin(base, "value", key);
  const res = await raw.getAll().prefix(prefix).exec();
  for (const kv of res.kvs) {
    if (!prefixMatchesKey(prefix, kv.key.toString())) continue;
    const v = kv.value.toString();
    if (/^[0-9]+$/.test(v)) return Number(v);
  }
  return 0;
}

/** Cilium's `GetByID`: Get(path.Join(idPrefix, id)), nil when missing. */
async function ciliumGetById(raw: Etcd3, base: string, id: number): Promise<string | null> {
  return await raw.get(goJoin(base, "id", String(id))).string();
}

/** Cilium's `keyToID` on a watch event key. */
function ciliumKeyToId(base: string, key: string): number | undefined {
  const idPrefix = goJoin(base, "id");
  if (!key.startsWith(idPrefix)) return undefined;
  let suffix = key.slice(idPrefix.length);
  if (suffix.startsWith("/")) suffix = suffix.slice(1);
  return /^[0-9]+$/.test(suffix) ? Number(suffix) : undefined;
}

etcdTest("a store written by Cilium's Go allocator is read correctly", async () => {
  // Cilium's default base path on a private etcd, exactly as an agent would find it.
  await using etcd = await startEtcd();
  await using ns = await namespace(etcd, CILIUM_IDENTITIES_PREFIX);
  const base = "cilium/state/identities/v1";
  const { raw } = ns;
  await withLease(raw, 600, async (lease) => {
    // What kvstoreBackend.AllocateID + AcquireReference write (master: no lease; slave: leased).
    await raw.kv.put({ key: b(`${base}/id/40905`), value: b(FOO) });
    await raw.kv.put({ key: b(`${base}/value/${FOO}/172.0.124.60`), value: b("40905"), lease });
    await raw.kv.put({ key: b(`${base}/id/40906`), value: b(SLASHY) });
    await raw.kv.put({
      key: b(`${base}/value/unspec:blah=%%/!!;unspec:id=foo;unspec:user=anna;/172.0.124.60`),
      value: b("40906"),
      lease,
    });
    await raw.kv.put({ key: b(`${base}/id/40907`), value: b(LONG) });
    await raw.kv.put({ key: b(`${base}/value/${LONG}/172.0.124.61`), value: b("40907"), lease });
    // An allocation lock and Cilium's GC lock, as concurrency.Mutex leaves them: not masters.
    await raw.kv.put({ key: b(`${base}/locks/${FOO}/694d7a1b2c3d4e5f`), value: b(""), lease });
    await raw.kv.put({ key: b(`${base}/locks/id/40905/694d7a1b2c3d4e60`), value: b(""), lease });

    const backend = await ns.backend("10.0.0.1");
    await using session = await openSession(backend);
    const signal = deadline();

    const listed = await listUntilSynced(session, signal);
    assert.deepEqual(plain(listed), [
      { type: "upsert", id: 40905, key: FOO },
      { type: "upsert", id: 40906, key: SLASHY },
      { type: "upsert", id: 40907, key: LONG },
      { type: "synced" },
    ]);
    assert.equal(await session.get(FOO, signal), 40905);
    assert.equal(await session.get(SLASHY, signal), 40906);
    assert.equal(await session.get(LONG, signal), 40907);
    assert.equal(await session.get(SHORT, signal), undefined, "no false prefix match through '/'");
    assert.equal(await session.getById(40905, signal), FOO);
    assert.equal(await session.getById(40906, signal), SLASHY);

    // While Cilium's mutexes are held, nothing is written; they go away with Cilium's unlock.
    await assert.rejects(
      session.acquire({ key: FOO, pickCandidate: picker(100), signal }),
      (e) =>
        e instanceof KeyLockedError && e.retryable &&
        e.locks.join() === `${base}/locks/${FOO}/694d7a1b2c3d4e5f`,
    );
    await raw.delete().prefix(`${base}/locks/`);
    // Joining the Cilium-allocated ID without a hint: found through the references.
    const joined = await session.acquire({ key: FOO, pickCandidate: picker(100), signal });
    assert.deepEqual({ id: joined.id, created: joined.created }, { id: 40905, created: false });
    const slashy = await session.acquire({ key: SLASHY, pickCandidate: picker(101), signal });
    assert.equal(slashy.id, 40906);
    const refs = (await ns.dump()).filter((kv) => kv.key.endsWith("/10.0.0.1"));
    assert.deepEqual(refs.map((kv) => [kv.key, kv.value]), [
      [`${base}/value/${FOO}/10.0.0.1`, "40905"],
      [`${base}/value/unspec:blah=%%/!!;unspec:id=foo;unspec:user=anna;/10.0.0.1`, "40906"],
    ]);

    const gc = [];
    for await (const c of session.gcList({ min: 1, max: 65535 }, signal)) gc.push(c);
    assert.deepEqual(gc.map((c) => [c.id, c.inUse]), [[40905, true], [40906, true], [40907, true]]);
  });
});

etcdTest("what the session writes is byte for byte what Cilium reads", async () => {
  await using ns = await namespace();
  const base = ns.prefix;
  const backend = await ns.backend("172.0.124.60");
  await using session = await openSession(backend);
  const signal = deadline();

  const { result: r, requests } = await requestsDuring(
    backend,
    () => session.acquire({ key: FOO, pickCandidate: picker(40905), signal }),
  );
  assert.deepEqual({ id: r.id, created: r.created }, { id: 40905, created: true });
  assert.equal(requests, 1, "a new key is one transaction");
  const s = await session.acquire({ key: SLASHY, pickCandidate: picker(40906), signal });
  assert.equal(s.id, 40906);

  const kvs = await ns.dump();
  const byKey = new Map(kvs.map((kv) => [kv.key, kv]));
  // Master: the raw key as value, no lease (Cilium: CreateOnly(..., lease=false)).
  const master = byKey.get(`${base}/id/40905`);
  assert.equal(master?.value, FOO);
  assert.equal(master?.lease, "0");
  assert.equal(byKey.get(`${base}/id/40906`)?.value, SLASHY, "master keeps '//' in its value");
  // Reference: path.Join(valuePrefix, key, node) → decimal ID, on a lease.
  const ref = byKey.get(`${base}/value/${FOO}/172.0.124.60`);
  assert.equal(ref?.value, "40905");
  assert.notEqual(ref?.lease, "0");
  const slashyRef = byKey.get(
    `${base}/value/unspec:blah=%%/!!;unspec:id=foo;unspec:user=anna;/172.0.124.60`,
  );
  assert.equal(slashyRef?.value, "40906", "reference path cleaned exactly as Go's path.Join does");
  assert.equal(kvs.length, 4, "nothing else written (no locks, no index)");
  // Besides them, the session's presence key (`<prefix>/nodes/<node>`), which Cilium never reads.
  assert.deepEqual((await ns.nodes()).map((kv) => kv.key), [`${base}/nodes/172.0.124.60`]);

  // Cilium's read paths find exactly that.
  assert.equal(await ciliumGet(ns.raw, base, FOO), 40905);
  assert.equal(await ciliumGet(ns.raw, base, SLASHY), 40906);
  assert.equal(await ciliumGetById(ns.raw, base, 40905), FOO);
  assert.equal(ciliumKeyToId(base, `${base}/id/40905`), 40905);
  // Cilium's GC (hasUsers = any exact pair) sees both IDs in use.
  for (const key of [FOO, SLASHY]) {
    const prefix = goJoin(base, "value", key);
    const pairs = await ns.raw.getAll().prefix(prefix).keys();
    assert.ok(pairs.some((k) => prefixMatchesKey(prefix, k)), `Cilium GC sees users of ${key}`);
  }
});

etcdTest("Cilium and idalloc nodes share keys both ways", async () => {
  await using ns = await namespace();
  const base = ns.prefix;
  await withLease(ns.raw, 600, async (lease) => {
    const backend = await ns.backend("10.0.0.2");
    await using session = await openSession(backend);
    const signal = deadline();
    // idalloc allocates; a Cilium agent then acquires a reference the way it does (GetIfLocked →
    // AcquireReference = UpdateIfDifferent of its own slave key).
    const mine = await session.acquire({ key: LONG, pickCandidate: picker(300), signal });
    const ciliumSees = await ciliumGet(ns.raw, base, LONG);
    assert.equal(ciliumSees, mine.id);
    await ns.raw.kv.put({
      key: b(`${base}/value/${LONG}/10.0.0.9`),
      value: b(String(ciliumSees)),
      lease,
    });
    // The short key whose reference range holds LONG's references: Cilium's Get says 0, so
    // Cilium would allocate it; idalloc must too, without a false match and without looping.
    assert.equal(await ciliumGet(ns.raw, base, SHORT), 0);
    const short = await session.acquire({ key: SHORT, pickCandidate: picker(300, 301), signal });
    assert.deepEqual({ id: short.id, created: short.created }, { id: 301, created: true });
    assert.equal(await ciliumGet(ns.raw, base, SHORT), 301);
    assert.equal(await ciliumGet(ns.raw, base, LONG), 300);
  });
});
