/**
 * The metric catalog is what the instruments are made of and what the documentation lists
 * (docs/observability.md): every metric and span is documented, and every metric reaches the SDK
 * with its unit and kind.
 */
import assert from "node:assert/strict";
import { ATTR, METRICS, SPANS } from "../../src/telemetry/catalog.ts";
import { instruments } from "../../src/telemetry/instruments.ts";
import { installSdk } from "../_support/telemetry.ts";

const PAGE = await Deno.readTextFile(new URL("../../docs/observability.md", import.meta.url));

Deno.test("catalog: the docs list every metric and span with its unit and attributes", () => {
  const rows = new Map(
    PAGE.split("\n").filter((l) => l.startsWith("| `idalloc.") || l.startsWith("| `<"))
      .map((l) => [l.split("|")[1].trim().replaceAll("`", ""), l]),
  );
  for (const m of METRICS) {
    const row = rows.get(m.name);
    assert.ok(row, `docs/observability.md does not list ${m.name}`);
    assert.ok(row.includes(`\`${m.unit}\``), `docs/observability.md gives ${m.name} another unit`);
    for (const a of m.attributes) assert.ok(row.includes(`\`${a}\``), `${m.name}: ${a}`);
  }
  for (const s of SPANS) {
    assert.ok(rows.has(s.name), `docs/observability.md does not list span ${s.name}`);
  }
  assert.equal(new Set(METRICS.map((m) => m.name)).size, METRICS.length, "duplicate names");
  for (const m of METRICS) assert.match(m.name, /^idalloc\.[a-z_.]+$/);
  assert.ok(Object.values(ATTR).every((a) => a === "error.type" || a.startsWith("idalloc.")));
});

Deno.test("catalog: every synchronous instrument is made from the catalog", async () => {
  await using sdk = installSdk();
  const inst = instruments();
  // One measurement on each, then each shows up under its catalog name.
  for (const instrument of Object.values(inst)) {
    if ("add" in instrument) instrument.add(1, { probe: "yes" });
    else instrument.record(1, { probe: "yes" });
  }
  const names = new Set((await sdk.collect()).filter((p) => p.attributes.probe).map((p) => p.name));
  const sync = METRICS.filter((m) => m.kind === "counter" || m.kind === "histogram");
  assert.deepEqual([...names].sort(), sync.map((m) => m.name).sort());
});
