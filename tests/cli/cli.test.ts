/**
 * The CLI in-process on a real Deno KV file: every command, its output for people and for
 * scripts, its exit codes and its one-line errors.
 */
import assert from "node:assert/strict";
import { Allocator, DenoKvBackend } from "../../mod.ts";
import { main } from "../../src/cli/main.ts";
import { freePort } from "../../src/backends/etcd/testing/cluster.ts";
import { Capture, cli, isOneLineError, TempStore, untilDead } from "./_run.ts";

const COMMANDS = [
  ["allocate"],
  ["release"],
  ["get"],
  ["get-id"],
  ["list"],
  ["watch"],
  ["gc"],
  ["status"],
  ["refs"],
  ["completion"],
  ["identity"],
  ["identity", "allocate"],
  ["identity", "release"],
  ["identity", "get"],
  ["identity", "list"],
];

Deno.test("--help works on every command and documents the exit codes", async () => {
  const top = await cli(["--help"]);
  assert.equal(top.code, 0);
  assert.match(top.stdout, /Usage: idalloc/);
  assert.match(top.stdout, /Exit codes:[\s\S]*2 +store unavailable/);
  for (const command of COMMANDS) {
    const { code, stdout } = await cli([...command, "--help"]);
    assert.equal(code, 0, command.join(" "));
    assert.match(stdout, new RegExp(`Usage: idalloc ${command.join(" ")}`));
    // The command's own options first; the global ones named once at the end, not explained.
    const own = stdout.indexOf("Options:");
    const global = stdout.indexOf("Global options (see idalloc --help): --store --prefix");
    assert.ok(own >= 0 && global > own, `${command.join(" ")}:\n${stdout}`);
    assert.doesNotMatch(stdout, /--store <spec>/, "global options are not repeated in full");
    assert.ok(stdout.split("\n").length < 30, `${command.join(" ")} help is short`);
  }
  assert.match(top.stdout, /--store <spec>/, "the top-level help explains the global options");
});

Deno.test("allocate, get, get-id and list agree, for people and for scripts", async () => {
  await using store = await TempStore.create();
  const first = await cli([...store.args, "allocate", "app=web;", "--json"]);
  assert.equal(first.code, 0, first.stderr);
  const { id, isNew, node } = JSON.parse(first.stdout);
  assert.equal(isNew, true);
  assert.match(node, /^cli-/);
  assert.ok(id >= 256 && id <= 65535);

  const again = await cli([...store.args, "allocate", "app=web;"]);
  assert.equal(again.code, 0);
  assert.equal(again.stdout, `ID ${id} for app=web; (existing)\n`);
  assert.match(again.stderr, /lease lapses/, "says how long the CLI's reference lives");

  const db = JSON.parse((await cli([...store.args, "allocate", "app=db;", "--json"])).stdout);
  assert.notEqual(db.id, id);

  assert.deepEqual(await cli([...store.args, "get", "app=web;"]), {
    code: 0,
    stdout: `${id}\n`,
    stderr: "",
  });
  assert.deepEqual(await cli([...store.args, "get-id", String(db.id)]), {
    code: 0,
    stdout: "app=db;\n",
    stderr: "",
  });
  assert.deepEqual(JSON.parse((await cli([...store.args, "get", "app=db;", "--json"])).stdout), {
    key: "app=db;",
    id: db.id,
  });

  const table = await cli([...store.args, "list"]);
  assert.equal(table.code, 0);
  const lines = table.stdout.trimEnd().split("\n");
  assert.match(lines[0], /^ID +KEY$/);
  const expected = [[id, "app=web;"], [db.id, "app=db;"]].sort((a, b) =>
    Number(a[0]) - Number(b[0])
  );
  assert.deepEqual(
    lines.slice(1).map((l) => l.split(/ +/)),
    expected.map(([i, k]) => [String(i), k]),
  );
  assert.match(table.stderr, /2 IDs under prefix idalloc/);

  const json = await cli([...store.args, "list", "--json"]);
  assert.deepEqual(JSON.parse(json.stdout), expected.map(([i, k]) => ({ id: i, key: k })));
});

