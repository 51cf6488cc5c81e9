/**
 * The `k8s-scale` bench (`bench/k8s_scale.ts`): its flags, counters, fit and table on plain data,
 * and one `--quick` run on a real API server whose table must have every figure at both sizes,
 * one identity per raced label set, each size's rows printed before the table, and a GC pass
 * after the first that lists no endpoints. No figure's value is asserted beyond that: figures live in the
 * bench's table, not in tests.
 *
 * @module
 */
import assert from "node:assert/strict";
import {
  fitGrowth,
  parseScaleArgs,
  quantile,
  QUICK,
  requestCounts,
  requestDelta,
  scaleMarkdown,
  scaleRows,
  ScaleUsageError,
  sizeRows,
} from "../../bench/k8s_scale_table.ts";
import { kubeApiserverUnavailable } from "../../src/backends/k8s/testing/cluster.ts";

const ROOT = new URL("../../", import.meta.url).pathname;

Deno.test("k8s-scale flags: taken out of the arguments, on top of --quick's sizes", () => {
  const args = ["k8s-scale", "--quick", "--nodes", "200,50,100", "--scenarios", "race,join"];
  const o = parseScaleArgs(args);
  assert.deepEqual(args, ["k8s-scale"]);
  assert.deepEqual(o.nodes, [50, 100, 200]);
  assert.deepEqual(o.scenarios, ["join", "race"]);
  assert.equal(o.workers, QUICK.workers);
  assert.throws(() => parseScaleArgs(["--nodes", "0"]), ScaleUsageError);
  assert.throws(() => parseScaleArgs(["--scenarios", "join,nap"]), /unknown nap/);
  assert.throws(() => parseScaleArgs(["--window"]), /needs a value/);
});

Deno.test("k8s-scale counters: apiserver_request_total summed by verb and resource", () => {
  const metrics = [
    "# TYPE apiserver_request_total counter",
    'apiserver_request_total{code="200",group="coordination.k8s.io",resource="leases",scope="resource",subresource="",verb="PUT",version="v1"} 7',
    'apiserver_request_total{code="409",group="coordination.k8s.io",resource="leases",scope="resource",subresource="",verb="PUT",version="v1"} 2',
    'apiserver_request_total{code="200",group="",resource="",scope="",subresource="",verb="GET",version=""} 50',
    'apiserver_request_total{code="200",group="x.io",resource="ciliumidentities",scope="resource",subresource="status",verb="PATCH",version="v2"} 1',
  ].join("\n");
  const counts = requestCounts(metrics);
  assert.deepEqual([...counts], [["PUT leases", 9], ["PATCH ciliumidentities/status", 1]]);
  const later = new Map([["PUT leases", 12], ["PATCH ciliumidentities/status", 1]]);
  assert.deepEqual([...requestDelta(counts, later)], [["PUT leases", 3]]);
});

Deno.test("k8s-scale fit: the power law's exponent, the slope and the prediction", () => {
  const square = fitGrowth([[10, 100], [20, 400], [40, 1600]])!;
  assert.ok(Math.abs(square.exponent - 2) < 1e-9);
  assert.ok(Math.abs(square.predict(100) - 10_000) < 1e-6);
  const flat = fitGrowth([[10, 5], [20, 5]])!;
  assert.ok(Math.abs(flat.exponent) < 1e-9 && Math.abs(flat.slope) < 1e-9);
  assert.equal(fitGrowth([[10, 5]]), undefined, "one size: no growth");
  assert.equal(fitGrowth([[10, 0], [20, 1]]), undefined, "zero: no logarithm");
  assert.equal(quantile([5, 1, 3, 2, 4], 0.99), 5);
  assert.equal(quantile([5, 1, 3, 2, 4], 0.5), 3);
});

