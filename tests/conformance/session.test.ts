/**
 * The session contract of `src/allocator/backend.ts`, on every backend: a read-only session writes
 * nothing; GC deletes only a master that is unused and unchanged since it was listed; `ensure`
 * re-creates a missing master only where the ID is free and never rewrites one that belongs to
 * another key; a key too large for the store simply has no ID.
 */
import assert from "node:assert/strict";
import type {
  AcquireRequest,
  Backend,
  BackendSession,
  GcCandidate,
} from "../../src/allocator/backend.ts";
import { ReadOnlyError } from "../../src/errors.ts";
import { testEachBackendAndMode } from "../_support/factories.ts";
import type { StoreFixture } from "../../src/testing/fixture.ts";
import { eventually } from "../_support/eventually.ts";
import { openNode } from "./_helpers.ts";

const ALL = { min: 0, max: Number.MAX_SAFE_INTEGER };

function open(backend: Backend, readOnly = false): Promise<BackendSession> {
  return backend.openSession({ leaseTtlMs: 4_000, readOnly, onLeaseReplaced: () => {} });
}

/** An acquire of `key` whose first candidate is `id`. */
function request(key: string, id: number): AcquireRequest {
  return {
    key,
    pickCandidate: (exclude) => {
      for (let c = id; c < id + 1000; c++) if (!exclude.has(c)) return c;
      return undefined;
    },
    signal: AbortSignal.timeout(10_000),
  };
}

async function candidates(session: BackendSession): Promise<Map<number, GcCandidate>> {
  const out = new Map<number, GcCandidate>();
  for await (const c of session.gcList(ALL, AbortSignal.timeout(10_000))) out.set(c.id, c);
  return out;
}

async function snapshot(fx: StoreFixture): Promise<string> {
  const masters = [...(await fx.masters())].sort((a, b) => a[0] - b[0]);
  const refs = (await fx.references()).map((r) => `${r.key}@${r.node}=${r.id}`).sort();
  return JSON.stringify({ masters, refs });
}

testEachBackendAndMode("a read-only session refuses every write and writes nothing", async (f) => {
  await using fx = await f.create();
  await using writer = await open(await fx.backend("writer", { fast: true }));
  const signal = AbortSignal.timeout(10_000);
  const held = await writer.acquire(request("held;", 100));
  const unused = await writer.acquire(request("unused;", 200));
  await writer.release("unused;", unused.id, signal);

  const readerBackend = await fx.backend("reader", { fast: true });
  const before = await snapshot(fx);
  await using reader = await open(readerBackend, true);
  const listed = await candidates(reader);
  const collectable = listed.get(unused.id);
  assert.ok(collectable !== undefined && !collectable.inUse, "the released key's master is unused");

  await assert.rejects(reader.acquire(request("new;", 300)), ReadOnlyError);
  await assert.rejects(reader.release("held;", held.id, signal), ReadOnlyError);
  await assert.rejects(reader.ensure([{ key: "held;", id: held.id }], signal), ReadOnlyError);
  await assert.rejects(reader.gcDelete(collectable, signal), ReadOnlyError);
  assert.equal(await reader.get("held;", signal), held.id, "reads still work");

  assert.equal(await snapshot(fx), before, "nothing was written");
  const leases = await readerBackend.admin().nodeLeases(signal);
  assert.ok(!leases.some((l) => l.node === "reader"), "a read-only session takes no lease");
});

testEachBackendAndMode(
  "gcDelete deletes only a master unused and unchanged since it was listed",
  async (f) => {
    await using fx = await f.create();
    const backend = await fx.backend("a", { fast: true });
    await using session = await open(backend);
    const signal = AbortSignal.timeout(10_000);
    const { id } = await session.acquire(request("k;", 100));

    const inUse = (await candidates(session)).get(id)!;
    assert.equal(inUse.inUse, true);
    assert.equal(await session.gcDelete(inUse, signal), false, "a referenced master stays");
    assert.equal((await fx.masters()).get(id), "k;");

    await session.release("k;", id, signal);
    const listed = (await candidates(session)).get(id)!;
    assert.equal(listed.inUse, false);
    // Referenced again after the listing: the version changed, so the listed candidate is stale.
    await session.acquire(request("k;", 100));
    assert.equal(await session.gcDelete(listed, signal), false, "re-acquired after listing");
    assert.equal((await fx.masters()).get(id), "k;");

    await session.release("k;", id, signal);
    const stale = (await candidates(session)).get(id)!;
    assert.equal(await session.gcDelete(stale, signal), true, "unused and unchanged");
    assert.equal((await fx.masters()).has(id), false);
  },
);

testEachBackendAndMode(
  "ensure re-creates a missing master only where the ID is still free",
  async (f) => {
    await using fx = await f.create();
    await using a = await open(await fx.backend("a", { fast: true }));
    await using b = await open(await fx.backend("b", { fast: true }));
    const signal = AbortSignal.timeout(10_000);
    const { id } = await a.acquire(request("mine;", 100));

    await fx.deleteMaster(id);
    // A backend may check held keys from its watch (Kubernetes does, instead of a GET per key):
    // until the deletion reaches it, the master still looks present, so ensure is asked again.
    let recreated = (await a.ensure([{ key: "mine;", id }], signal))[0];
    await eventually(async () => {
      if (recreated.master === "ok") {
        recreated = (await a.ensure([{ key: "mine;", id }], signal))[0];
      }
      return recreated.master !== "ok";
    }, "ensure sees the master gone");
    assert.equal(recreated.master, "recreated");
    assert.equal((await fx.masters()).get(id), "mine;");

    // The master is lost again and another node takes the ID for another key meanwhile.
    await fx.deleteMaster(id);
    await fx.deleteReference("mine;", "a");
    const theirs = await b.acquire(request("theirs;", id));
    assert.equal(theirs.id, id);
    const [conflict] = await a.ensure([{ key: "mine;", id }], signal);
    assert.equal(conflict.master, "conflict");
    assert.equal((await fx.masters()).get(id), "theirs;", "never rewritten to another key");
  },
);

testEachBackendAndMode(
  "getNoCache of a key too large for the store is no ID, not an outage",
  async (f) => {
    await using fx = await f.create();
    await using alloc = await openNode(fx, "a", { max: 1000 });
    assert.equal(await alloc.getNoCache("k".repeat(4096)), undefined);
  },
);