Deno.test("errors are one line with a documented exit code, never a stack trace", async () => {
  await using store = await TempStore.create();
  assert.equal((await cli([...store.args, "allocate", "app=web;"])).code, 0);
  const cases: Array<[string[], number, RegExp]> = [
    [[...store.args, "get", "app=nope;"], 3, /key app=nope; has no ID/],
    [[...store.args, "get-id", "99999"], 3, /ID 99999 is not allocated/],
    [[...store.args, "get-id", "abc"], 1, /ID 'abc' is not a positive whole number/],
    [[...store.args, "get-id", "0"], 1, /ID 0 is not a positive whole number/],
    [
      [...store.args, "get-id", "99999999999999999999"],
      1,
      /^idalloc: ID 99999999999999999999 is too large: IDs go up to 9007199254740991$/m,
    ],
    [[...store.args, "--min", "-5", "list"], 1, /--min must be at least 1, got -5$/m],
    [[...store.args, "--min", "1.5", "list"], 1, /--min must be a whole number, got '1.5'/],
    [
      [...store.args, "--prefix", "[]", "list"],
      1,
      /--prefix must be a non-empty JSON array of non-empty strings and numbers, got \[\]/,
    ],
    [[...store.args, "allocate", "bad\uFFFD"], 1, /argument 8 .* is not valid UTF-8/],
    [[...store.args, "identity", "allocate", "k8s:a=b", "k8s:a=c"], 1, /same key 'a'/],
    [[...store.args, "completion", "tcsh"], 1, /no completion for shell 'tcsh'/],
    [[...store.args, "allocate", ""], 1, /key must be a non-empty string/],
    [
      [...store.args, "--prefix", "other", "gc"],
      1,
      /nothing is stored under prefix other.*idalloc/,
    ],
    [[...store.args, "--prefix", "other", "get", "app=web;"], 1, /wrong --prefix\?/],
    [[...store.args, "--prefix", "a//b", "list"], 1, /empty part/],
    [
      ["--store", `kv:${store.dir}/missing.kv`, "get", "k"],
      1,
      /there is no Deno KV file at .*missing\.kv yet: nothing was allocated there/,
    ],
    [["--store", "redis://x", "list"], 1, /--store must be kv:<file>/],
    [[...store.args, "--timeout", "5x", "list"], 1, /--timeout must be a duration/],
    [[...store.args, "--min", "100", "--max", "10", "list"], 1, /--max must be greater than --min/],
    [[...store.args, "gc", "--every", "soon"], 1, /--every must be a duration/],
    [
      ["--store", `kv:${store.path}`, "--lease-ttl", "2s", "list"],
      1,
      /--lease-ttl \(2s\) must be at least twice --clock-skew \(5s\) on Deno KV/,
    ],
    [["bogus"], 1, /unknown command 'bogus'/],
    [["list", "--bogus"], 1, /unknown option '--bogus'/],
    [["get"], 1, /missing required argument 'key'/],
    [[...store.args, "identity", "allocate", "k8s:a;b"], 1, /;/],
    [[...store.args, "identity", "allocate", "k8s:a", "--cluster-id", "x"], 1, /--cluster-id must/],
    [
      ["--store", `etcd://127.0.0.1:${await freePort()}`, "get", "k"],
      2,
      /^idalloc: store unavailable: etcd at http:\/\/127\.0\.0\.1:\d+ refused the connection: /m,
    ],
    [
      ["--store", "kv:/proc/no/such/dir/ids.kv", "allocate", "k"],
      1,
      /--store kv:\/proc\/no\/such\/dir\/ids\.kv: directory \/proc\/no\/such\/dir does not exist/,
    ],
  ];
  for (const [args, code, message] of cases) {
    const result = await cli(args);
    assert.equal(result.code, code, `${args.join(" ")}: ${result.stderr}`);
    assert.match(result.stderr, message, args.join(" "));
    assert.ok(isOneLineError(result.stderr), `one line for ${args.join(" ")}:\n${result.stderr}`);
    if (code !== 3) assert.equal(result.stdout, "", args.join(" "));
  }
});

