// Random interleavings of allocate, release, GC passes, periodic sync, lease expiry and node
// death across several nodes. After every step the store is
// read directly and the store invariants are checked (`assertStoreInvariants`), plus: every key a
// live node holds has its master.
import assert from "node:assert/strict";
import process from "node:process";
import type { Allocator } from "../../mod.ts";
import { testEachBackendAndMode } from "../_support/factories.ts";
import { assertStoreInvariants, openNode } from "./_helpers.ts";
import { picker, prng } from "../../src/testing/prng.ts";

const KEYS = Array.from({ length: 10 }, (_, i) => `prop${i};`);
const STEPS = 120;

interface Node {
  name: string;
  alloc: Allocator;
  /** Local uses the model expects, reserved at launch for releases. */
  held: Map<string, number>;
}

testEachBackendAndMode("property: random interleavings keep every invariant", async (f) => {
  const seed = Number(process.env.IDALLOC_PROPERTY_SEED ?? Date.now() % 1_000_000);
  const random = prng(seed);
  const pick = picker(random);
  await using fx = await f.create();
  let generation = 0;
  const open = async (slot: number): Promise<Node> => {
    const name = `n${slot}-${generation++}`;
    return {
      name,
      alloc: await openNode(fx, name, { max: 64, leaseTtlMs: 1_000 }),
      held: new Map(),
    };
  };
  const nodes: Node[] = [await open(0), await open(1), await open(2)];
  const dead: Allocator[] = [];
  const log: string[] = [];
  try {
    for (let step = 0; step < STEPS; step++) {
      const ops: Promise<unknown>[] = [];
      const width = 1 + Math.floor(random() * 4);
      for (let j = 0; j < width; j++) {
        const slot = Math.floor(random() * nodes.length);
        const node = nodes[slot];
        const key = pick(KEYS);
        const roll = random();
        if (roll < 0.45) {
          log.push(`${node.name} allocate ${key}`);
          ops.push(
            node.alloc.allocate(key).then(() => {
              node.held.set(key, (node.held.get(key) ?? 0) + 1);
            }),
          );
        } else if (roll < 0.75) {
          const count = node.held.get(key) ?? 0;
          if (count === 0) continue;
          node.held.set(key, count - 1);
          log.push(`${node.name} release ${key}`);
          ops.push(node.alloc.release(key));
        } else if (roll < 0.87) {
          log.push(`${node.name} gc`);
          ops.push(node.alloc.runGc());
        } else if (roll < 0.92) {
          log.push(`${node.name} sync`);
          ops.push(node.alloc.sync());
        } else if (roll < 0.97) {
          log.push("wait");
          ops.push(new Promise((r) => setTimeout(r, 200)));
        } else if (j === 0) {
          // Node death: no release, the lease just stops being renewed. A fresh node takes the slot.
          log.push(`${node.name} dies`);
          dead.push(node.alloc);
          ops.push(node.alloc.close().then(async () => (nodes[slot] = await open(slot))));
          break;
        }
      }
      const results = await Promise.allSettled(ops);
      for (const r of results) {
        if (r.status === "rejected") {
          assert.fail(
            `seed ${seed}, step ${step}: operation failed: ${r.reason}\n${log.join("\n")}`,
          );
        }
      }
      try {
        await assertStoreInvariants(fx);
        const masters = await fx.masters();
        for (const node of nodes) {
          for (const [key, count] of node.held) {
            if (count === 0) continue;
            // A node whose lease lapsed (a loaded machine) is fenced: it answers after its re-check.
            const id = node.alloc.cachedId(key) ??
              await node.alloc.get(key, { signal: AbortSignal.timeout(10_000) });
            assert.ok(id !== undefined, `${node.name} holds ${key} without an ID`);
            assert.equal(masters.get(id), key, `${node.name} holds ${key} → ${id}: master gone`);
          }
        }
      } catch (err) {
        throw new Error(`seed ${seed}, step ${step}: ${(err as Error).message}\n${log.join("\n")}`);
      }
    }
  } finally {
    await Promise.all(nodes.map((n) => n.alloc.close()));
    await Promise.all(dead.map((a) => a.close()));
  }
});
