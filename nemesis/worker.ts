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
import { between, picker, prng, zipf } from "../tests/_support/prng.ts";
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

  /** Local uses per key, as this worker made them. */
  const refs = new Map<string, number>();
  /** Keys with a call in flight (one call per key at a time). */
  const busy = new Set<string>();
  const inflight = new Map<number, { op: Op; key: string; start: number; reported: boolean }>();
  let nextCall = 0;
  let stopping = false;

  const watchdog = setInterval(() => {
    const now = Date.now();
    for (const call of inflight.values()) {
      if (call.reported || now - call.start <= config.timings.callTimeoutMs + 1_000) continue;
      call.reported = true;
      log.write({
        t: "hang",
        node: config.node,
        inc: config.inc,
        op: call.op,
        key: call.key,
        start: call.start,
        at: now,
      });
    }
  }, 500);

  const perform = async (op: Op, key: string): Promise<void> => {
    const held = (refs.get(key) ?? 0) > 0;
    const start = Date.now();
    const signal = AbortSignal.timeout(config.timings.callTimeoutMs);
    const token = nextCall++;
    inflight.set(token, { op, key, start, reported: false });
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
      inflight.delete(token);
    }
  };

  const choose = (): { op: Op; key: string } => {
    const held = [...refs.keys()];
    const zipfKey = () => config.keys[rank()];
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
    return { op: client.readOp, key: zipfKey() };
  };

  const lane = async (): Promise<void> => {
    while (!stopping) {
      const { op, key } = choose();
      if (busy.has(key)) {
        await sleep(1);
        continue;
      }
      busy.add(key);
      try {
        await perform(op, key);
      } finally {
        busy.delete(key);
      }
      await sleep(between(random, config.pauseMs[0], config.pauseMs[1]));
    }
  };
  // The heartbeat reads every held key from the hold, as an application that uses its IDs
  // continuously would: a node that keeps answering an ID across a stall shows up in the history
  // even when none of its regular calls touched that key meanwhile.
  const heartbeat = async (): Promise<void> => {
    while (!stopping) {
      await sleep(HEARTBEAT_MS);
      if (stopping) break;
      const keys = [...refs.keys()].filter((k) => !busy.has(k));
      if (keys.length === 0) continue;
      for (const k of keys) busy.add(k);
      const start = Date.now();
      const signal = AbortSignal.timeout(config.timings.callTimeoutMs);
      const token = nextCall++;
      inflight.set(token, { op: "get", key: "(heartbeat)", start, reported: false });
      try {
        const read = await Promise.allSettled(keys.map((k) => client.get(k, signal)));
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
        inflight.delete(token);
        for (const k of keys) busy.delete(k);
      }
    }
  };
  const hbBase = { t: "call", node: config.node, inc: config.inc, op: "get", held: true } as const;
  const lanes = [heartbeat(), ...Array.from({ length: config.lanes }, () => lane())];
  console.log("ready");

  for await (const command of stdinLines()) {
    if (command === "stop") {
      stopping = true;
      await Promise.all(lanes);
      console.log("stopped");
    } else if (command === "holds") {
      const holds: Record<string, number> = {};
      for (const key of refs.keys()) {
        const id = client.heldId(key);
        if (id !== undefined) holds[key] = id;
        else note(config, log, `holds ${key} but has no ID for it`);
      }
      const status = client.status();
      log.write({
        t: "holds",
        node: config.node,
        inc: config.inc,
        at: Date.now(),
        holds,
        heldKeys: typeof status.heldKeys === "number" ? status.heldKeys : -1,
        status,
      });
      console.log("holds");
    } else if (command === "drain") {
      // A few extra attempts per key: a release may fail while the store recovers.
      for (const [key, count] of [...refs]) {
        for (let attempt = 0; attempt < count + 3 && (refs.get(key) ?? 0) > 0; attempt++) {
          await perform("release", key);
        }
      }
      const failures = refs.size;
      clearInterval(watchdog);
      closing.abort();
      await client.close();
      log.write({ t: "drained", node: config.node, inc: config.inc, at: Date.now(), failures });
      log.close();
      console.log("drained");
      return;
    }
  }
  // stdin closed without a drain: the orchestrator is gone.
  clearInterval(watchdog);
  closing.abort();
  await client.close();
}

await main();
