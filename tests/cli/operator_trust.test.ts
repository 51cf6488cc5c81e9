/**
 * Operator trust (issue 28), through the CLI on real stores and real child processes:
 *
 * - a `--node` whose lease is live is refused by every command that writes under it (`allocate`,
 *   `identity allocate`, `gc`), saying who and until when; `gc --grace`/`--every` below the
 *   lease TTL are refused without `--force`; the three commands that gave a live holder's ID to
 *   another key on Deno KV now leave it with its holder;
 * - the note after `allocate` names the instant the run's reference lapses, and it is live until
 *   then;
 * - `allocate --hold` follows a reassignment (a master rewritten under it), says so, and releases
 *   the ID it really holds;
 * - `release --node` of a run that exited says when its lease lapses, not that a dead process
 *   "writes it back".
 */
import assert from "node:assert/strict";
import { eventually } from "../_support/eventually.ts";
import { testEachBackend } from "../_support/factories.ts";
import type { StoreFixture } from "../../src/testing/fixture.ts";
import { cli, spawnCli, untilDead } from "./_run.ts";

/** `2026-…Z (in 45s)` as the CLI prints an instant. */
const INSTANT = /(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ) \(in \d+s\)/;

/** A `--hold` child, stopped with Ctrl-C (SIGINT) or, if a test fails, killed. */
async function withHolder<T>(
  args: readonly string[],
  body: (holder: ReturnType<typeof spawnCli>, first: string) => Promise<T>,
): Promise<{ result: T; stdout: string; stderr: string; code: number }> {
  const holder = spawnCli(args);
  let result: T;
  try {
    await holder.output.until("\n");
    result = await body(holder, holder.output.text.split("\n")[0]);
    holder.child.kill("SIGINT");
    await holder.output.toEnd();
  } finally {
    holder.output.kill();
  }
  const { code } = await holder.child.status;
  return { result, stdout: holder.output.text, stderr: await holder.output.stderr, code };
}

/** `promise`, or a failure naming `what` after `ms` (a hang, not a speed check). */
async function within<T>(promise: Promise<T>, what: string, ms = 30_000): Promise<T> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const late = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`timed out waiting for ${what}`)), ms);
  });
  try {
    return await Promise.race([promise, late]);
  } finally {
    clearTimeout(timer);
  }
}

function jsonLines(text: string): Record<string, unknown>[] {
  return text.trim().split("\n").map((l) => JSON.parse(l));
}

async function liveRefs(fx: StoreFixture, node: string) {
  return (await fx.references()).filter((r) => r.node === node && r.live);
}

testEachBackend(
  "a live --node is refused by allocate, identity allocate and gc; gc passes stay a lease TTL " +
    "apart; the live holder keeps its ID",
  async (f) => {
    await using fx = await f.create();
    const args = [...fx.spec().cli];
    const hold = [...args, "--node", "holder1", "allocate", "app=held;", "--hold", "--json"];
    const { result: held, code } = await withHolder(hold, async (_, first) => {
      const held = JSON.parse(first);
      // The sequence that moved a live holder off its ID on Deno KV (issue 28, item 1).
      for (
        const command of [
          ["allocate", "app=x3;"],
          ["identity", "allocate", "k8s:app=x3"],
          ["gc", "--grace", "0s", "--force"],
        ]
      ) {
        const run = await cli([...args, "--node", "holder1", ...command, "--json"]);
        assert.equal(run.code, 4, `${command.join(" ")}: ${run.stderr}`);
        const { error } = JSON.parse(run.stderr);
        assert.equal(error.name, "NodeInUseError");
        assert.match(
          error.message,
          new RegExp(`^node holder1 is in use: its lease is live until ${INSTANT.source} `),
        );
        assert.match(error.message, /Give --node a name of its own \(or none\), or wait/);
      }
      // gc's passes: no closer than the lease TTL unless --force says so, and why.
      for (const pace of [["--grace", "0s"], ["--grace", "59s"], ["--every", "1s"]]) {
        const run = await cli([...args, "gc", ...pace]);
        assert.equal(run.code, 1, `${pace.join(" ")}: ${run.stderr}`);
        assert.match(
          run.stderr,
          new RegExp(
            `^idalloc: invalid option: ${pace[0]} \\S+ is shorter than the lease TTL ` +
              `\\(--lease-ttl 1m\\): .*a node whose lease vanished without its knowing .*--force`,
          ),
        );
        assert.equal(run.stderr.trim().split("\n").length, 1);
      }
      const gc = await cli([...args, "gc", "--grace", "0s", "--force", "--json"]);
      assert.equal(gc.code, 0, gc.stderr);
      assert.deepEqual(jsonLines(gc.stdout).flatMap((p) => p.deleted as unknown[]), []);
      // The held ID is not free: a range of it and the next gives the next.
      const evil = await cli([
        ...args,
        "--min",
        String(held.id),
        "--max",
        String(held.id + 1),
        "allocate",
        "evil;",
        "--json",
      ]);
      assert.equal(evil.code, 0, evil.stderr);
      assert.equal(JSON.parse(evil.stdout).id, held.id + 1);
      assert.deepEqual(
        (await liveRefs(fx, "holder1")).map((r) => [r.key, r.id]),
        [["app=held;", held.id]],
      );
      assert.equal((await fx.masters()).get(held.id), "app=held;");
      return held;
    });
    assert.equal(code, 0);
    assert.deepEqual(await liveRefs(fx, "holder1"), [], `released ${held.id}`);
  },
);

