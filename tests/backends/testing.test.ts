// The harness loader: every backend in the registry has a development harness of its own kind,
// the shared suites find backends only through it, and a store spec opens in another node by kind.
import assert from "node:assert/strict";
import { Allocator } from "../../src/allocator/allocator.ts";
import { BACKENDS } from "../../src/backends/registry.ts";
import {
  backendKinds,
  harnessModule,
  loadHarness,
  loadHarnesses,
  UnknownBackendError,
} from "../../src/testing/harness.ts";
import { factories, testEachBackend } from "../_support/factories.ts";
import { openBackendFromSpec } from "../_support/open_backend.ts";

Deno.test("harnesses: one per registered backend, of its kind, in the registry's order", async () => {
  const harnesses = await loadHarnesses();
  assert.deepEqual(harnesses.map((h) => h.kind), BACKENDS.map((b) => b.kind));
  assert.deepEqual(backendKinds(), ["deno-kv", "etcd", "k8s"]);
  // Each harness is found in its driver's folder: the registry is the one list of backends.
  for (const driver of BACKENDS) {
    assert.equal(harnessModule(driver.kind), new URL("testing/harness.ts", driver.folder).href);
    assert.ok(driver.folder.endsWith("/"), `${driver.kind}'s folder is a folder URL`);
  }
  // The published driver names no harness: the package leaves the harnesses out.
  for (const driver of BACKENDS) assert.ok(!("harness" in driver), `${driver.kind}'s driver`);
  for (const h of harnesses) {
    assert.equal(h.fixture.kind, h.kind, `${h.kind}'s fixture`);
    // Nemesis hooks not built yet say why; built ones offer faults and garbage.
    if (h.nemesis.unavailable?.() !== undefined) continue;
    assert.ok(h.nemesis.faults.length > 0, `${h.kind} supports some faults`);
    assert.ok(h.nemesis.garbageKinds.length > 0, `${h.kind} holds some garbage`);
  }
  // Loaded once per process: the suites, nemesis and bench share one harness object.
  assert.equal(await loadHarness("etcd"), harnesses[1]);
  assert.deepEqual(factories.map((f) => f.kind), BACKENDS.map((b) => b.kind));
});

Deno.test("harnesses: a kind no driver has is an UnknownBackendError naming the kinds", async () => {
  // The nemesis suite and bench spoke of "kv" before backends had one name each.
  const err = await loadHarness("kv").then(() => undefined, (e: unknown) => e);
  assert.ok(err instanceof UnknownBackendError);
  assert.equal(err.name, "UnknownBackendError");
  assert.equal(err.kind, "kv");
  assert.equal(err.message, "no backend of kind 'kv' (have: deno-kv, etcd, k8s)");
});

testEachBackend("a store spec opens the same store in another node, by kind", async (f) => {
  await using fx = await f.create();
  const spec = JSON.parse(JSON.stringify(fx.spec()));
  assert.equal(spec.kind, f.kind);
  await using a = await Allocator.open(await fx.backend("node-a", { fast: true }), { max: 1000 });
  const { id } = await a.allocate("k8s:app=spec;");
  await using opened = await openBackendFromSpec(spec, "node-b", { fast: true });
  await using b = await Allocator.open(opened.backend, { max: 1000 });
  assert.equal((await b.allocate("k8s:app=spec;")).id, id);
  assert.equal((await fx.masters()).get(id), "k8s:app=spec;");
});
