// The CLI in Cilium's double-write modes (`--identity-allocation-mode doublewrite-… --store
// etcd://… --kubeconfig FILE`) on a private API server and its etcd: `identity allocate` in one
// mode, `identity get|list` in the other, `status` counting both sides; every command in each
// double-write mode (`watch` following an identity's life from allocation to GC); the single-store
// modes; and the flag's usage errors.
import assert from "node:assert/strict";
import { main } from "../../../src/cli/main.ts";
import { Capture, untilDead } from "../../cli/_run.ts";
import { startStores } from "./_world.ts";
import { etcdUnavailable } from "../../../src/backends/etcd/testing/cluster.ts";
import {
  kubeApiserverUnavailable,
  startKubeApiServer,
} from "../../../src/backends/k8s/testing/cluster.ts";
import { cli } from "../../cli/_run.ts";

const ignore = kubeApiserverUnavailable() !== undefined || etcdUnavailable() !== undefined;

Deno.test("CLI: --identity-allocation-mode needs the right stores", async () => {
  const usage = async (args: string[], message: RegExp) => {
    const r = await cli([...args, "status"]);
    assert.equal(r.code, 1, r.stderr);
    assert.match(r.stderr, message);
  };
  await usage(
    ["--store", "etcd://127.0.0.1:1", "--identity-allocation-mode", "doublewrite-readcrd"],
    /needs --kubeconfig FILE/,
  );
  await usage(
    ["--store", "kv:./x.kv", "--identity-allocation-mode", "doublewrite-readkvstore"],
    /needs --store etcd:\/\/…, not a deno-kv store/,
  );
  await usage(
    ["--store", "etcd://127.0.0.1:1", "--identity-allocation-mode", "crd"],
    /needs --store k8s:…/,
  );
  await usage(
    ["--store", "etcd://127.0.0.1:1", "--identity-allocation-mode", "readboth"],
    /must be kvstore, crd, doublewrite-readkvstore or doublewrite-readcrd/,
  );
});

Deno.test({
  name: "CLI: identity allocate|get|list and status in both double-write modes",
  ignore,
  async fn() {
    await using cluster = await startKubeApiServer();
    const kubeconfig = await cluster.kubeconfig("admin", { context: "test", namespace: "default" });
    const store = (mode: string) => [
      ...["--store", `etcd://${new URL(cluster.etcd.endpoints[0]).host}`],
      ...["--identity-allocation-mode", mode, "--kubeconfig", kubeconfig],
      ...["--context", "test", "--namespace", "default", "--lease-ttl", "3s", "--clock-skew", "1s"],
    ];
    const labels = ["k8s:app=web", "k8s:io.kubernetes.pod.namespace=prod"];
    const allocated = await cli([
      ...store("doublewrite-readkvstore"),
      ...["identity", "allocate", ...labels, "--json"],
    ]);
    assert.equal(allocated.code, 0, allocated.stderr);
    const { id } = JSON.parse(allocated.stdout) as { id: number };
    for (const mode of ["doublewrite-readkvstore", "doublewrite-readcrd"]) {
      const got = await cli([...store(mode), "identity", "get", String(id), "--json"]);
      assert.equal(got.code, 0, got.stderr);
      assert.match(got.stdout, /app=web/, `${mode}: get`);
      const listed = await cli([...store(mode), "identity", "list", "--json"]);
      assert.equal(listed.code, 0, listed.stderr);
      assert.match(listed.stdout, new RegExp(`${id}`), `${mode}: list`);
    }
    const status = await cli([...store("doublewrite-readcrd"), "status", "--json"]);
    assert.equal(status.code, 0, status.stderr);
    assert.deepEqual(JSON.parse(status.stdout).doubleWrite, {
      crd: { total: 1, only: 0 },
      kvstore: { total: 1, only: 0 },
      differing: [],
    });
    const human = await cli([...store("doublewrite-readkvstore"), "status"]);
    assert.match(human.stdout, /kvstore side +1 identities, 0 on the kvstore only/);
  },
});

/** Runs `idalloc <args>` to its end; its exit code and JSON output (one value). */
async function json(args: string[]): Promise<{ code: number; out: unknown; stderr: string }> {
  const r = await cli([...args, "--json"]);
  return {
    code: r.code,
    out: r.stdout.trim() === "" ? null : JSON.parse(r.stdout),
    stderr: r.stderr,
  };
}

