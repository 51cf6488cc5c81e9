/**
 * Smaller operator-facing behaviours of the CLI (issue 17, point 8), each against a real store.
 */
import assert from "node:assert/strict";
import { main } from "../../src/cli/main.ts";
import { etcdUnavailable, startEtcd } from "../../src/backends/etcd/testing/cluster.ts";
import { rawClient } from "../../src/backends/etcd/testing/fixture.ts";
import { testEachBackend } from "../_support/factories.ts";
import { userEnv } from "../_support/commands.ts";
import { eventually } from "../_support/eventually.ts";
import { Capture, cli, TempStore, untilDead } from "./_run.ts";

async function exists(path: string): Promise<boolean> {
  try {
    await Deno.stat(path);
    return true;
  } catch {
    return false;
  }
}

/**
 * Counts this process's `Deno.stat` calls on `path` until disposed: the watch below runs in this
 * process, and looking for a missing store file is a `stat` of it.
 */
function countStats(path: string): { readonly count: number } & Disposable {
  const original = Deno.stat;
  const counter = {
    count: 0,
    [Symbol.dispose]: () => void (Deno.stat = original),
  };
  Deno.stat = (p: string | URL) => {
    if (String(p) === path) counter.count++;
    return original(p);
  };
  return counter;
}

Deno.test("watch on a KV file that does not exist yet waits for the first allocation", async () => {
  await using store = await TempStore.create();
  using stats = countStats(store.path);
  const capture = new Capture();
  const stop = new AbortController();
  const running = main([...store.args, "watch"], { ...capture.io, signal: stop.signal });
  try {
    const deadline = Date.now() + 15_000;
    while (!capture.stderr.includes("note:")) {
      assert.ok(Date.now() < deadline, "no note on stderr");
      await new Promise((r) => setTimeout(r, 20));
    }
    assert.match(
      capture.stderr,
      /no Deno KV file at .*ids\.kv yet.*watching for the first allocation/,
    );
    // Opening looked for the file once; two more looks are two polls that found it missing.
    const looked = stats.count;
    await eventually(() => stats.count >= looked + 2, "the watch looked for the file twice more");
    assert.equal(await exists(store.path), false, "watch never creates the file");
    const allocated = await cli([...store.args, "allocate", "app=web;", "--json"]);
    assert.equal(allocated.code, 0, allocated.stderr);
    const { id } = JSON.parse(allocated.stdout);
    await capture.waitFor((out) => out.includes(`"id":${id}`));
    assert.match(capture.stdout, /"type":"synced"/);
  } finally {
    stop.abort();
  }
  assert.equal(await running, 0, capture.stderr);
});

Deno.test("watch on an empty prefix notes it and streams what comes", async () => {
  await using store = await TempStore.create();
  assert.equal((await cli([...store.args, "--prefix", "other", "allocate", "x;"])).code, 0);
  const capture = new Capture();
  const stop = new AbortController();
  const running = main([...store.args, "watch"], { ...capture.io, signal: stop.signal });
  try {
    await capture.waitFor((out) => out.includes('"synced"'));
    assert.match(capture.stderr, /nothing is stored under prefix idalloc.*other/);
    const allocated = await cli([...store.args, "allocate", "app=db;", "--json"]);
    const { id } = JSON.parse(allocated.stdout);
    await capture.waitFor((out) => out.includes(`"id":${id}`));
  } finally {
    stop.abort();
  }
  assert.equal(await running, 0, capture.stderr);
});

Deno.test("watch on a missing KV file ends with 0 when interrupted while waiting", async () => {
  await using store = await TempStore.create();
  const capture = new Capture();
  const stop = new AbortController();
  const running = main([...store.args, "watch"], { ...capture.io, signal: stop.signal });
  const deadline = Date.now() + 15_000;
  while (!capture.stderr.includes("note:")) {
    assert.ok(Date.now() < deadline, "no note on stderr");
    await new Promise((r) => setTimeout(r, 20));
  }
  stop.abort();
  assert.equal(await running, 0, capture.stderr);
  assert.equal(await exists(store.path), false);
});

