/**
 * A live node's name is its own (issue 28, item 1), on every backend: a writable session opened
 * under a node name whose lease is live fails with `NodeInUseError` and writes nothing, unless it
 * says it is that node restarting (`restart: true`); of two sessions opening one name at once only
 * one succeeds; a session that holds nothing frees its name when it closes; operators
 * (`BackendAdmin.nodeLeases`, what `gc --node` and `release --node` judge by) see a node that
 * holds nothing yet as live.
 */
import assert from "node:assert/strict";
import { Allocator, NodeInUseError } from "../../mod.ts";
import type { Backend, BackendSession } from "../../src/allocator/backend.ts";
import { testEachBackend } from "../_support/factories.ts";
import { FAST, openNode } from "./_helpers.ts";

const RANGE = { min: 1, max: 1_000 };

function open(backend: Backend, options: { restart?: boolean } = {}): Promise<BackendSession> {
  return backend.openSession({
    leaseTtlMs: 4_000,
    readOnly: false,
    onLeaseReplaced: () => {},
    ...options,
  });
}

function inUse(node: string): (err: unknown) => boolean {
  return (err) => {
    assert.ok(err instanceof NodeInUseError, String(err));
    assert.equal(err.name, "NodeInUseError");
    assert.equal(err.node, node);
    assert.equal(err.retryable, false);
    assert.ok(
      err.expiresAt !== undefined && err.expiresAt > Date.now() - 60_000,
      "says until when",
    );
    assert.match(err.message, new RegExp(`node ${node} is in use: .* until \\d{4}-\\d\\d-\\d\\dT`));
    assert.match(err.message, /restart: true/);
    return true;
  };
}

testEachBackend("a live node's name is refused, and taken over only by a restart", async (f) => {
  await using fx = await f.create();
  await using holder = await openNode(fx, "holder1", RANGE);
  const { id } = await holder.allocate("app=held;");

  // Allocator.open and a bare session alike; nothing is written under the name.
  await assert.rejects(openNode(fx, "holder1", RANGE), inUse("holder1"));
  await assert.rejects(open(await fx.backend("holder1", { fast: true })), inUse("holder1"));
  const refs = (await fx.references()).filter((r) => r.node === "holder1");
  assert.deepEqual(refs.map((r) => [r.key, r.id, r.live]), [["app=held;", id, true]]);
  assert.equal(await holder.getNoCache("app=held;"), id);
  assert.equal(holder.status().session.healthy, true, "the holder kept its lease");

  // A read-only session takes no lease: it may look under any name.
  await using reader = await Allocator.open(await fx.backend("holder1", { fast: true }), {
    ...RANGE,
    readOnly: true,
  });
  assert.equal(await reader.getNoCache("app=held;"), id);

  // The node restarting (its old process gone, its lease not lapsed yet) says so.
  await holder.close();
  await assert.rejects(openNode(fx, "holder1", RANGE), inUse("holder1"));
  await using restarted = await openNode(fx, "holder1", { ...RANGE, restart: true });
  assert.deepEqual(await restarted.allocate("app=held;"), { id, isNew: false, firstUse: true });
});

testEachBackend("two sessions opening one name at once: exactly one succeeds", async (f) => {
  await using fx = await f.create();
  for (let round = 0; round < 5; round++) {
    const node = `racer${round}`;
    const backends = [await fx.backend(node, { fast: true }), await fx.backend(node)];
    const opened = await Promise.allSettled(backends.map((b) => open(b)));
    try {
      const won = opened.filter((o) => o.status === "fulfilled");
      assert.equal(won.length, 1, `round ${round}: ${JSON.stringify(opened.map((o) => o.status))}`);
      const lost = opened.find((o) => o.status === "rejected") as PromiseRejectedResult;
      assert.ok(inUse(node)(lost.reason));
    } finally {
      for (const o of opened) if (o.status === "fulfilled") await o.value.close();
    }
  }
});

testEachBackend(
  "a node that holds nothing is live to operators, and free once it closes",
  async (f) => {
    await using fx = await f.create();
    const idle = await openNode(fx, "idle1", RANGE);
    const admin = (await fx.backend("operator")).admin();
    const signal = AbortSignal.timeout(10_000);
    const lease = (await admin.nodeLeases(signal)).find((l) => l.node === "idle1");
    assert.equal(lease?.live, true, "what gc --node and release --node judge by");
    await idle.close();
    // Nothing held: closing freed the name (Deno KV deletes its lease record, etcd revokes its
    // lease), so the next process under this name needs no `restart`.
    assert.equal(
      (await admin.nodeLeases(signal)).find((l) => l.node === "idle1")?.live ?? false,
      false,
    );
    await using again = await Allocator.open(await fx.backend("idle1", { fast: true }), {
      ...FAST,
      ...RANGE,
    });
    assert.ok((await again.allocate("k;")).id > 0);
  },
);