for (const mode of ["doublewrite-readkvstore", "doublewrite-readcrd"] as const) {
  Deno.test({
    name: `CLI ${mode}: identity allocate|get|list|release, status, gc, doctor and watch`,
    ignore,
    async fn() {
      await using stores = await startStores();
      const args = stores.cli(mode);
      const labels = ["k8s:app=web", "k8s:io.kubernetes.pod.namespace=prod"];
      // watch follows the store from the start, in-process until aborted.
      const watching = new Capture();
      const stop = new AbortController();
      const watch = main([...args, "watch"], { ...watching.io, signal: stop.signal });
      try {
        await watching.waitFor((out) => out.includes(`{"type":"synced"}`));

        // The holder's lease outlasts the commands below on a loaded machine (each a process of
        // its own, seconds apart there): the release right after must find it live.
        const holderArgs = args.map((a, i) => args[i - 1] === "--lease-ttl" ? "15s" : a);
        const allocated = await json([
          ...holderArgs,
          "--node",
          "holder",
          "identity",
          "allocate",
          ...labels,
        ]);
        assert.equal(allocated.code, 0, allocated.stderr);
        const { id } = allocated.out as { id: number };
        // The holder's run ended without releasing: its reference stays while its lease does.
        const refused = await json([...args, "--node", "holder", "identity", "release", ...labels]);
        assert.equal(refused.code, 4, refused.stderr);
        await watching.waitFor((out) => out.includes(`"type":"upsert","id":${id}`));

        const got = await json([...args, "identity", "get", String(id)]);
        assert.equal(got.code, 0, got.stderr);
        assert.match(JSON.stringify(got.out), /k8s:app=web/);
        const listed = await json([...args, "identity", "list"]);
        assert.equal(listed.code, 0, listed.stderr);
        assert.match(JSON.stringify(listed.out), new RegExp(`"id":${id}\\b`));

        const status = await json([...args, "status"]);
        assert.equal(status.code, 0, status.stderr);
        const model = status.out as { doubleWrite: unknown; metrics: Record<string, unknown> };
        assert.deepEqual(model.doubleWrite, {
          crd: { total: 1, only: 0 },
          kvstore: { total: 1, only: 0 },
          differing: [],
        });
        assert.equal(model.metrics["idalloc.identity.crd.total_count"], 1);
        assert.equal(model.metrics["idalloc.identity.kvstore.only_count"], 0);

        const doctor = await json([...args, "doctor"]);
        assert.equal(doctor.code, 0, doctor.stderr);
        assert.deepEqual(doctor.out, []);

        await untilDead(args, "holder", 60_000);
        const released = await json([
          ...args,
          "--node",
          "holder",
          "identity",
          "release",
          ...labels,
        ]);
        assert.equal(released.code, 0, released.stderr);
        assert.equal((released.out as { released: boolean }).released, true);

        // Unused on both sides now: two passes a second apart collect it from both.
        const gc = await cli([...args, "gc", "--grace", "1s", "--force", "--json"]);
        assert.equal(gc.code, 0, gc.stderr);
        const passes = gc.stdout.trim().split("\n").map((l) => JSON.parse(l));
        assert.deepEqual(passes.flatMap((p) => p.deleted.map((d: { id: number }) => d.id)), [id]);
        await watching.waitFor((out) => out.includes(`"type":"delete","id":${id}`));
        const sides = await stores.sides();
        assert.equal(sides.kvstore.has(id), false, "kvstore master collected");
        assert.equal(sides.crd.has(id), false, "CiliumIdentity collected");
        // The last identity went from both sides, so nothing is stored: `get` says so (exit 1,
        // as in every mode on an empty store) instead of "not found".
        const gone = await json([...args, "identity", "get", String(id)]);
        assert.equal(gone.code, 1, gone.stderr);
        assert.match(gone.stderr, /nothing is stored under prefix/);
      } finally {
        stop.abort();
        await watch;
      }
    },
  });
}

Deno.test({
  name: "CLI: the single-store modes, kvstore and crd, allocate and read",
  ignore,
  async fn() {
    await using stores = await startStores();
    for (const mode of ["kvstore", "crd"] as const) {
      const args = stores.cli(mode);
      const allocated = await json([...args, "identity", "allocate", `k8s:app=${mode}`]);
      assert.equal(allocated.code, 0, allocated.stderr);
      const { id } = allocated.out as { id: number };
      const got = await json([...args, "identity", "get", String(id)]);
      assert.equal(got.code, 0, got.stderr);
      const status = await json([...args, "status"]);
      assert.equal(status.code, 0, status.stderr);
      assert.equal((status.out as { doubleWrite?: unknown }).doubleWrite, undefined);
    }
    // Each wrote its own store only.
    const sides = await stores.sides();
    assert.deepEqual([...sides.kvstore.values()], ["k8s:app=kvstore;"]);
    assert.deepEqual([...sides.crd.values()], ["k8s:app=crd;"]);
  },
});