Deno.test("release deletes a dead node's reference, never a live one's; gc then collects the ID", async () => {
  await using store = await TempStore.create();
  // web's run leaves a reference whose lease lapses soon; db's lives on for a minute.
  const web = JSON.parse(
    (await cli([...store.args, "--lease-ttl", "500ms", "allocate", "app=web;", "--json"])).stdout,
  );
  const db = JSON.parse((await cli([...store.args, "allocate", "app=db;", "--json"])).stdout);
  const usage = async () =>
    JSON.parse((await cli([...store.args, "status", "--usage", "--json"])).stdout).usage;

  const anonymous = await cli([...store.args, "release", "app=web;"]);
  assert.equal(anonymous.code, 1);
  assert.match(anonymous.stderr, /release needs --node/);

  const live = await cli([...store.args, "release", "app=db;", "--node", db.node, "--json"]);
  assert.equal(live.code, 4, live.stderr);
  assert.equal(JSON.parse(live.stderr).error.name, "LiveEntryError");
  await untilDead(store.args, web.node);
  assert.deepEqual(await usage(), { inUse: 1, unused: 1 });

  const released = await cli([...store.args, "release", "app=web;", "--node", web.node, "--json"]);
  assert.equal(released.code, 0, released.stderr);
  assert.deepEqual(JSON.parse(released.stdout), {
    key: "app=web;",
    id: web.id,
    node: web.node,
    released: true,
  });
  assert.deepEqual(await usage(), { inUse: 1, unused: 1 });
  const twice = await cli([...store.args, "release", "app=web;", "--node", web.node]);
  assert.equal(twice.code, 3);
  assert.match(twice.stderr, /holds no reference/);
  assert.equal((await cli([...store.args, "release", "app=x;", "--node", "n"])).code, 3);

  const gc = await cli([...store.args, "gc", "--grace", "0s", "--force", "--json"]);
  assert.equal(gc.code, 0, gc.stderr);
  const passes = gc.stdout.trim().split("\n").map((l) => JSON.parse(l));
  assert.equal(passes.length, 2);
  assert.deepEqual(passes[0].deleted, [], "the first pass only marks");
  assert.equal(passes[0].marked, 1);
  assert.deepEqual(passes[1].deleted, [{ id: web.id, key: "app=web;" }]);
  assert.equal((await cli([...store.args, "get", "app=web;"])).code, 3);
  assert.equal((await cli([...store.args, "get", "app=db;"])).stdout, `${db.id}\n`);

  const human = await cli([...store.args, "gc", "--grace", "0s", "--force"]);
  assert.equal(human.code, 0);
  assert.match(human.stdout, /pass 1: 0 deleted, 0 unused \(marked\), 1 remain/);
  assert.match(human.stderr, /gc: 0 IDs deleted/);
});

Deno.test("watch prints replay, synced and live changes as JSON lines until interrupted", async () => {
  await using store = await TempStore.create();
  const web = JSON.parse((await cli([...store.args, "allocate", "app=web;", "--json"])).stdout);
  const stop = new AbortController();
  const capture = new Capture();
  const running = main([...store.args, "watch"], { ...capture.io, signal: stop.signal });
  const quiet = new AbortController();
  const noReplay = new Capture();
  const runningQuiet = main([...store.args, "watch", "--no-replay"], {
    ...noReplay.io,
    signal: quiet.signal,
  });
  try {
    await capture.waitFor((out) => out.includes('{"type":"synced"}'));
    await noReplay.waitFor((out) => out.includes('{"type":"synced"}'));
    const api = JSON.parse(
      (await cli([...store.args, "--lease-ttl", "500ms", "allocate", "app=api;", "--json"]))
        .stdout,
    );
    await capture.waitFor((out) => out.includes('"key":"app=api;"'));
    await untilDead(store.args, api.node);
    await cli([...store.args, "release", "app=api;", "--node", api.node]);
    await cli([...store.args, "gc", "--grace", "0s", "--force"]);
    await capture.waitFor((out) => out.includes('"type":"delete"'));
    await noReplay.waitFor((out) => out.includes('"type":"delete"'));
    const events = capture.stdout.trim().split("\n").map((l) => JSON.parse(l));
    assert.deepEqual(events, [
      { type: "upsert", id: web.id, key: "app=web;" },
      { type: "synced" },
      { type: "upsert", id: api.id, key: "app=api;" },
      { type: "delete", id: api.id, key: "app=api;" },
    ]);
    assert.deepEqual(noReplay.stdout.trim().split("\n").map((l) => JSON.parse(l)), events.slice(1));
  } finally {
    stop.abort();
    quiet.abort();
    assert.equal(await running, 0);
    assert.equal(await runningQuiet, 0);
  }
});

