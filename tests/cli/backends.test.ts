/**
 * The CLI on every backend (one factory each, `tests/_support/factories.ts`): the same commands,
 * the same answers and the same exit codes, whatever the store.
 */
import assert from "node:assert/strict";
import { CORE_DAMAGE_KINDS } from "../../src/allocator/damage.ts";
import { backendOfKind, backendOfStore } from "../../src/backends/registry.ts";
import { testEachBackend } from "../_support/factories.ts";
import { cli, isOneLineError } from "./_run.ts";

testEachBackend("cli: an empty store lists [] and reports healthy, exit 0", async (f) => {
  await using fx = await f.create();
  const args = fx.spec().cli;
  const list = await cli([...args, "list", "--json"]);
  assert.equal(list.code, 0, list.stderr);
  assert.deepEqual(JSON.parse(list.stdout), []);
  assert.match(list.stderr, /note: nothing is stored under prefix/);
  const table = await cli([...args, "list"]);
  assert.equal(table.code, 0, table.stderr);
  assert.equal(table.stdout, "ID  KEY\n");
  const identities = await cli([...args, "identity", "list", "--json"]);
  assert.deepEqual(JSON.parse(identities.stdout), []);
  const refs = await cli([...args, "refs", "--json"]);
  assert.deepEqual(JSON.parse(refs.stdout), []);
  const status = await cli([...args, "status", "--json"]);
  assert.equal(status.code, 0, status.stderr);
  const summary = JSON.parse(status.stdout);
  assert.equal(summary.ids, 0);
  // The store was opened by the driver the registry lists under the backend's one name.
  assert.equal(summary.backend, fx.kind);
  assert.equal(
    backendOfKind(fx.kind)?.scheme,
    backendOfStore(args[args.indexOf("--store") + 1])?.driver.scheme,
  );
  assert.deepEqual(summary.splitKeys, []);
  // Looking something up in an empty prefix still says the prefix is probably wrong.
  const get = await cli([...args, "get", "app=web;"]);
  assert.equal(get.code, 1);
  assert.ok(isOneLineError(get.stderr), get.stderr);
});

testEachBackend(
  "cli: release exits 3 for a reference the node does not hold, 4 for a live node's",
  async (f) => {
    await using fx = await f.create();
    const args = fx.spec().cli;
    const allocated = await cli([...args, "--node", "node-a", "allocate", "relk;", "--json"]);
    assert.equal(allocated.code, 0, allocated.stderr);
    const other = await cli([...args, "--node", "node-b", "release", "relk;"]);
    assert.equal(other.code, 3, other.stderr);
    assert.match(other.stderr, /node node-b holds no reference to relk;/);
    const asJson = await cli([...args, "--node", "node-b", "release", "relk;", "--json"]);
    assert.equal(asJson.code, 3);
    assert.equal(JSON.parse(asJson.stderr).error.code, 3, "--json errors are JSON");
    // node-a's run ended, but its lease runs on (--lease-ttl): its reference is a live one.
    const live = await cli([...args, "--node", "node-a", "release", "relk;"]);
    assert.equal(live.code, 4, live.stderr);
    assert.ok(isOneLineError(live.stderr), live.stderr);
    assert.match(
      live.stderr,
      /node node-a is live until \S+ \(in \d+s\): its reference to relk; \(ID \d+\) stays/,
    );
    assert.deepEqual((await fx.references()).map((r) => [r.node, r.live]), [["node-a", true]]);
    // Once its lease is gone, the reference is a dead node's: Deno KV keeps it until GC sweeps
    // it, and release deletes it; etcd deleted it with the lease.
    await fx.dropLease("node-a");
    const dead = await cli([...args, "--node", "node-a", "release", "relk;"]);
    assert.equal(dead.code, f.traits.deadReferencesStay ? 0 : 3, dead.stderr);
    assert.deepEqual(await fx.references(), []);
  },
);

testEachBackend("cli: refs shows which node references which key, with totals", async (f) => {
  await using fx = await f.create();
  const args = fx.spec().cli;
  const a = JSON.parse((await cli([...args, "--node", "na", "allocate", "k1;", "--json"])).stdout);
  await cli([...args, "--node", "nb", "allocate", "k1;"]);
  // A third node: a second run as `nb` is refused while nb's lease is live.
  const b = JSON.parse((await cli([...args, "--node", "nc", "allocate", "k2;", "--json"])).stdout);
  const refs = await cli([...args, "refs", "--json"]);
  assert.equal(refs.code, 0, refs.stderr);
  assert.deepEqual(JSON.parse(refs.stdout), [
    { key: "k1;", node: "na", id: a.id, live: true },
    { key: "k1;", node: "nb", id: a.id, live: true },
    { key: "k2;", node: "nc", id: b.id, live: true },
  ]);
  const table = await cli([...args, "refs"]);
  assert.match(table.stderr, /^3 references \(3 live, 0 dead\) to 2 keys from 3 nodes/);
  const one = await cli([...args, "refs", "k2;"]);
  assert.match(one.stdout, new RegExp(`^ID +NODE +STATE +KEY\\n${b.id} +nc +live +k2;\\n$`));
  const byNode = JSON.parse((await cli([...args, "refs", "--by-node", "--json"])).stdout);
  assert.deepEqual(byNode, [
    { node: "na", references: 1, live: 1, dead: 0 },
    { node: "nb", references: 1, live: 1, dead: 0 },
    { node: "nc", references: 1, live: 1, dead: 0 },
  ]);
});

