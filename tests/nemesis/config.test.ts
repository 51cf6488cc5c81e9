// The nemesis command line: the fault list (names, garbage kinds and removals, as .ci/run and
// docs/nemesis.md use them), the bounds of a run, the header's fault list and usage errors.
import assert from "node:assert/strict";
import { FAULT_KINDS, faultKindsOf, GARBAGE_KINDS } from "../../nemesis/backends.ts";
import {
  faultSeconds,
  faultsOf,
  MIN_FAULT_SECONDS,
  minSeconds,
  NemesisUsageError,
  optionsForRun,
  OVERHEAD,
  parseFaults,
  parseOptions,
} from "../../nemesis/config.ts";
import { runCommand } from "../_support/commands.ts";
import { BACKENDS } from "../../src/backends/registry.ts";

Deno.test("nemesis faults: the kinds are what the registry's harnesses offer, in its order", () => {
  // `--faults` and `--help` list them as they did when the list was the nemesis's own.
  assert.deepEqual(FAULT_KINDS, [
    "kill",
    "stall",
    "lease-revoke",
    "garbage",
    "compact",
    "kill-follower",
    "kill-leader",
    "outage",
    "apiserver-restart",
    "etcd-restart",
    "watch-expiry",
  ]);
  assert.deepEqual(GARBAGE_KINDS, [
    "non-numeric-id",
    "empty-master",
    "bad-ref",
    "invalid-utf8",
    "oversized",
    "orphan-ref",
    "bad-index",
    "bad-counter",
    "bad-claim",
    "stale-claim",
    "bad-lease",
    "forged-lease",
    "bad-endpoint",
  ]);
  assert.deepEqual(
    [...new Set(BACKENDS.flatMap((b) => faultKindsOf(b.kind)))].sort(),
    [...FAULT_KINDS].sort(),
  );
});

Deno.test("nemesis faults: 'all', and removals that start from everything", () => {
  assert.deepEqual([...parseFaults("all").faults], [...FAULT_KINDS]);
  const { faults, garbage } = parseFaults("-stall,-garbage/bad-index,-garbage/oversized");
  assert.ok(!faults.has("stall") && faults.has("kill") && faults.has("garbage"));
  assert.deepEqual(
    [...garbage],
    GARBAGE_KINDS.filter((g) => g !== "bad-index" && g !== "oversized"),
  );
});

Deno.test("nemesis faults: a list of names, one garbage kind, no garbage at all", () => {
  const only = parseFaults("stall,garbage/orphan-ref");
  assert.deepEqual([...only.faults], ["stall", "garbage"]);
  assert.deepEqual([...only.garbage], ["orphan-ref"]);
  const none = parseFaults("-garbage");
  assert.ok(!none.faults.has("garbage"));
  assert.equal(none.garbage.size, 0);
});

Deno.test("nemesis faults: unknown names are refused", () => {
  assert.throws(() => parseFaults("stal"), /unknown fault 'stal'/);
  assert.throws(() => parseFaults("garbage/huge"), /unknown garbage kind 'huge'/);
});

const ROOT = new URL("../../", import.meta.url).pathname;

Deno.test("nemesis --seconds bounds the whole run: each backend's share holds its fault phase and the rest", () => {
  const kv = parseOptions(["--backend", "deno-kv", "--seconds", "20"])!;
  assert.equal(kv.totalSeconds, 20);
  assert.equal(kv.runs.length, 1);
  const [run] = kv.runs;
  assert.equal(run.seconds, 20);
  assert.ok(run.faultSeconds >= MIN_FAULT_SECONDS, `${run.faultSeconds} s of faults`);
  assert.ok(run.faultSeconds + OVERHEAD["deno-kv"].fixed <= 20, `${run.faultSeconds} s of faults`);
  assert.equal(optionsForRun(kv, run).seconds, run.faultSeconds, "runBackend's fault phase");
  assert.equal(kv.growthOps, 0, "no growth run unless asked for");
  // Every backend together needs more than the default 60 s: the default grows to fit them.
  const all = parseOptions([])!;
  assert.equal(all.totalSeconds, 150);
  assert.deepEqual(all.runs.map((r) => [r.backend, r.seconds]), [
    ["deno-kv", 50],
    ["etcd", 50],
    ["k8s", 50],
  ]);
  assert.equal(parseOptions(["--backend", "etcd"])!.totalSeconds, 60);
  for (const r of all.runs) {
    assert.ok(r.faultSeconds >= MIN_FAULT_SECONDS);
    assert.ok(r.faultSeconds + OVERHEAD[r.backend].fixed <= r.seconds, JSON.stringify(r));
    assert.equal(faultSeconds(r.backend, minSeconds(r.backend)), MIN_FAULT_SECONDS);
  }
});