Deno.test("allocate --hold keeps the reference until interrupted, then releases it", async () => {
  await using store = await TempStore.create();
  const stop = new AbortController();
  const capture = new Capture();
  const running = main([...store.args, "allocate", "app=held;", "--hold", "--json"], {
    ...capture.io,
    signal: stop.signal,
  });
  const usage = async () =>
    JSON.parse((await cli([...store.args, "status", "--usage", "--json"])).stdout).usage;
  try {
    await capture.waitFor((out) => out.includes('"id"'));
    assert.deepEqual(await usage(), { inUse: 1, unused: 0 });
  } finally {
    stop.abort();
    assert.equal(await running, 0);
  }
  const [held, released] = capture.stdout.trim().split("\n").map((l) => JSON.parse(l));
  assert.equal(held.hold, true);
  assert.deepEqual(released, { key: "app=held;", id: held.id, released: true, node: held.node });
  assert.deepEqual(await usage(), { inUse: 0, unused: 1 });
});

Deno.test("a one-shot command interrupted before it finishes exits 130", async () => {
  await using store = await TempStore.create();
  await cli([...store.args, "allocate", "app=web;"]);
  const result = await cli([...store.args, "list"], AbortSignal.abort());
  assert.equal(result.code, 130);
  assert.equal(result.stderr, "idalloc: interrupted\n");
});

Deno.test("list is complete and sorted on a few thousand IDs, with progress on request", async () => {
  await using store = await TempStore.create();
  const count = 2_000;
  {
    using kv = await Deno.openKv(store.path);
    const backend = new DenoKvBackend(kv, { prefix: ["idalloc"], node: "filler" });
    await using alloc = await Allocator.open(backend, { min: 1, max: 100_000 });
    const keys = Array.from({ length: count }, (_, i) => `k8s:app=svc-${i};`);
    for (let i = 0; i < keys.length; i += 100) {
      await Promise.all(keys.slice(i, i + 100).map((k) => alloc.allocate(k)));
    }
  }
  const result = await cli([...store.args, "list", "--json", "--progress"]);
  assert.equal(result.code, 0);
  const rows: Array<{ id: number; key: string }> = JSON.parse(result.stdout);
  assert.equal(rows.length, count);
  assert.equal(new Set(rows.map((r) => r.key)).size, count);
  assert.ok(rows.every((r, i) => i === 0 || rows[i - 1].id < r.id), "sorted by ID");
  assert.match(result.stderr, new RegExp(`listed ${count} IDs`));
  const quiet = await cli([...store.args, "list", "--json"]);
  assert.equal(quiet.stderr, "", "no progress when stderr is not a terminal");
});

Deno.test("status reports reachability, IDs and node leases", async () => {
  await using store = await TempStore.create();
  const web = JSON.parse((await cli([...store.args, "allocate", "app=web;", "--json"])).stdout);
  const result = await cli([...store.args, "status", "--json"]);
  assert.equal(result.code, 0, result.stderr);
  const status = JSON.parse(result.stdout);
  assert.equal(status.backend, "deno-kv");
  assert.equal(status.prefix, "idalloc");
  assert.equal(status.reachable, true);
  assert.equal(status.ids, 1);
  assert.equal(status.minId, web.id);
  assert.deepEqual(status.usage, { inUse: 1, unused: 0 });
  assert.deepEqual(status.references, { total: 1, live: 1 });
  assert.deepEqual(status.nodes.map((n: { node: string; live: boolean }) => [n.node, n.live]), [
    [web.node, true],
  ]);
  // The counters an allocator's metrics also report, under their names.
  const { "idalloc.store.operation.duration": latency, ...metrics } = status.metrics;
  assert.deepEqual(metrics, {
    "idalloc.ids.free": 65535 - 256 + 1 - 1,
    "idalloc.keys.held": { [web.node]: 1 },
    "idalloc.healthy": 1,
  });
  assert.ok(latency > 0 && latency < 30);
  const human = await cli([...store.args, "status"]);
  assert.match(human.stdout, /^store +deno-kv /m);
  assert.match(human.stdout, /^metrics +idalloc\.ids\.free 65279 \(of 65280 in 256–65535\)$/m);
  assert.match(human.stdout, new RegExp(`^ +idalloc\\.keys\\.held ${web.node} 1$`, "m"));
  assert.match(human.stdout, new RegExp(`${web.node}: live`));
  const wrong = await cli([...store.args, "--prefix", "nope", "status"]);
  assert.equal(wrong.code, 0, "an empty prefix is a status, not an error");
  assert.match(wrong.stderr, /note: nothing is stored under prefix nope .*idalloc/);
  assert.match(wrong.stdout, /^IDs +none$/m);
});

