/**
 * A nemesis worker: one node in its own process, an `Allocator` (or an `IdentityAllocator`) under
 * its own node name, calling allocate / release / get / store reads over a shared, Zipf-skewed
 * key family until told to stop. Every resolved call is appended to its log as one JSON line (key,
 * ID, node, start and end time, or the error), and so is every `reassigned` event.
 *
 * The worker keeps a model of its own reference counts: one key is never in two of its call loops
 * at once, so the model is exact, and a `get` of a key it holds is an answer from its hold (part
 * of the history check) while a `get` of any other key is only a cache read.
 *
 * Commands on stdin, acknowledged on stdout: `stop` (finish the calls in flight, start none),
 * `holds` (log what it holds), `drain` (release everything, close, exit).
 *
 * `deno run -A nemesis/worker.ts '<WorkerConfig JSON>'`
 *
 * @module
 */
import { Allocator } from "../src/allocator/allocator.ts";
import type { Backend } from "../src/allocator/backend.ts";
import { type Identity, IdentityAllocator, Labels } from "../src/identity/mod.ts";
import { sleep } from "../src/abort.ts";
import { between, picker, prng, zipf } from "../src/testing/prng.ts";
import {
  configFromArgs,
  logToStderr,
  openBackend,
  startWhenReachable,
  stdinLines,
} from "./process_support.ts";
import { failedCall, LineLog, type Op, type WorkerConfig, workerConfigSchema } from "./records.ts";

/** How often the heartbeat reads every held key. */
const HEARTBEAT_MS = 250;

/** What the worker needs of either layer. */
interface KeyClient {
  /** The op name of a store read in this layer. */
  readonly readOp: Op;
  allocate(
    key: string,
    signal: AbortSignal,
  ): Promise<{ id: number; isNew: boolean; firstUse?: boolean }>;
  release(key: string, signal: AbortSignal): Promise<boolean>;
  /** The ID as the node knows it (its hold, else its cache, else the store). */
  get(key: string, signal: AbortSignal): Promise<number | undefined>;
  /** A read that bypasses the hold (plain: the store; identity: caches, then the store). */
  read(key: string, signal: AbortSignal): Promise<number | undefined>;
  /** The ID this node answers for a key it holds. */
  heldId(key: string): number | undefined;
  status(): { heldKeys?: number } & Record<string, unknown>;
  close(): Promise<void>;
}

/** The allocator options both layers take. */
function allocatorOptions(config: WorkerConfig) {
  return {
    // A worker killed and started again under its name (`kill (same name)`) is that node
    // restarting: the killed incarnation's lease is still live until it lapses, and without this
    // the new one dies with NodeInUseError. The nemesis never runs two workers under one name.
    restart: true,
    leaseTtlMs: config.timings.leaseTtlMs,
    syncIntervalMs: config.timings.syncIntervalMs,
    backoff: { initialMs: 10, maxMs: 500, factor: 2 },
  };
}

async function plainClient(
  config: WorkerConfig,
  backend: Backend,
  log: LineLog,
  closing: AbortSignal,
): Promise<KeyClient> {
  const alloc = await Allocator.open(backend, {
    min: config.range.min,
    max: config.range.max,
    ...allocatorOptions(config),
  });
  // The allocator reports a key it had to move to a new ID; the history needs the instant.
  const watching = (async () => {
    try {
      for await (const ev of alloc.watch({ signal: closing })) {
        if (ev.type !== "reassigned") continue;
        log.write({
          t: "reassigned",
          node: config.node,
          inc: config.inc,
          key: ev.key,
          oldId: ev.oldId,
          newId: ev.newId,
          at: Date.now(),
        });
      }
    } catch (err) {
      if (!closing.aborted) note(config, log, `watch ended: ${err}`);
    }
  })();
  return {
    readOp: "getNoCache",
    allocate: (key, signal) => alloc.allocate(key, { signal }),
    release: async (key, signal) => (await alloc.release(key, { signal })).lastUse,
    get: (key, signal) => alloc.get(key, { signal }),
    read: (key, signal) => alloc.getNoCache(key, { signal }),
    heldId: (key) => alloc.cachedId(key),
    status: () => ({ ...alloc.status() }),
    close: async () => {
      await alloc.close();
      await watching;
    },
  };
}

async function identityClient(
  config: WorkerConfig,
  backend: Backend,
): Promise<KeyClient> {
  const identities = await IdentityAllocator.open(backend, allocatorOptions(config));
  const held = new Map<string, Identity>();
  const labelsOf = new Map<string, Labels>();
  const labels = (key: string) => {
    let l = labelsOf.get(key);
    if (!l) labelsOf.set(key, l = Labels.fromKvstoreString(key));
    return l;
  };
  return {
    readOp: "resolve",
    allocate: async (key, signal) => {
      const { identity, isNew } = await identities.allocate(labels(key), { signal });
      held.set(key, identity);
      return { id: identity.id, isNew };
    },
    release: async (key, signal) => {
      const identity = held.get(key);
      if (!identity) throw new Error(`harness: release of ${key}, which the worker never got`);
      const lastUse = await identities.release(identity, { signal });
      if (lastUse) held.delete(key);
      return lastUse;
    },
    get: (key) => Promise.resolve(identities.lookup(labels(key))?.id),
    read: async (key, signal) => (await identities.resolve(labels(key), { signal }))?.id,
    heldId: (key) => identities.lookup(labels(key))?.id,
    status: () => ({ heldKeys: held.size }),
    close: () => identities.close(),
  };
}