Deno.test("k8s-scale table: a value per size, the growth, the prediction, a limit flagged", () => {
  const figures = [{
    name: "join: size",
    values: new Map([[50, 1_000], [100, 2_000]]),
    format: (x: number) => `${Math.round(x)} B`,
    predictAt: 5_000,
    per: "node",
    limit: { value: 50_000, what: "the limit" },
  }, { name: "race: beside", values: new Map(), format: String, note: "Cilium 3" }];
  const [size, beside] = scaleRows(figures);
  assert.equal(
    size.value,
    "50: 1000 B · 100: 2000 B | ∝ node^1.00, 20 B/node | at 5,000: 100000 B (over the limit)",
  );
  assert.equal(beside.name, "k8s-scale race: beside");
  assert.equal(beside.value, " | Cilium 3");
  assert.deepEqual(sizeRows(figures, 100, "nodes"), [
    { name: "k8s-scale at 100 nodes: join: size", value: "2000 B" },
    { name: "k8s-scale at 100 nodes: race: beside", value: "Cilium 3" },
  ]);
  assert.deepEqual(sizeRows(figures.slice(0, 1), 75, "nodes"), [], "nothing at that size");
  const md = scaleMarkdown(figures).split("\n");
  assert.equal(md[0], "| measure | 50 | 100 | growth | predicted | note |");
  assert.equal(md.length, 4);
});

Deno.test({
  name: "k8s-scale --quick: every figure at both sizes, one identity per raced label set",
  ignore: kubeApiserverUnavailable() !== undefined,
  async fn() {
    const out = await new Deno.Command(Deno.execPath(), {
      args: ["run", "-A", "bench/main.ts", "k8s-scale", "--quick"],
      cwd: ROOT,
      stdout: "piped",
      stderr: "piped",
    }).output();
    const stdout = new TextDecoder().decode(out.stdout);
    const stderr = new TextDecoder().decode(out.stderr);
    assert.equal(out.code, 0, `${stdout}\n${stderr.slice(-3000)}`);
    const rows = new Map(
      stdout.split("\n").filter((l) => l.startsWith("k8s-scale ")).map((l) => {
        const [name, value] = l.split(/ {2,}/, 2);
        return [name.trim(), l.slice(l.indexOf(value))];
      }),
    );
    const [small, large] = QUICK.nodes;
    for (
      const name of [
        "open: every node's session open and synced",
        "join: time until all hold (shared + 5 own)",
        "join: API requests per joining node",
        "join: watch bytes per join, one watcher",
        "join: watch bytes per join, shared identity's events",
        "join: shared identity's size, 1 holder",
        "join: shared identity's size, all n holders",
        "steady: API requests per second",
        "race: p99 time to an answer",
      ]
    ) {
      const value = rows.get(`k8s-scale ${name}`);
      assert.ok(value, `no row '${name}' in:\n${stdout}`);
      assert.match(value, new RegExp(`^${small}: .* · ${large}: .* \\| .* \\| at 5,000: `), name);
    }
    assert.match(
      rows.get("k8s-scale race: identities created (want 1)") ?? "",
      new RegExp(`^${small}: 1 · ${large}: 1 \\|`),
    );
    const [c1, c2] = QUICK.gcIdentities;
    assert.match(
      rows.get("k8s-scale gc: idalloc, mark pass + delete pass") ?? "",
      new RegExp(`^${c1}: .* · ${c2}: .* \\| at ${c2}: marked ${c2 / 2} .*deleted ${c2 / 2} `),
    );
    const later = rows.get("k8s-scale gc: idalloc, API requests of that pass") ?? "";
    assert.match(later, new RegExp(`^${c1}: .* · ${c2}: `), later);
    assert.doesNotMatch(
      later,
      /LIST ciliumendpoints(slices)?\b/,
      "a later pass reads the informers",
    );
    // Each size's rows as soon as it finished, before the table.
    const early = stdout.indexOf(`k8s-scale at ${small} nodes: join: time until all hold`);
    assert.ok(early >= 0 && early < stdout.indexOf("k8s-scale setup"), stdout);
    assert.ok(stdout.includes(`k8s-scale at ${c2} identities: gc: idalloc, a later pass`), stdout);
    const beside = [...rows].find(([name]) => name.startsWith("k8s-scale race beside Cilium"));
    assert.ok(beside, stdout);
    assert.match(beside[1], /idalloc 1[ ,]/, "idalloc's nodes make one identity");
    assert.ok(rows.has("k8s-scale setup"));
  },
});
