import assert from "node:assert/strict";
import { PoolExhaustedError } from "../../src/errors.ts";
import { Labels } from "../../src/identity/mod.ts";
import { LocalIdentityCache, type LocalIdentityEvent } from "../../src/identity/local.ts";
import { test } from "../_support/test.ts";

const S = 0x42000000;
const cidr = (i: number | string) => Labels.parse([`cidr:1.1.1.${i}/32`]);

test("TestBumpNextNumericIdentity: 1..5 then wraps to 1", () => {
  const cache = new LocalIdentityCache({ scope: S, min: 1, max: 5 });
  const seen: number[] = [];
  for (let i = 0; i < 6; i++) {
    seen.push(cache.nextValue);
    cache.lookupOrCreate(cidr(i));
    cache.release((cache.lookup(cidr(i))!).id);
  }
  assert.deepEqual(seen, [1, 2, 3, 4, 5, 1]);
});

test("TestLocalIdentityCache: sequence, refcounts, exhaustion, wrap to the freed slot", () => {
  const cache = new LocalIdentityCache({ scope: S, min: 1, max: 5 });
  const labels = [1, 2, 3, 4, 5].map((i) => Labels.parse([`cidr:${i}`]));
  const first = labels.map((l) => cache.lookupOrCreate(l));
  first.forEach(({ identity, isNew }, i) => {
    assert.equal(isNew, true);
    assert.equal(identity.id, S + i + 1);
  });
  // Again: not new, the same objects.
  labels.forEach((l, i) => {
    const again = cache.lookupOrCreate(l);
    assert.equal(again.isNew, false);
    assert.equal(again.identity, first[i].identity);
  });
  // Sixth label: out of space.
  assert.throws(() => cache.lookupOrCreate(Labels.parse(["cidr:foo"])), PoolExhaustedError);
  // Release once each: still there.
  labels.forEach((l, i) => {
    assert.equal(cache.release(S + i + 1), false);
    assert.equal(cache.lookup(l)?.id, S + i + 1);
    assert.equal(cache.lookupById(S + i + 1)?.labels, l);
  });
  // Release again: gone.
  labels.forEach((l, i) => {
    assert.equal(cache.release(S + i + 1), true);
    assert.equal(cache.lookup(l), undefined);
  });
  assert.equal(cache.release(S + 1), false); // unknown
  // Re-create all five, free S+3: "foo" gets S+3 because the scan wraps to the freed slot.
  for (const l of labels) assert.equal(cache.lookupOrCreate(l).isNew, true);
  assert.equal(cache.release(S + 3), true);
  const foo = cache.lookupOrCreate(Labels.parse(["cidr:foo"]));
  assert.equal(foo.isNew, true);
  assert.equal(foo.identity.id, S + 3);
});

test("TestOldNID: requested, withheld and out-of-scope old IDs", () => {
  const cache = new LocalIdentityCache({ scope: S, min: 1, max: 10 });
  const alloc = (i: number, old: number) => cache.lookupOrCreate(cidr(i), old).identity.id;
  assert.equal(alloc(1, S), S); // 1. the scope itself is accepted (quirk)
  assert.equal(alloc(2, S), S + 1); // 2. taken → scan
  assert.deepEqual(cache.withhold([S + 2]), []);
  assert.equal(alloc(3, 0), S + 3); // 3. withheld S+2 skipped
  assert.equal(alloc(4, S + 2), S + 2); // 4. requesting a withheld ID gets it
  assert.equal(alloc(5, S + 2), S + 4); // 5. taken → scan
  cache.unwithhold([S + 2]);
  assert.equal(cache.release(S + 2), true);
  assert.equal(alloc(6, S + 2), S + 2); // 6.
  assert.equal(alloc(7, S - 2), S + 5); // 7. wrong scope → scan
  const withheld = [6, 7, 8, 9, 10].map((n) => S + n);
  assert.deepEqual(cache.withhold([...withheld, 0x01000001]), [0x01000001]);
  const last = alloc(8, 0); // 8. everything else taken: claims a withheld ID
  assert.ok(withheld.includes(last), `got ${last.toString(16)}`);
});

test("local cache reports creations and last releases when notifying", () => {
  const events: LocalIdentityEvent[] = [];
  const cache = new LocalIdentityCache({ scope: 0x01000000, onChange: (e) => events.push(e) });
  const { identity } = cache.lookupOrCreate(cidr(1));
  cache.lookupOrCreate(cidr(1));
  cache.lookupOrCreate(cidr(2), 0, false);
  assert.equal(cache.release(identity.id), false);
  assert.equal(cache.release(identity.id), true);
  assert.deepEqual(events.map((e) => [e.type, e.id]), [
    ["upsert", 0x01000001],
    ["delete", 0x01000001],
  ]);
  assert.equal(cache.size, 1);
});
