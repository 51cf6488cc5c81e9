// The double-write backend on a real etcd and a real kube-apiserver (the repository's harnesses):
// both modes write both sides under one ID, read the side they name, keep the store invariants
// of the conformance suite on each side, refuse to diverge from drift another writer made, and
// GC only what both sides judge unused.
import assert from "node:assert/strict";
import { Allocator } from "../../../mod.ts";
import type { Backend } from "../../../src/allocator/backend.ts";
import {
  DoubleWriteBackend,
  type DoubleWriteMode,
  identityDrift,
} from "../../../src/backends/doublewrite/mod.ts";
import { etcdFactory } from "../../../src/backends/etcd/testing/fixture.ts";
import { k8sFactory } from "../../../src/backends/k8s/testing/fixture.ts";
import type { StoreFixture } from "../../../src/testing/fixture.ts";
import { assertStoreInvariants, FAST, keys } from "../../conformance/_helpers.ts";

/** Registers a test that needs both servers; skipped loudly (by the factories) without either. */
function bothTest(name: string, fn: () => Promise<void>): void {
  const ignore = etcdFactory.unavailable !== undefined || k8sFactory.unavailable !== undefined;
  Deno.test({ name, ignore, fn });
}

/** A double-write store: a fresh etcd prefix and a fresh identity resource and namespace. */
interface World extends AsyncDisposable {
  readonly kvstore: StoreFixture;
  readonly crd: StoreFixture;
  backend(node: string, mode: DoubleWriteMode): Promise<DoubleWriteBackend>;
  open(node: string, mode: DoubleWriteMode, gcGraceMs?: number): Promise<Allocator>;
}

async function world(): Promise<World> {
  const kvstore = await etcdFactory.create();
  const crd = await k8sFactory.create();
  const allocators: Allocator[] = [];
  const sides = new Map<string, { kvstore: Backend; crd: Backend }>();
  const w: World = {
    kvstore,
    crd,
    async backend(node, mode) {
      let pair = sides.get(node);
      if (pair === undefined) {
        pair = {
          kvstore: await kvstore.backend(node, { fast: true }),
          crd: await crd.backend(node, { fast: true }),
        };
        sides.set(node, pair);
      }
      return new DoubleWriteBackend({ mode, ...pair });
    },
    async open(node, mode, gcGraceMs = 0) {
      const alloc = await Allocator.open(await w.backend(node, mode), {
        ...FAST,
        min: 256,
        max: 65535,
        gcGraceMs,
      });
      allocators.push(alloc);
      return alloc;
    },
    async [Symbol.asyncDispose]() {
      await Promise.allSettled(allocators.map((a) => a.close()));
      await crd[Symbol.asyncDispose]();
      await kvstore[Symbol.asyncDispose]();
    },
  };
  return w;
}

/** Both sides agree: the same ID → key on each, and each side's own invariants hold. */
async function assertSidesAgree(w: World, expected: ReadonlyMap<string, number>): Promise<void> {
  await assertStoreInvariants(w.kvstore);
  await assertStoreInvariants(w.crd);
  const kv = await w.kvstore.masters();
  const crd = await w.crd.masters();
  for (const [key, id] of expected) {
    assert.equal(kv.get(id), key, `kvstore id/${id}`);
    assert.equal(crd.get(id), key, `CiliumIdentity ${id}`);
  }
}

for (const mode of ["doublewrite-readkvstore", "doublewrite-readcrd"] as const) {
  bothTest(`${mode}: new keys land on both sides under one ID, every node reads it`, async () => {
    await using w = await world();
    const a = await w.open("a", mode);
    const b = await w.open("b", mode === "doublewrite-readcrd" ? "doublewrite-readkvstore" : mode);
    const ids = new Map<string, number>();
    const names = keys(20, "dw");
    // Two nodes racing on the same keys (one of each mode where the modes differ).
    const [ra, rb] = await Promise.all([
      Promise.all(names.map((k) => a.allocate(k))),
      Promise.all(names.map((k) => b.allocate(k))),
    ]);
    names.forEach((k, i) => {
      assert.equal(ra[i].id, rb[i].id, `${k}: a and b agree`);
      ids.set(k, ra[i].id);
    });
    assert.equal(new Set(ids.values()).size, 20, "20 distinct IDs");
    // Exactly one node reports each key new: the one that created its CRD identity.
    names.forEach((k, i) => {
      assert.equal(
        Number(ra[i].isNew) + Number(rb[i].isNew),
        1,
        `${k}: one creator (a ${ra[i].isNew}, b ${rb[i].isNew})`,
      );
    });
    await assertSidesAgree(w, ids);
    const drift = await identityDrift(await w.backend("reader", mode), AbortSignal.timeout(30_000));
    assert.deepEqual(drift, {
      crd: { total: 20, only: 0 },
      kvstore: { total: 20, only: 0 },
      differing: [],
    });
    console.error(`figures: ${mode}: ${JSON.stringify(drift)}`);
    for (const k of names) assert.equal(await a.getNoCache(k), ids.get(k));
  });
}