Deno.test("a relative kv: path under deno task names a file in the caller's directory", async () => {
  await using store = await TempStore.create();
  const repo = new URL("../../", import.meta.url).pathname;
  const out = await new Deno.Command(Deno.execPath(), {
    env: userEnv(),
    clearEnv: true,
    args: [
      "task",
      "--config",
      `${repo}deno.json`,
      "idalloc",
      "--store",
      "kv:here.kv",
      "allocate",
      "app=web;",
    ],
    cwd: store.dir,
    stdout: "piped",
    stderr: "piped",
  }).output();
  const stderr = new TextDecoder().decode(out.stderr);
  assert.equal(out.code, 0, stderr);
  assert.ok(await exists(`${store.dir}/here.kv`), `created in the caller's directory: ${stderr}`);
  assert.equal(await exists(`${repo}here.kv`), false, "not in the repository");
});

Deno.test("kv: an SQLite database without Deno KV's tables is refused, untouched", async () => {
  await using store = await TempStore.create();
  const path = `${store.dir}/other.sqlite`;
  const { DatabaseSync } = await import("node:sqlite");
  const db = new DatabaseSync(path);
  db.exec("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)");
  db.close();
  const before = await Deno.readFile(path);
  for (const command of [["list"], ["allocate", "k;"]]) {
    const result = await cli(["--store", `kv:${path}`, ...command]);
    assert.equal(result.code, 1, result.stderr);
    assert.match(
      result.stderr,
      /is an SQLite database but not a Deno KV store \(it has tables users\)/,
    );
  }
  assert.deepEqual(await Deno.readFile(path), before, "the database is left as it was");
  await Deno.writeTextFile(`${store.dir}/notes.txt`, "hello\n");
  const text = await cli(["--store", `kv:${store.dir}/notes.txt`, "list"]);
  assert.equal(text.code, 1, text.stderr);
  assert.match(text.stderr, /not a Deno KV store \(not an SQLite database\)/);
  // A real Deno KV file still opens.
  assert.equal((await cli([...store.args, "allocate", "k;"])).code, 0);
  assert.equal((await cli([...store.args, "list"])).code, 0);
});

Deno.test("kv: etcd-only flags such as --ca are refused, not ignored", async () => {
  await using store = await TempStore.create();
  for (
    const flags of [["--ca", "ca.pem"], ["--tls-server-name", "x"], [
      "--user",
      "u",
      "--password",
      "p",
    ]]
  ) {
    const result = await cli([...store.args, ...flags, "list"]);
    assert.equal(result.code, 1, result.stderr);
    assert.match(
      result.stderr,
      new RegExp(`${flags[0]} is for etcd; --store kv:.* is a Deno KV store`),
    );
  }
});

Deno.test({
  name: "etcd: allocate --hold ends cleanly with its lease revoked, not left to lapse",
  ignore: etcdUnavailable() !== undefined,
  fn: async () => {
    await using etcd = await startEtcd();
    const args = ["--store", `etcd://${etcd.endpoints[0].replace("http://", "")}`];
    const raw = rawClient(etcd.endpoints);
    const leases = async () => (await raw.leaseClient.leaseLeases({})).leases.length;
    try {
      const capture = new Capture();
      const stop = new AbortController();
      const running = main([...args, "--node", "holder", "allocate", "k;", "--hold", "--json"], {
        ...capture.io,
        signal: stop.signal,
      });
      await capture.waitFor((out) => out.includes('"hold":true'));
      assert.equal(await leases(), 1, "the holder's lease");
      stop.abort();
      assert.equal(await running, 0, capture.stderr);
      assert.match(capture.stdout, /"released":true/);
      assert.equal(await leases(), 0, "no lease left behind");
      const status = await cli([...args, "status", "--json"]);
      assert.deepEqual(JSON.parse(status.stdout).nodes, []);
      // Without --hold the reference is meant to outlive the run by its lease: that one stays.
      assert.equal((await cli([...args, "--node", "n2", "allocate", "k2;"])).code, 0);
      assert.equal(await leases(), 1, "a run without --hold keeps its lease");
    } finally {
      raw.close();
    }
  },
});

