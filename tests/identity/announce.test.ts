/**
 * A new identity is announced once on `changes()`: when it is allocated, and not again when the
 * store's watch echoes its master (the Deploy service's SSE stream relays these batches).
 */
import assert from "node:assert/strict";
import { IdentityAllocator, Labels } from "../../src/identity/mod.ts";
import { testEachBackend } from "../_support/factories.ts";
import type { StoreFixture } from "../../src/testing/fixture.ts";
import { Owner } from "./_owner.ts";

async function open(fx: StoreFixture, node: string): Promise<IdentityAllocator> {
  return await IdentityAllocator.open(await fx.backend(node, { fast: true }), {});
}

testEachBackend(
  "a new identity is announced once, not again when the watch echoes it",
  async (f) => {
    await using fx = await f.create();
    await using home = await open(fx, "home");
    await using other = await open(fx, "other");
    await using owner = new Owner(home, false);
    const web = Labels.parse(["k8s:app=web"]);
    const { identity } = await home.allocate(web);
    await owner.has(identity.id, web);
    // Another node's identity reaches `home` only through its watch, after the echo of `web`'s
    // master (the feed keeps the store's order): once the owner has it, the echo was handled.
    const db = await other.allocate(Labels.parse(["k8s:app=db"]));
    await owner.has(db.identity.id, db.identity.labels);
    const announcements = owner.batches.filter((b) => b.added.has(identity.id)).length;
    assert.equal(announcements, 1, "one allocation, one announcement");
  },
);