Deno.test("identity allocate and list: global, reserved and node-local identities", async () => {
  await using store = await TempStore.create();
  const global = await cli([
    ...store.args,
    "identity",
    "allocate",
    "k8s:io.kubernetes.pod.namespace=prod",
    "k8s:app=web",
    "--json",
  ]);
  assert.equal(global.code, 0, global.stderr);
  const web = JSON.parse(global.stdout);
  assert.equal(web.scope, "global");
  assert.equal(web.isNew, true);
  assert.ok(web.id >= 256 && web.id <= 65535);
  assert.deepEqual(web.labels, ["k8s:app=web", "k8s:io.kubernetes.pod.namespace=prod"]);
  const host = JSON.parse(
    (await cli([...store.args, "identity", "allocate", "reserved:host", "--json"])).stdout,
  );
  assert.deepEqual([host.id, host.scope], [1, "reserved"]);
  const cidr = JSON.parse(
    (await cli([...store.args, "identity", "allocate", "cidr:10.0.0.0/8", "--json"])).stdout,
  );
  assert.equal(cidr.scope, "node-local");
  assert.equal(cidr.id, 0x01000001);

  const list = await cli([...store.args, "identity", "list", "--json"]);
  assert.deepEqual(JSON.parse(list.stdout), [{ id: web.id, labels: web.labels }]);
  const table = await cli([...store.args, "identity", "list", "--reserved"]);
  assert.match(table.stdout, /^1 +reserved:host$/m);
  assert.match(
    table.stdout,
    new RegExp(`^${web.id} +k8s:app=web,k8s:io.kubernetes.pod.namespace=prod$`, "m"),
  );

  // The stored key is Cilium's kvstore string, so the plain commands see it too.
  assert.equal(
    (await cli([...store.args, "get-id", String(web.id)])).stdout,
    "k8s:app=web;k8s:io.kubernetes.pod.namespace=prod;\n",
  );
});

Deno.test("--verbose prints the library's log and leaves logging unconfigured afterwards", async () => {
  await using store = await TempStore.create();
  const result = await cli([...store.args, "allocate", "app=web;", "--verbose"]);
  assert.equal(result.code, 0, result.stderr);
  const again = await cli([...store.args, "allocate", "app=db;", "--verbose"]);
  assert.equal(again.code, 0, again.stderr);
  assert.doesNotMatch(again.stderr, /ignored/);
});

Deno.test("gc --every runs one pass per interval until interrupted", async () => {
  await using store = await TempStore.create();
  const web = JSON.parse(
    (await cli([...store.args, "--lease-ttl", "500ms", "allocate", "app=web;", "--json"])).stdout,
  );
  await untilDead(store.args, web.node);
  await cli([...store.args, "release", "app=web;", "--node", web.node]);
  const stop = new AbortController();
  const capture = new Capture();
  const running = main([...store.args, "gc", "--every", "20ms", "--force", "--json"], {
    ...capture.io,
    signal: stop.signal,
  });
  try {
    await capture.waitFor((out) => out.includes('"pass":3'));
  } finally {
    stop.abort();
  }
  assert.equal(await running, 0);
  const passes = capture.stdout.trim().split("\n").map((l) => JSON.parse(l));
  assert.deepEqual(passes[0].deleted, []);
  assert.deepEqual(passes[1].deleted, [{ id: web.id, key: "app=web;" }]);
  assert.ok(passes.slice(2).every((p) => p.deleted.length === 0 && p.alive === 0));
  // The namespace still exists (its change counter stays), so an empty list is not an error.
  const list = await cli([...store.args, "list", "--json"]);
  assert.deepEqual([list.code, list.stdout], [0, "[]\n"]);
});

Deno.test("--json: errors are one JSON line on stderr, with the exit code", async () => {
  await using store = await TempStore.create();
  await cli([...store.args, "allocate", "app=web;"]);
  const cases: Array<[string[], number, string, RegExp]> = [
    [[...store.args, "get-id", "99999"], 3, "NotFound", /ID 99999 is not allocated/],
    [[...store.args, "get", "app=none;"], 3, "NotFound", /key app=none; has no ID/],
    [[...store.args, "--min", "-5", "list"], 1, "InvalidOptionsError", /--min must be at least 1/],
    [[...store.args, "list", "--bogus"], 1, "UsageError", /unknown option '--bogus'/],
    [[...store.args, "--prefix", "nope", "gc"], 1, "InvalidOptionsError", /nothing is stored/],
  ];
  for (const [args, code, name, message] of cases) {
    const result = await cli([...args, "--json"]);
    assert.equal(result.code, code, `${args.join(" ")}: ${result.stderr}`);
    assert.equal(result.stdout, "");
    const lines = result.stderr.trim().split("\n");
    assert.equal(lines.length, 1, result.stderr);
    const { error } = JSON.parse(lines[0]);
    assert.equal(error.code, code);
    assert.equal(error.name, name);
    assert.match(error.message, message);
  }
});