function note(config: WorkerConfig, log: LineLog, text: string): void {
  log.write({ t: "note", node: config.node, inc: config.inc, at: Date.now(), text });
}

/** A call in flight, for the watchdog that reports hangs. */
interface InFlight {
  readonly op: Op;
  readonly key: string;
  readonly start: number;
  reported: boolean;
}

/** One worker process's state, shared by its lanes, heartbeat and commands. */
interface Worker {
  readonly config: WorkerConfig;
  readonly log: LineLog;
  readonly client: KeyClient;
  readonly random: () => number;
  readonly pick: <T>(items: readonly T[]) => T;
  readonly rank: () => number;
  readonly closing: AbortController;
  /** Local uses per key, as this worker made them. */
  readonly refs: Map<string, number>;
  /** Keys with a call in flight (one call per key at a time). */
  readonly busy: Set<string>;
  readonly inflight: Map<number, InFlight>;
  nextCall: number;
  stopping: boolean;
}

/** Logs every call in flight past its deadline (and a second) once, as a hang. */
function startWatchdog(w: Worker): ReturnType<typeof setInterval> {
  return setInterval(() => {
    const now = Date.now();
    for (const call of w.inflight.values()) {
      if (call.reported || now - call.start <= w.config.timings.callTimeoutMs + 1_000) continue;
      call.reported = true;
      w.log.write({
        t: "hang",
        node: w.config.node,
        inc: w.config.inc,
        op: call.op,
        key: call.key,
        start: call.start,
        at: now,
      });
    }
  }, 500);
}

/** Makes one call and logs how it resolved, keeping the model of uses exact. */
async function perform(w: Worker, op: Op, key: string): Promise<void> {
  const { config, client, log, refs } = w;
  const held = (refs.get(key) ?? 0) > 0;
  const start = Date.now();
  const signal = AbortSignal.timeout(config.timings.callTimeoutMs);
  const token = w.nextCall++;
  w.inflight.set(token, { op, key, start, reported: false });
  const base = { t: "call", node: config.node, inc: config.inc, op, key, start, held } as const;
  try {
    switch (op) {
      case "allocate": {
        const r = await client.allocate(key, signal);
        refs.set(key, (refs.get(key) ?? 0) + 1);
        log.write({
          ...base,
          end: Date.now(),
          ok: true,
          id: r.id,
          isNew: r.isNew,
          firstUse: r.firstUse,
        });
        break;
      }
      case "release": {
        const lastUse = await client.release(key, signal);
        const left = (refs.get(key) ?? 0) - 1;
        if (left > 0) refs.set(key, left);
        else refs.delete(key);
        log.write({ ...base, end: Date.now(), ok: true, lastUse });
        if (lastUse !== (left === 0)) {
          note(
            config,
            log,
            `release of ${key}: lastUse ${lastUse} but the model has ${left} uses left`,
          );
        }
        break;
      }
      case "get": {
        const id = await client.get(key, signal);
        log.write({ ...base, end: Date.now(), ok: true, id });
        break;
      }
      default: {
        const id = await client.read(key, signal);
        log.write({ ...base, end: Date.now(), ok: true, id });
      }
    }
  } catch (err) {
    log.write(failedCall(base, err, signal));
  } finally {
    w.inflight.delete(token);
  }
}

/** The next call: by the workload's mix, releasing more often above the held target. */
function choose(w: Worker): { op: Op; key: string } {
  const { config, random, pick } = w;
  const held = [...w.refs.keys()];
  const zipfKey = () => config.keys[w.rank()];
  if (held.length > config.targetHeld && random() < 0.35) {
    return { op: "release", key: pick(held) };
  }
  const { mix } = config;
  const r = random();
  if (r < mix.allocate) return { op: "allocate", key: zipfKey() };
  if (r < mix.allocate + mix.release) {
    return held.length > 0
      ? { op: "release", key: pick(held) }
      : { op: "allocate", key: zipfKey() };
  }
  if (r < mix.allocate + mix.release + mix.get) {
    return { op: "get", key: held.length > 0 && random() < 0.8 ? pick(held) : zipfKey() };
  }
  return { op: w.client.readOp, key: zipfKey() };
}

/** One call loop, until the worker stops. */
async function lane(w: Worker): Promise<void> {
  while (!w.stopping) {
    const { op, key } = choose(w);
    if (w.busy.has(key)) {
      await sleep(1);
      continue;
    }
    w.busy.add(key);
    try {
      await perform(w, op, key);
    } finally {
      w.busy.delete(key);
    }
    await sleep(between(w.random, w.config.pauseMs[0], w.config.pauseMs[1]));
  }
}

