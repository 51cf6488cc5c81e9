/**
 * Smaller operator-facing behaviours of the CLI (issue 17, point 8), each against a real store.
 */
import assert from "node:assert/strict";
import { main } from "../../src/cli/main.ts";
import { Capture, cli, TempStore } from "./_run.ts";

async function exists(path: string): Promise<boolean> {
  try {
    await Deno.stat(path);
    return true;
  } catch {
    return false;
  }
}

Deno.test("watch on a KV file that does not exist yet waits for the first allocation", async () => {
  await using store = await TempStore.create();
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
      /no Deno KV file at .*ids\.kv yet.*waiting|watching for the first/,
    );
    await new Promise((r) => setTimeout(r, 200));
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
