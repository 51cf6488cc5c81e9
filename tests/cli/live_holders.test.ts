/**
 * Repair tools never destroy live state (issue 17): with a real holder process (`identity
 * allocate --cluster-id 3 --hold` in a child), `doctor` flags neither cluster's identities under
 * either range, `doctor --fix`, `release --node` and `gc` delete nothing the holder holds (`gc`
 * under the holder's name is refused), and a
 * corrupt entry the holder holds is reported with its holder and kept until the holder is gone.
 */
import assert from "node:assert/strict";
import { testEachBackend } from "../_support/factories.ts";
import { cli, spawnCli } from "./_run.ts";

/** Cluster 3's identities (255 clusters): `[3 << 16, (4 << 16) - 1]`. */
const CLUSTER_3 = ["--min", "196608", "--max", "262143"];

interface Finding {
  kind: string;
  id?: number;
  node?: string;
  heldBy?: string[];
  outcome?: string;
}

async function doctor(args: readonly string[]): Promise<{ code: number; findings: Finding[] }> {
  const run = await cli([...args, "--json"]);
  assert.equal(run.stderr.includes("Error"), false, run.stderr);
  return { code: run.code, findings: JSON.parse(run.stdout) };
}

testEachBackend(
  "live holders: doctor, --fix, release --node and gc leave another cluster's live identity, " +
    "and a corrupt entry a live node holds is kept with its holder named",
  async (f) => {
    await using fx = await f.create();
    const args = [...fx.spec().cli];
    const holder = spawnCli([
      ...args,
      "--node",
      "holder3",
      "identity",
      "allocate",
      "k8s:app=db",
      "--cluster-id",
      "3",
      "--hold",
      "--json",
    ]);
    try {
      await holder.output.until("\n");
      const db = JSON.parse(holder.output.text.split("\n")[0]);
      assert.ok(db.id >= 196_608 && db.id <= 262_143, `cluster 3's identity: ${db.id}`);
      // Cluster 0's identity, from a run that exited (its reference lives on with its lease).
      const web = JSON.parse(
        (await cli([...args, "--node", "web0", "identity", "allocate", "k8s:app=web", "--json"]))
          .stdout,
      );
      assert.ok(web.id >= 256 && web.id <= 65_535, `cluster 0's identity: ${web.id}`);

      // One prefix, two clusters' ranges: under either range, neither is damage.
      for (const range of [[], CLUSTER_3]) {
        const clean = await doctor([...args, ...range, "doctor"]);
        assert.deepEqual(clean, { code: 0, findings: [] }, `doctor ${range.join(" ")}`);
        const fixed = await doctor([...args, ...range, "doctor", "--fix"]);
        assert.deepEqual(fixed, { code: 0, findings: [] }, `doctor --fix ${range.join(" ")}`);
        // GC over either range collects neither: both are referenced by live leases.
        const gc = await cli([...args, ...range, "gc", "--grace", "0s", "--force", "--json"]);
        assert.equal(gc.code, 0, gc.stderr);
        const deleted = gc.stdout.trim().split("\n").flatMap((l) => JSON.parse(l).deleted);
        assert.deepEqual(deleted, [], `gc ${range.join(" ")}`);
      }

      // release --node of a live node is refused, with its reason; the reference stays.
      const release = await cli([...args, "--node", "holder3", "release", "k8s:app=db;", "--json"]);
      assert.equal(release.code, 4, release.stderr);
      const error = JSON.parse(release.stderr).error;
      assert.equal(error.name, "LiveEntryError");
      assert.match(error.message, /node holder3 is live/);

      // gc under the live holder's name would take its lease: refused.
      const gcAsHolder = await cli([
        ...args,
        "--node",
        "holder3",
        "gc",
        "--grace",
        "0s",
        "--force",
      ]);
      assert.equal(gcAsHolder.code, 4, gcAsHolder.stderr);
      assert.match(
        gcAsHolder.stderr,
        /node holder3 is in use: its lease is live until .*gc would run under its name/,
      );

      // Corrupt entries the live holder holds: the master of its ID, and a reference of its own.
      await fx.corruptMaster(db.id);
      await fx.plantCorruptReference("k8s:app=junk;", "holder3");
      const listed = await doctor([...args, "doctor"]);
      assert.equal(listed.code, 4);
      assert.deepEqual(
        listed.findings.map((x) => [x.kind, x.heldBy]).sort(),
        [["master-undecodable", ["holder3"]], ["reference-undecodable", ["holder3"]]],
      );
      const kept = await doctor([...args, "doctor", "--fix"]);
      assert.equal(kept.code, 4, "held damage remains");
      assert.deepEqual(kept.findings.map((x) => x.outcome), ["held", "held"]);
      const human = await cli([...args, "doctor", "--fix"]);
      assert.equal(human.code, 4);
      assert.match(human.stdout, /^KIND +OUTCOME +REASON +HELD BY +ENTRY\n/);
      assert.match(human.stderr, /2 entries are held by live node holder3, so doctor leaves them/);
      assert.doesNotMatch(human.stderr, /run 'idalloc doctor --fix'/);
      // Nothing of the holder's was touched.
      const refs = await fx.references();
      assert.deepEqual(
        refs.filter((r) => r.node === "holder3" && r.key === "k8s:app=db;"),
        [{ key: "k8s:app=db;", node: "holder3", id: db.id, live: true }],
      );
      assert.ok(refs.some((r) => r.node === "web0" && r.id === web.id && r.live));
    } finally {
      holder.child.kill("SIGINT");
      await holder.output.toEnd().catch(() => {});
      holder.output.kill();
    }
    assert.equal((await holder.child.status).code, 0, await holder.output.stderr);

    // The holder stopped and its lease is gone: nothing holds the damage any more.
    await fx.dropLease("holder3");
    const fixed = await doctor([...args, "doctor", "--fix"]);
    assert.equal(fixed.code, 0, JSON.stringify(fixed.findings));
    assert.ok(fixed.findings.every((x) => x.outcome === "removed" && x.heldBy === undefined));
    assert.deepEqual(await doctor([...args, "doctor"]), { code: 0, findings: [] });
  },
);
