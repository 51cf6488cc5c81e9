/**
 * The cross-process cap on private test servers (`src/testing/slots.ts`), with real processes:
 * another process waits while the slots are held and gets one once a holder lets go; a slot of a
 * process that died is taken over; one holder may take a second slot beyond the limit (a test
 * that needs two servers must not wait for itself); without a slot directory nothing is capped.
 */
import assert from "node:assert/strict";
import { acquireSlot, SLOTS_ENV, SlotTimeoutError } from "../../src/testing/slots.ts";

const SLOTS = new URL("../../src/testing/slots.ts", import.meta.url).href;

/** A process that takes one slot of `dir` (limit 1), prints `took`, holds it `holdMs`, exits. */
function taker(dir: string, timeoutMs: number, holdMs = 0) {
  const script = `
    import { acquireSlot } from ${JSON.stringify(SLOTS)};
    try {
      using _ = await acquireSlot("etcd", { dir: ${
    JSON.stringify(dir)
  }, limit: 1, timeoutMs: ${timeoutMs} });
      console.log("took");
      await new Promise((r) => setTimeout(r, ${holdMs}));
    } catch (err) {
      console.log(err.name);
    }`;
  return new Deno.Command(Deno.execPath(), {
    args: ["eval", script],
    stdout: "piped",
    stderr: "inherit",
  });
}

const slotFiles = (dir: string) =>
  [...Deno.readDirSync(dir)].filter((e) => e.name.endsWith(".slot"));

Deno.test("slots: another process waits while the limit is held, then gets the freed slot", async () => {
  const dir = await Deno.makeTempDir();
  try {
    const held = await acquireSlot("etcd", { dir, limit: 1 });
    const refused = await taker(dir, 300).output();
    assert.equal(new TextDecoder().decode(refused.stdout).trim(), "SlotTimeoutError");
    const waiting = taker(dir, 60_000).spawn();
    await new Promise((r) => setTimeout(r, 300));
    held.release();
    const out = await waiting.output();
    assert.equal(new TextDecoder().decode(out.stdout).trim(), "took");
    assert.deepEqual(slotFiles(dir), [], "the child released its slot");
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("slots: the slot of a process that died is free again", async () => {
  const dir = await Deno.makeTempDir();
  try {
    // A process that takes the slot and is killed while holding it.
    const holder = taker(dir, 1_000, 60_000).spawn();
    const reader = holder.stdout.pipeThrough(new TextDecoderStream()).getReader();
    assert.equal((await reader.read()).value?.trim(), "took");
    holder.kill("SIGKILL");
    await holder.status;
    reader.releaseLock();
    await holder.stdout.cancel().catch(() => {});
    assert.equal(slotFiles(dir).length, 1, "its slot file stays behind");
    using _ = await acquireSlot("etcd", { dir, limit: 1, timeoutMs: 5_000 });
    assert.equal(slotFiles(dir).length, 1, "the stale one was replaced by ours");
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("slots: a holder takes a second slot at once; others time out naming the holders", async () => {
  const dir = await Deno.makeTempDir();
  try {
    using _a = await acquireSlot("kube-apiserver", { dir, limit: 1 });
    using _b = await acquireSlot("kube-apiserver", { dir, limit: 1, timeoutMs: 0 });
    assert.equal(slotFiles(dir).length, 2);
    // Another kind has slots of its own.
    using _c = await acquireSlot("etcd", { dir, limit: 1, timeoutMs: 0 });
    const other = await taker(dir, 200).output();
    assert.equal(new TextDecoder().decode(other.stdout).trim(), "SlotTimeoutError");
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
  const err = new SlotTimeoutError("etcd", 2, 1500, ["etcd.1.a.1.slot"]);
  assert.match(
    err.message,
    /no etcd slot came free in 2 s \(at most 2 at once; held by etcd\.1\.a/,
  );
});

Deno.test("slots: without a slot directory there is no cap", async () => {
  const script = `
    import { acquireSlot } from ${JSON.stringify(SLOTS)};
    using _a = await acquireSlot("etcd", { limit: 1, timeoutMs: 0 });
    using _b = await acquireSlot("etcd", { limit: 1, timeoutMs: 0 });
    console.log("both");`;
  const env = Deno.env.toObject();
  delete env[SLOTS_ENV];
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["eval", script],
    env,
    clearEnv: true,
  })
    .output();
  assert.equal(
    new TextDecoder().decode(out.stdout).trim(),
    "both",
    new TextDecoder().decode(out.stderr),
  );
});