bothTest(
  "doublewrite-readkvstore: an etcd-only identity keeps its ID and gets its CRD twin",
  async () => {
    await using w = await world();
    // Before the migration: a kvstore-mode node (the etcd backend alone) holds the key.
    const before = await Allocator.open(await w.kvstore.backend("old", { fast: true }), {
      ...FAST,
      min: 256,
      max: 65535,
    });
    const { id } = await before.allocate("app=legacy;");
    const crdBefore = await w.crd.masters();
    assert.equal(crdBefore.size, 0);
    const dw = await w.open("new", "doublewrite-readkvstore");
    const got = await dw.allocate("app=legacy;");
    assert.equal(got.id, id, "the kvstore's ID stands");
    assert.equal(got.isNew, false);
    await assertSidesAgree(w, new Map([["app=legacy;", id]]));
    await before.close();
  },
);

bothTest(
  "doublewrite-readcrd: a CRD-only identity keeps its ID and gets its kvstore master",
  async () => {
    await using w = await world();
    const before = await Allocator.open(await w.crd.backend("old", { fast: true }), {
      ...FAST,
      min: 256,
      max: 65535,
    });
    const { id } = await before.allocate("app=crd;");
    const dw = await w.open("new", "doublewrite-readcrd");
    const got = await dw.allocate("app=crd;");
    assert.equal(got.id, id);
    await assertSidesAgree(w, new Map([["app=crd;", id]]));
    await before.close();
  },
);

// A node stopped for the move to a double-write mode leaves its references to lapse with its
// lease; the master stays until GC. The restarted node must take that master's ID again (found
// by the cache, as in the kvstore mode), not make a second identity of the key at a new ID.
const LAPSED_CASES = [
  ["doublewrite-readkvstore", "kvstore"],
  ["doublewrite-readkvstore", "both"],
  ["doublewrite-readcrd", "crd"],
  ["doublewrite-readcrd", "both"],
] as const;
for (const [mode, side] of LAPSED_CASES) {
  bothTest(`${mode}: an identity on ${side} nobody references any more keeps its ID`, async () => {
    await using w = await world();
    // Written by a node of the side's own mode, or (both) by one in the other double-write mode.
    const old = side === "both"
      ? await w.backend(
        "old",
        mode === "doublewrite-readcrd" ? "doublewrite-readkvstore" : "doublewrite-readcrd",
      )
      : await (side === "kvstore" ? w.kvstore : w.crd).backend("old", { fast: true });
    const before = await Allocator.open(old, { ...FAST, min: 256, max: 65535 });
    const { id } = await before.allocate("app=lapsed;");
    await before.release("app=lapsed;");
    await before.close();
    for (
      const fixture of side === "both"
        ? [w.kvstore, w.crd]
        : [side === "kvstore" ? w.kvstore : w.crd]
    ) {
      assert.deepEqual(await fixture.references(), [], "the old node's reference is gone");
      assert.equal((await fixture.masters()).get(id), "app=lapsed;", "its master stays until GC");
    }
    const dw = await w.open("new", mode);
    const got = await dw.allocate("app=lapsed;");
    assert.equal(got.id, id, "the unreferenced master's ID stands");
    assert.equal(got.isNew, false);
    await assertSidesAgree(w, new Map([["app=lapsed;", id]]));
    assert.equal((await w.kvstore.masters()).size, 1, "no second kvstore master");
    assert.equal((await w.crd.masters()).size, 1, "no second CRD identity");
  });
}