Deno.test("nemesis: .ci/run's invocations still parse, with their growth run", async () => {
  const ci = await Deno.readTextFile(`${ROOT}.ci/run`);
  // As bash reads it: a backslash at the end of a line continues the command.
  const lines = [...ci.replace(/\\\n\s*/g, " ").matchAll(/task nemesis (.*)$/gm)].map((m) => m[1]);
  assert.ok(lines.length >= 2, "CI runs the nemesis");
  // CI loops over the registry's kinds (through a shell function): each line runs once per backend.
  for (const line of lines) {
    for (const kind of BACKENDS.map((b) => b.kind)) {
      const seconds = kind === "k8s" ? "90" : "60"; // the function's `seconds` per backend
      const args = line.replace(/"\$\{[A-Z_]+\}"/g, "all").replace(/"\$(kind|1)"/, kind)
        .replace(/"\$seconds"/, seconds).split(/\s+/);
      const o = parseOptions(args)!;
      assert.deepEqual(o.runs.map((r) => r.backend), [kind], line);
      // The default workload's runs carry a growth run; the key-side runs do not.
      assert.equal(o.growthOps, o.workload === "keyside" ? 0 : 10_000, line);
      // Every backend gets 40 s of faults or more: Kubernetes' API server takes longest to start.
      assert.ok(o.runs.every((r) => r.faultSeconds >= 40), `${kind}: ${line}`);
    }
  }
});

Deno.test("nemesis: the header lists only the chosen backend's faults", () => {
  const o = parseOptions(["--backend", "deno-kv"])!;
  const kv = faultsOf("deno-kv", o);
  const storeFaults = FAULT_KINDS.filter((f) => !faultKindsOf("deno-kv").includes(f));
  assert.deepEqual(storeFaults, [
    "compact",
    "kill-follower",
    "kill-leader",
    "outage",
    "apiserver-restart",
    "etcd-restart",
    "watch-expiry",
  ]);
  for (const f of storeFaults) assert.ok(!kv.includes(f), `${f} in deno-kv's ${kv}`);
  assert.match(kv, /bad-index/);
  const etcd = faultsOf("etcd", o);
  assert.match(etcd, /kill-leader/);
  assert.doesNotMatch(etcd, /bad-index|bad-counter|apiserver-restart|bad-claim/);
  const k8s = faultsOf("k8s", o);
  assert.match(k8s, /apiserver-restart, etcd-restart, watch-expiry/);
  assert.match(k8s, /bad-claim/);
  assert.doesNotMatch(k8s, /kill-leader|invalid-utf8|bad-index/);
  assert.equal(
    faultsOf("deno-kv", parseOptions(["--backend", "deno-kv", "--faults", "compact"])!),
    "none",
  );
});

Deno.test("nemesis: mistakes on the command line are NemesisUsageErrors in plain words", () => {
  const cases: [string[], RegExp][] = [
    [
      ["--seconds", "abc"],
      /^--seconds takes a whole number of seconds from 1 to 86400, not 'abc'$/,
    ],
    [["--seconds", "1.5"], /^--seconds takes a whole number/],
    [
      ["--backend", "deno-kv", "--seconds", "12"],
      /^--seconds 12 is too short for deno-kv: it needs at least \d+ /,
    ],
    [["--seconds", "30"], /^--seconds 30 is too short for every backend/],
    [
      ["--backend", "redis"],
      /^--backend takes deno-kv, etcd, k8s, doublewrite or all, not 'redis'$/,
    ],
    // One name per backend: the old short name is gone.
    [["--backend", "kv"], /^--backend takes deno-kv, etcd, k8s, doublewrite or all, not 'kv'$/],
    [["--nodes", "2"], /^--nodes 2: 3 or more nodes in all \(Cilium's included\)$/],
    [["--growth", "-1"], /^--growth needs a value|^--growth takes/],
    [["--bogus"], /^unknown option --bogus \(see --help\)$/],
    [["extra"], /^unexpected argument 'extra'/],
    [["--seconds"], /^--seconds needs a value/],
  ];
  for (const [args, message] of cases) {
    assert.throws(
      () => parseOptions(args),
      (err: unknown) =>
        err instanceof NemesisUsageError && err.name === "NemesisUsageError" &&
        message.test(err.message) && !err.message.includes("\n"),
      args.join(" "),
    );
  }
});

Deno.test("nemesis: a usage error exits 1 with one line; --help gives the bounds", async () => {
  const run = (...args: string[]) =>
    runCommand(Deno.execPath(), {
      args: ["run", "-A", `${ROOT}nemesis/main.ts`, ...args],
      cwd: ROOT,
    });
  const bad = await run("--seconds", "abc");
  assert.equal(bad.code, 1);
  assert.equal(
    bad.stderr,
    "nemesis: --seconds takes a whole number of seconds from 1 to 86400, not 'abc'\n",
  );
  const help = await run("--help");
  assert.equal(help.code, 0, help.stderr);
  assert.match(
    help.stdout,
    new RegExp(
      `At least ${minSeconds("deno-kv")} \\(deno-kv\\), ${minSeconds("etcd")} \\(etcd\\)`,
    ),
  );
  assert.match(help.stdout, /on top of --seconds/);
  assert.match(help.stdout, /Default 0: no growth run/);
});
