/**
 * Issue 28's wording items, through the CLI as a process of its own: usage errors are one line
 * naming the fix; `--password` without `--user` says so (and an exported password leaves the
 * commands without `--user` alone); a bad `IDALLOC_STORE` is named as the variable; the Deno KV
 * doctor's out-of-range findings read as sentences.
 */
import assert from "node:assert/strict";
import { etcdUnavailable, startEtcd } from "../../src/backends/etcd/testing/cluster.ts";
import { cli, runCli, TempStore } from "./_run.ts";

Deno.test("usage errors are one line that names the fix", async () => {
  const cases: Array<[string[], RegExp]> = [
    [["--foo"], /^idalloc: unknown option '--foo'; 'idalloc --help' lists the options$/],
    [["list", "--jsn"], /^idalloc: unknown option '--jsn'; did you mean --json\?$/],
    [
      ["identity", "allocate", "k8s:a", "--bogus"],
      /^idalloc: unknown option '--bogus'; 'idalloc identity allocate --help' lists the options$/,
    ],
    [["allocat", "k"], /^idalloc: unknown command 'allocat'; did you mean allocate\?$/],
    [
      ["frobnicate"],
      /^idalloc: unknown command 'frobnicate'; 'idalloc --help' lists the commands$/,
    ],
    [
      ["allocate"],
      /^idalloc: missing required argument 'key'; usage: idalloc allocate \[options\] <key>$/,
    ],
    [["gc", "--grace"], /^idalloc: option '--grace <duration>' needs a value: --grace <duration>$/],
  ];
  for (const [args, line] of cases) {
    const run = await runCli(args);
    assert.equal(run.code, 1, `${args.join(" ")}: ${run.stderr}`);
    assert.equal(run.stdout, "");
    assert.match(run.stderr.trimEnd(), line, args.join(" "));
    assert.equal(run.stderr.split("\n").length, 2, `one line: ${JSON.stringify(run.stderr)}`);
  }
  // With --json, the same line is the message of one JSON object.
  const json = await runCli(["list", "--jsn", "--json"]);
  assert.deepEqual(JSON.parse(json.stderr), {
    error: { code: 1, name: "UsageError", message: "unknown option '--jsn'; did you mean --json?" },
  });
});

Deno.test("a bad IDALLOC_STORE or IDALLOC_PREFIX is named as the variable", async () => {
  const store = await runCli(["list"], { IDALLOC_STORE: "bogus" });
  assert.equal(store.code, 1, store.stderr);
  assert.match(
    store.stderr,
    /^idalloc: invalid option: IDALLOC_STORE \(--store from the environment\) must be kv:<file>/,
  );
  const prefix = await runCli(["list"], { IDALLOC_STORE: "kv:./none.kv", IDALLOC_PREFIX: "" });
  assert.match(prefix.stderr, /IDALLOC_PREFIX \(--prefix from the environment\) must not be empty/);
  // Given on the command line, the flag is named.
  assert.match((await cli(["--store", "bogus", "list"])).stderr, /: --store must be kv:<file>/);
});

Deno.test({
  name: "etcd: --password needs --user; an exported IDALLOC_ETCD_PASSWORD is used only with --user",
  ignore: etcdUnavailable() !== undefined,
  fn: async () => {
    await using etcd = await startEtcd();
    const base = ["--store", `etcd://${etcd.endpoints[0].replace("http://", "")}`];
    const password = await cli([...base, "--password", "x", "list"]);
    assert.equal(password.code, 1);
    assert.equal(password.stderr, "idalloc: invalid option: --password needs --user\n");
    const user = await cli([...base, "--user", "root", "list"]);
    assert.equal(
      user.stderr,
      "idalloc: invalid option: --user needs --password (or IDALLOC_ETCD_PASSWORD)\n",
    );
    // An etcd without authentication: the exported password does not get in the way.
    const env = { IDALLOC_ETCD_PASSWORD: "s3cret" };
    const allocated = await runCli([...base, "allocate", "k;", "--json"], env);
    assert.equal(allocated.code, 0, allocated.stderr);
    const listed = await runCli([...base, "list", "--json"], env);
    assert.equal(listed.code, 0, listed.stderr);
    assert.equal(JSON.parse(listed.stdout)[0].key, "k;");
    // With --user it is the password: this etcd has authentication off, and says so.
    const withUser = await runCli([...base, "--user", "root", "list"], env);
    assert.equal(withUser.code, 1);
    assert.match(withUser.stderr, /has authentication turned off/);
  },
});

Deno.test("kv doctor: an index or reference out of range reads as one sentence", async () => {
  await using store = await TempStore.create();
  const run = await cli([...store.args, "--min", "2000", "--max", "3000", "allocate", "k;"]);
  assert.equal(run.code, 0, run.stderr);
  const id = Number(/^ID (\d+)/.exec(run.stdout)![1]);
  const doctor = await cli([...store.args, "--max", "1000", "doctor", "--json"]);
  const reasons = (JSON.parse(doctor.stdout) as { kind: string; reason: string }[])
    .map((f) => [f.kind, f.reason]).sort();
  const reason = `ID ${id} is outside the valid range [256, 1000]`;
  assert.deepEqual(reasons, [
    ["index-out-of-range", reason],
    ["reference-out-of-range", reason],
  ]);
});