bothTest(
  "an ID taken by another key on the kvstore only is never given on the CRD side",
  async () => {
    await using w = await world();
    // Drift another writer made: the kvstore holds ID 256..265 for keys the CRDs do not have.
    const kvOnly = await Allocator.open(await w.kvstore.backend("kv-only", { fast: true }), {
      ...FAST,
      min: 256,
      max: 265,
    });
    for (const k of keys(10, "kv")) await kvOnly.allocate(k);
    const dw = await w.open("n", "doublewrite-readcrd");
    await dw.waitForInitialSync();
    // The readcrd node's cache knows only the CRDs; its candidates skip the kvstore's IDs.
    const { id } = await dw.allocate("app=fresh;");
    assert.ok(id > 265, `got ${id}`);
    await assertSidesAgree(w, new Map([["app=fresh;", id]]));
    const drift = await identityDrift(
      await w.backend("reader", "doublewrite-readcrd"),
      AbortSignal.timeout(30_000),
    );
    assert.deepEqual(drift?.kvstore, { total: 11, only: 10 });
    assert.deepEqual(drift?.crd, { total: 1, only: 0 });
    await kvOnly.close();
  },
);

bothTest(
  "a key whose sides disagree is answered by the read side and never rewritten",
  async () => {
    await using w = await world();
    const kv = await Allocator.open(await w.kvstore.backend("kv", { fast: true }), {
      ...FAST,
      min: 300,
      max: 301,
    });
    const crd = await Allocator.open(await w.crd.backend("crd", { fast: true }), {
      ...FAST,
      min: 400,
      max: 401,
    });
    assert.equal((await kv.allocate("app=split;")).id, 300);
    assert.equal((await crd.allocate("app=split;")).id, 400);
    const readKv = await w.open("rk", "doublewrite-readkvstore");
    const readCrd = await w.open("rc", "doublewrite-readcrd");
    assert.equal((await readKv.allocate("app=split;")).id, 300);
    assert.equal((await readCrd.allocate("app=split;")).id, 400);
    // Nothing was written over: each side still has its own one identity of the key.
    assert.deepEqual([...(await w.kvstore.masters())], [[300, "app=split;"]]);
    assert.deepEqual([...(await w.crd.masters())], [[400, "app=split;"]]);
    await kv.close();
    await crd.close();
  },
);

bothTest("GC collects an ID only when both sides find it unused, and deletes both", async () => {
  await using w = await world();
  const holder = await w.open("holder", "doublewrite-readkvstore");
  const gc = await w.open("gc", "doublewrite-readkvstore");
  const held = await holder.allocate("app=held;");
  const freed = await holder.allocate("app=freed;");
  await holder.release("app=freed;");
  await gc.runGc();
  const second = await gc.runGc();
  assert.deepEqual(second.deletedIds, [freed.id]);
  const kv = await w.kvstore.masters();
  const crd = await w.crd.masters();
  assert.equal(kv.has(freed.id), false);
  assert.equal(crd.has(freed.id), false, "the CRD twin went with the master");
  assert.equal(kv.get(held.id), "app=held;");
  assert.equal(crd.get(held.id), "app=held;");
});

// A twin whose delete was refused after its master went, or a CRD-mode node's identity never
// copied: on the CRD side alone. Cilium's operator runs its CRD GC beside the kvstore's in these
// modes; GC collects such an identity when the CRD side finds it unused, and keeps a held one.
for (const mode of ["doublewrite-readkvstore", "doublewrite-readcrd"] as const) {
  bothTest(`${mode}: GC collects an identity on the CRD side alone once unused`, async () => {
    await using w = await world();
    const old = await Allocator.open(await w.crd.backend("old", { fast: true }), {
      ...FAST,
      min: 256,
      max: 65535,
    });
    const held = await old.allocate("app=crd-held;");
    const freed = await old.allocate("app=crd-freed;");
    await old.release("app=crd-freed;");
    assert.equal((await w.kvstore.masters()).size, 0, "nothing on the kvstore side");
    const gc = await w.open("gc", mode);
    await gc.runGc();
    const second = await gc.runGc();
    assert.deepEqual(second.deletedIds, [freed.id]);
    const crd = await w.crd.masters();
    assert.equal(crd.has(freed.id), false, "the unused CRD-only identity went");
    assert.equal(crd.get(held.id), "app=crd-held;", "the held one stays");
    await old.close();
  });
}