/**
 * Reads every held key from the hold, as an application that uses its IDs continuously would: a
 * node that keeps answering an ID across a stall shows up in the history even when none of its
 * regular calls touched that key meanwhile.
 */
async function heartbeat(w: Worker): Promise<void> {
  const { config, log } = w;
  const hbBase = { t: "call", node: config.node, inc: config.inc, op: "get", held: true } as const;
  while (!w.stopping) {
    await sleep(HEARTBEAT_MS);
    if (w.stopping) break;
    const keys = [...w.refs.keys()].filter((k) => !w.busy.has(k));
    if (keys.length === 0) continue;
    for (const k of keys) w.busy.add(k);
    const start = Date.now();
    const signal = AbortSignal.timeout(config.timings.callTimeoutMs);
    const token = w.nextCall++;
    w.inflight.set(token, { op: "get", key: "(heartbeat)", start, reported: false });
    try {
      const read = await Promise.allSettled(keys.map((k) => w.client.get(k, signal)));
      const ids: [string, number][] = [];
      // No ID for a held key is no answer: a fenced node does not answer from memory.
      read.forEach((r, i) => {
        if (r.status === "fulfilled" && r.value !== undefined) ids.push([keys[i], r.value]);
        else if (r.status === "rejected") {
          log.write(failedCall({ ...hbBase, key: keys[i], start }, r.reason, signal));
        }
      });
      log.write({ t: "hb", node: config.node, inc: config.inc, start, end: Date.now(), ids });
    } finally {
      w.inflight.delete(token);
      for (const k of keys) w.busy.delete(k);
    }
  }
}

/** Logs what the worker holds, by its model and by the allocator's own count. */
function logHolds(w: Worker): void {
  const { config, log } = w;
  const holds: Record<string, number> = {};
  const fenced: string[] = [];
  const status = w.client.status();
  // A held key still fenced answers no ID (beside Cilium: its mutex held by a stuck Cilium node).
  const fencing = (status as { fence?: { active?: boolean } }).fence?.active === true;
  for (const key of w.refs.keys()) {
    const id = w.client.heldId(key);
    if (id !== undefined) holds[key] = id;
    else if (fencing) fenced.push(key);
    else note(config, log, `holds ${key} but has no ID for it`);
  }
  log.write({
    t: "holds",
    node: config.node,
    inc: config.inc,
    at: Date.now(),
    holds,
    fenced,
    heldKeys: typeof status.heldKeys === "number" ? status.heldKeys : -1,
    status,
  });
}

/** Releases everything the worker holds, a few extra attempts per key (a release may fail while the store recovers). */
async function releaseAll(w: Worker): Promise<number> {
  for (const [key, count] of [...w.refs]) {
    for (let attempt = 0; attempt < count + 3 && (w.refs.get(key) ?? 0) > 0; attempt++) {
      await perform(w, "release", key);
    }
  }
  return w.refs.size;
}

/** Answers the orchestrator's commands until `drain` or the end of stdin. */
async function serve(
  w: Worker,
  lanes: readonly Promise<void>[],
  watchdog: ReturnType<typeof setInterval>,
): Promise<void> {
  const { config, log } = w;
  for await (const command of stdinLines()) {
    if (command === "stop") {
      w.stopping = true;
      await Promise.all(lanes);
      console.log("stopped");
    } else if (command === "holds") {
      logHolds(w);
      console.log("holds");
    } else if (command === "drain") {
      const failures = await releaseAll(w);
      clearInterval(watchdog);
      w.closing.abort();
      await w.client.close();
      log.write({ t: "drained", node: config.node, inc: config.inc, at: Date.now(), failures });
      log.close();
      console.log("drained");
      return;
    }
  }
  // stdin closed without a drain: the orchestrator is gone.
  clearInterval(watchdog);
  w.closing.abort();
  await w.client.close();
}

async function main(): Promise<void> {
  const config = configFromArgs(workerConfigSchema);
  await logToStderr("warning");
  const log = new LineLog(config.logPath);
  const random = prng(config.seed);
  const pick = picker(random);
  const rank = zipf(random, config.keys.length, 1);
  const closing = new AbortController();
  await using opened = await startWhenReachable(() => openBackend(config.store, config.node));
  const client = await startWhenReachable(() =>
    config.layer === "identity"
      ? identityClient(config, opened.backend)
      : plainClient(config, opened.backend, log, closing.signal)
  );
  log.write({ t: "ready", node: config.node, inc: config.inc, pid: Deno.pid, at: Date.now() });
  const w: Worker = {
    config,
    log,
    client,
    random,
    pick,
    rank,
    closing,
    refs: new Map(),
    busy: new Set(),
    inflight: new Map(),
    nextCall: 0,
    stopping: false,
  };
  const watchdog = startWatchdog(w);
  const lanes = [heartbeat(w), ...Array.from({ length: config.lanes }, () => lane(w))];
  console.log("ready");
  await serve(w, lanes, watchdog);
}

await main();