testEachBackend("cli: a second release says the same thing on every backend", async (f) => {
  await using fx = await f.create();
  const args = [...fx.spec().cli, "--node", "n2"];
  assert.equal((await cli([...args, "--lease-ttl", "2s", "allocate", "relk;"])).code, 0);
  // `release --node` deletes only a dead node's reference: wait for n2's lease to lapse.
  await untilDead(fx.spec().cli, "n2");
  // Deno KV still has the dead reference (until GC sweeps it); etcd dropped it with the lease.
  const first = await cli([...args, "release", "relk;"]);
  assert.equal(first.code, f.traits.deadReferencesStay ? 0 : 3, first.stderr);
  const second = await cli([...args, "release", "relk;"]);
  assert.equal(second.code, 3, second.stderr);
  // Exactly this line on both backends (etcd used to say "key relk; has no ID").
  assert.equal(second.stderr, "idalloc: node n2 holds no reference to relk;\n");
});

Deno.test("gc says its count in words: gc: 1 ID deleted", async () => {
  await using store = await TempStore.create();
  const args = [...store.args, "--node", "n1"];
  assert.equal((await cli([...args, "--lease-ttl", "2s", "allocate", "gone;"])).code, 0);
  await untilDead(store.args, "n1");
  const gc = await cli([...store.args, "gc", "--grace", "100ms", "--force"]);
  assert.equal(gc.code, 0, gc.stderr);
  assert.match(gc.stderr, /^gc: 1 ID deleted$/m);
});

Deno.test("identity allocate: a label with an empty key is named, not skipped", async () => {
  await using store = await TempStore.create();
  for (const label of ["=x", "k8s:", "k8s:=web"]) {
    const result = await cli([...store.args, "identity", "allocate", "k8s:app=web", label]);
    assert.equal(result.code, 1, result.stderr);
    assert.equal(
      result.stderr,
      `idalloc: label ${JSON.stringify(label)} has an empty key: write [source:]key[=value], ` +
        "e.g. k8s:app=web\n",
    );
  }
  assert.equal(await exists(store.path), false, "nothing was written");
});

Deno.test("bench --help prints its usage and exits 0", async () => {
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", "bench/main.ts", "--help"],
    cwd: new URL("../../", import.meta.url).pathname,
    stdout: "piped",
    stderr: "piped",
  }).output();
  assert.equal(out.code, 0, new TextDecoder().decode(out.stderr));
  const text = new TextDecoder().decode(out.stdout);
  assert.match(text, /^Usage: deno task bench \[group…\] \[--runs N\]/);
  assert.match(text, /inprocess/);
});

Deno.test("a fresh install shows no 'Ignored build scripts' box (protobufjs is denied)", async () => {
  // protobufjs's postinstall only warns about how dependents pin it; it builds nothing, so
  // deno.json denies it instead of leaving every first run to show the warning box.
  await using store = await TempStore.create();
  const repo = new URL("../../", import.meta.url).pathname;
  await Deno.copyFile(`${repo}deno.json`, `${store.dir}/deno.json`);
  await Deno.copyFile(`${repo}deno.lock`, `${store.dir}/deno.lock`);
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["install", "--frozen", "--cached-only"],
    cwd: store.dir,
    stdout: "piped",
    stderr: "piped",
  }).output();
  const text = new TextDecoder().decode(out.stdout) + new TextDecoder().decode(out.stderr);
  assert.equal(out.code, 0, text);
  assert.doesNotMatch(text, /Ignored build scripts/);
});