testEachBackend(
  "the note after allocate names when the run's reference lapses; it is live until then",
  async (f) => {
    await using fx = await f.create();
    const args = [...fx.spec().cli, "--lease-ttl", "2s"];
    const run = await cli([...args, "--node", "brief", "allocate", "app=brief;"]);
    assert.equal(run.code, 0, run.stderr);
    const note = new RegExp(
      `^idalloc: note: node brief references it after this run exits, until its lease lapses ` +
        `at ${INSTANT.source}; until then --node brief is refused to other runs; --hold keeps ` +
        "it until Ctrl-C$",
      "m",
    ).exec(run.stderr);
    assert.ok(note, run.stderr);
    const lapsesAt = Date.parse(note[1]);
    // The run has exited; its reference is still live, and it names the run's node as taken.
    assert.equal((await liveRefs(fx, "brief")).length, 1);
    const again = await cli([...args, "--node", "brief", "allocate", "app=brief;"]);
    assert.equal(again.code, 4, again.stderr);
    await untilDead(args, "brief");
    // It lapsed no earlier than the note said (the note is printed to the second).
    assert.ok(Date.now() >= lapsesAt, `lapsed before ${note[1]}`);
    const after = await cli([...args, "--node", "brief", "allocate", "app=brief;"]);
    assert.equal(after.code, 0, after.stderr);
  },
);

testEachBackend(
  "allocate --hold follows a reassignment: it says so, and Ctrl-C releases the new ID",
  async (f) => {
    await using fx = await f.create();
    const args = [...fx.spec().cli];
    // Two holders, for both outputs: JSON lines on stdout, and words on stderr.
    const json = spawnCli([...args, "--node", "hj", "allocate", "app=hj;", "--hold", "--json"]);
    try {
      const { stdout, stderr, code } = await withHolder(
        [...args, "--node", "hh", "allocate", "app=hh;", "--hold"],
        async (_, first) => {
          await json.output.until("\n");
          const hj = JSON.parse(json.output.text.split("\n")[0]).id as number;
          const hh = Number(/^ID (\d+) for app=hh;/.exec(first)![1]);
          // Another writer gives both IDs to other keys, behind the holders' backs.
          await fx.rewriteMaster(hj, "evil-j;");
          await fx.rewriteMaster(hh, "evil-h;");
          await within(json.output.until('"reassigned":true'), "the JSON holder's move");
          const moved = jsonLines(json.output.text)[1];
          assert.equal(moved.key, "app=hj;");
          assert.equal(moved.oldId, hj);
          assert.notEqual(moved.id, hj);
          assert.match(String(moved.reason), new RegExp(`the store gave ID ${hj} to evil-j;`));
          // The human holder's move is seen in the store: its reference names another ID.
          await eventually(
            async () => (await liveRefs(fx, "hh")).some((r) => r.id !== hh),
            "hh's reference moved",
          );
          json.child.kill("SIGINT");
          await json.output.toEnd();
          const released = jsonLines(json.output.text)[2];
          assert.deepEqual(released, { key: "app=hj;", id: moved.id, released: true, node: "hj" });
          return hh;
        },
      );
      assert.equal(code, 0, stderr);
      assert.equal((await json.child.status).code, 0, await json.output.stderr);
      const hh = Number(/^ID (\d+) for app=hh;/.exec(stdout)![1]);
      const move = new RegExp(
        `^idalloc: app=hh; moved from ID ${hh} to ID (\\d+) \\(the store gave ID ${hh} to ` +
          "evil-h;\\); now holding ID \\1$",
        "m",
      ).exec(stderr);
      assert.ok(move, stderr);
      assert.match(stdout, new RegExp(`^released ID ${move[1]} for app=hh; \\(node hh\\)$`, "m"));
      // Both released what they really held: no reference of either is left.
      assert.deepEqual(await liveRefs(fx, "hh"), []);
      assert.deepEqual(await liveRefs(fx, "hj"), []);
    } finally {
      json.output.kill();
    }
  },
);

testEachBackend(
  "release --node of a run that exited says when its lease lapses, then deletes",
  async (f) => {
    await using fx = await f.create();
    const args = [...fx.spec().cli, "--lease-ttl", "2s"];
    assert.equal((await cli([...args, "--node", "gone", "allocate", "app=gone;"])).code, 0);
    const refused = await cli([...args, "--node", "gone", "release", "app=gone;"]);
    assert.equal(refused.code, 4, refused.stderr);
    assert.match(
      refused.stderr,
      new RegExp(
        `^idalloc: node gone is live until ${INSTANT.source}: its reference to app=gone; ` +
          "\\(ID \\d+\\) stays while its lease does, .* if it has exited, its lease lapses then",
      ),
    );
    assert.doesNotMatch(refused.stderr, /writes it back/);
    await untilDead(args, "gone");
    const released = await cli([...args, "--node", "gone", "release", "app=gone;"]);
    // Deno KV keeps a dead reference for release to delete; etcd deleted it with the lease.
    assert.equal(released.code, f.traits.deadReferencesStay ? 0 : 3, released.stderr);
  },
);

testEachBackend(
  "identity allocate --hold releases the identity its labels have when Ctrl-C comes",
  async (f) => {
    await using fx = await f.create();
    const args = [...fx.spec().cli, "--node", "ih"];
    const { stdout, stderr, code, result: old } = await withHolder(
      [...args, "identity", "allocate", "k8s:app=ih", "--hold", "--json"],
      async (_, first) => {
        const old = JSON.parse(first).id as number;
        await fx.rewriteMaster(old, "k8s:app=other;");
        await eventually(
          async () => (await liveRefs(fx, "ih")).some((r) => r.id !== old),
          "the identity moved",
        );
        return old;
      },
    );
    assert.equal(code, 0, stderr);
    const released = jsonLines(stdout)[1];
    assert.notEqual(released.id, old);
    assert.deepEqual(released, { id: released.id, released: true, node: "ih" });
    assert.deepEqual(await liveRefs(fx, "ih"), []);
  },
);