testEachBackend("cli: status lists split keys with the IDs their references name", async (f) => {
  await using fx = await f.create();
  const args = fx.spec().cli;
  const ok = JSON.parse(
    (await cli([...args, "--node", "n1", "allocate", "fine;", "--json"])).stdout,
  );
  const clean = await cli([...args, "status"]);
  assert.equal(clean.code, 0, clean.stderr);
  assert.doesNotMatch(clean.stdout, /split/, "nothing extra when no key is split");
  assert.deepEqual(JSON.parse((await cli([...args, "status", "--json"])).stdout).splitKeys, []);

  // Another writer (e.g. a Cilium agent) split a key: its two live references name two IDs.
  // Another node: n1's lease (a run that exited) is live, and a live node name is refused.
  const split = JSON.parse(
    (await cli([...args, "--node", "n2", "allocate", "split;", "--json"]))
      .stdout,
  );
  const other = split.id === ok.id + 1 ? split.id + 1 : ok.id + 1;
  await fx.plantReference("split;", "cilium-node", other);
  const status = await cli([...args, "status", "--json"]);
  assert.equal(status.code, 0, status.stderr);
  const summary = JSON.parse(status.stdout);
  const ids = [split.id, other].sort((x, y) => x - y);
  assert.deepEqual(summary.splitKeys.map((s: { key: string; ids: number[] }) => [s.key, s.ids]), [
    ["split;", ids],
  ]);
  const text = await cli([...args, "status"]);
  assert.match(text.stdout, /split keys +1 key whose live references name different IDs/);
  assert.match(text.stdout, new RegExp(`split;: ID ${ids[0]} \\(.+\\) vs ID ${ids[1]} \\(.+\\)`));
  assert.match(text.stdout, /cilium-node/);
});

testEachBackend("cli: identity get prints one identity's labels", async (f) => {
  await using fx = await f.create();
  const args = fx.spec().cli;
  const allocated = await cli([...args, "identity", "allocate", "k8s:app=web", "--json"]);
  const { id } = JSON.parse(allocated.stdout);
  const got = await cli([...args, "identity", "get", String(id), "--json"]);
  assert.equal(got.code, 0, got.stderr);
  assert.deepEqual(JSON.parse(got.stdout), { id, labels: ["k8s:app=web"], scope: "global" });
  const table = await cli([...args, "identity", "get", String(id)]);
  const width = String(id).length;
  assert.equal(table.stdout, `${"ID".padEnd(width)}  LABELS\n${id}  k8s:app=web\n`);
  const reserved = await cli([...args, "identity", "get", "1", "--json"]);
  assert.deepEqual(JSON.parse(reserved.stdout), {
    id: 1,
    labels: ["reserved:host"],
    scope: "reserved",
  });
  const missing = await cli([...args, "identity", "get", String(id + 1)]);
  assert.equal(missing.code, 3);
  assert.match(missing.stderr, /identity \d+ does not exist/);
});

testEachBackend("cli: doctor lists the garbage, exits 4, and --fix removes it", async (f) => {
  await using fx = await f.create();
  const args = fx.spec().cli;
  const held = JSON.parse(
    (await cli([...args, "--node", "na", "allocate", "keep;", "--json"])).stdout,
  );
  const clean = await cli([...args, "doctor"]);
  assert.equal(clean.code, 0, clean.stderr);
  assert.match(clean.stdout, /^no damage under prefix/);
  await fx.plantCorruptEntries();
  const found = await cli([...args, "doctor", "--json"]);
  assert.equal(found.code, 4, found.stderr);
  const kinds = new Set<string>(JSON.parse(found.stdout).map((x: { kind: string }) => x.kind));
  assert.ok(kinds.has("master-bad-id") && kinds.has("reference-undecodable"), [...kinds].join());
  // Every kind reported is a core one or one the backend's driver declares.
  const declared = { ...CORE_DAMAGE_KINDS, ...backendOfKind(fx.kind)!.damageKinds };
  assert.deepEqual([...kinds].filter((k) => !(k in declared)), [], "undeclared damage kinds");
  const fixed = await cli([...args, "doctor", "--fix", "--json"]);
  assert.equal(fixed.code, 0, fixed.stderr);
  const outcomes = JSON.parse(fixed.stdout).map((x: { outcome: string }) => x.outcome);
  assert.ok(outcomes.length > 0 && outcomes.every((o: string) => o === "removed"));
  const after = await cli([...args, "doctor"]);
  assert.equal(after.code, 0, after.stdout);
  // What was valid is untouched.
  assert.equal((await fx.masters()).get(held.id), "keep;");
});