/** Runs the bash completion function for `line` (the word being completed is the last one). */
async function complete(script: string, line: string): Promise<string[]> {
  const words = line.split(" ");
  const program = `${script}
COMP_WORDS=(${words.map((w) => `'${w}'`).join(" ")})
COMP_CWORD=${words.length - 1}
_idalloc
printf '%s\\n' "\${COMPREPLY[@]}"`;
  const out = await new Deno.Command("bash", {
    args: ["--norc", "--noprofile", "-c", program],
    cwd: "/",
    stdout: "piped",
    stderr: "piped",
  }).output();
  assert.equal(out.code, 0, new TextDecoder().decode(out.stderr));
  return new TextDecoder().decode(out.stdout).split("\n").filter((l) => l !== "");
}

Deno.test("completion: bash completes commands, subcommands, options and values", async () => {
  const bash = await cli(["completion", "bash"]);
  assert.equal(bash.code, 0, bash.stderr);
  const script = bash.stdout;
  assert.deepEqual(await complete(script, "idalloc al"), ["allocate"]);
  assert.deepEqual(await complete(script, "idalloc identity g"), ["get"]);
  assert.deepEqual(await complete(script, "idalloc --store kv:x.kv identity l"), ["list"]);
  assert.deepEqual(await complete(script, "idalloc gc --ev"), ["--every"]);
  assert.deepEqual(await complete(script, "idalloc refs --by"), ["--by-node"]);
  assert.ok((await complete(script, "idalloc list --st")).includes("--store"), "global options");
  assert.deepEqual(await complete(script, "idalloc completion "), ["bash", "zsh", "fish"]);
  assert.deepEqual(await complete(script, "idalloc --store "), [], "no guesses for a value");
  assert.ok((await complete(script, "idalloc --ca /e")).includes("/etc"), "files after --ca");

  const zsh = await cli(["completion", "zsh"]);
  assert.match(zsh.stdout, /^#compdef idalloc\n/);
  assert.match(zsh.stdout, /bashcompinit/);
  assert.match(zsh.stdout, /complete -F _idalloc idalloc/);
  const fish = await cli(["completion", "fish"]);
  assert.match(fish.stdout, /complete -c idalloc -n '__fish_use_subcommand' -a allocate -d /);
  assert.match(fish.stdout, /complete -c idalloc -n '__fish_seen_subcommand_from identity' -a get/);
  assert.match(fish.stdout, /complete -c idalloc -l ca -rF /);
  assert.match(fish.stdout, /complete -c idalloc -n '__fish_seen_subcommand_from gc' -l every -r/);
});

Deno.test("the command line reference lists every option of every command", async () => {
  const page = await Deno.readTextFile(new URL("../../docs/cli.md", import.meta.url));
  // Its options table: from its heading to the next one.
  const start = page.indexOf("\n## Options\n");
  assert.ok(start > 0, "docs/cli.md has an Options section");
  const section = page.slice(start, page.indexOf("\n## ", start + 1));
  // The completion script is generated from the parser: every flag it knows, per command.
  const script = (await cli(["completion", "bash"])).stdout;
  const flags = new Set(script.match(/--[a-z][a-z-]*/g));
  for (const flag of flags) assert.ok(section.includes(flag), `docs/cli.md's options miss ${flag}`);
  assert.ok(flags.size > 25, `${flags.size} flags`);
});

Deno.test("counts are said in words: 1 ID, 2 IDs", async () => {
  await using store = await TempStore.create();
  await cli([...store.args, "allocate", "only;"]);
  const one = await cli([...store.args, "list"]);
  assert.match(one.stderr, /^1 ID under prefix idalloc/m);
  const refs = await cli([...store.args, "refs"]);
  assert.match(refs.stderr, /^1 reference \(1 live, 0 dead\) to 1 key from 1 node/m);
});
