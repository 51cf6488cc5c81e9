/**
 * One nemesis run on one backend: start the store, the GC loop and the workers; inject faults for
 * the fault phase; stop the workers, let the cluster settle and compare the store with what the
 * live workers hold; probe every key; drain everything and watch GC collect it; then read every
 * log back and run the history and call checks.
 *
 * @module
 */
import { sleep } from "../src/abort.ts";
import {
  isPlantedMaster,
  type NemesisRunStore,
  type NemesisStore,
  type StoreSnapshot,
} from "../src/testing/nemesis.ts";
import { prng, shuffle } from "../src/testing/prng.ts";
import { faultKindsOf, hooksOf } from "./backends.ts";
import { checkCalls, ERROR_CHECK, type OpOutcomes, type StopWindow } from "./checks/calls.ts";
import { checkHistory, HISTORY_CHECK, ID_CHANGE_CHECK, SPLIT_CHECK } from "./checks/history.ts";
import { checkStore, type LiveHolds, STORE_CHECKS } from "./checks/store.ts";
import { checkSides, SIDES_CHECK } from "./checks/sides.ts";
import { short, type Violation } from "./checks/violation.ts";
import { Child, START_BOUND_MS } from "./child.ts";
import { CiliumNodes, type CiliumStore } from "./cilium.ts";
import { CiliumOperator, OPERATOR_FAULT } from "./cilium_operator.ts";
import { checkDeletions, DELETION_CHECK, type DeletionResult } from "./checks/deletions.ts";
import { type CiliumActivity, ciliumActivity } from "./checks/duplicates.ts";
import { attributeRun, readStoreLog } from "./cilium_attribution.ts";
import { StoreHistory } from "./checks/store_history.ts";
import { type AttributionSummary, IDALLOC_CLASSES } from "./checks/attribution.ts";
import {
  IDENTITY_RANGE,
  identityKeys,
  isIdentityWorker,
  type NemesisOptions,
  workloadFor,
} from "./config.ts";
import {
  type FaultContext,
  type FaultRecord,
  type FaultTarget,
  garbageTargets,
  runNemesis,
} from "./faults.ts";
import { PROBE_CHECK, probeKeys } from "./probe.ts";
import {
  type CallRecord,
  type GcConfig,
  LineLog,
  type LogRecord,
  type Op,
  parseRecords,
  type WorkerConfig,
} from "./records.ts";
import type { Workload } from "./workload.ts";

/** The store's record of its changes, in the run's directory (beside Cilium nodes). */
const STORE_LOG = "store.jsonl";
/** The faults as they begin and end (`RunState.faultLog`). */
const FAULT_LOG = "faults.jsonl";

/** Check name of the drain. */
export const DRAIN_CHECK = "GC collects every released key (drain)";
/** Check name of worker crashes. */
export const CRASH_CHECK = "no worker process dies on its own";

/** The order of the checks in the table. */
export const CHECK_ORDER: readonly string[] = [
  STORE_CHECKS.oneLiveId,
  STORE_CHECKS.oneKey,
  STORE_CHECKS.oneMaster,
  STORE_CHECKS.holds,
  SIDES_CHECK,
  HISTORY_CHECK,
  SPLIT_CHECK,
  ID_CHANGE_CHECK,
  "every call ends within its signal",
  "only documented typed errors",
  PROBE_CHECK,
  DRAIN_CHECK,
  DELETION_CHECK,
  CRASH_CHECK,
];

/** The recovery after a store fault: from the store being back to the first allocate that wrote. */
export interface Recovery {
  readonly label: string;
  readonly backAt: number;
  /** ms until the first successful store-touching allocate; undefined if none came. */
  readonly ms?: number;
}

/** What a backend run produced. */
export interface BackendReport {
  /** The backend's kind. */
  readonly backend: string;
  readonly seed: number;
  readonly seconds: number;
  readonly startedAt: number;
  readonly durationMs: number;
  readonly workers: { plain: number; identity: number; cilium: number };
  readonly faults: readonly FaultRecord[];
  /** Calls by op; Cilium nodes' calls under `cilium <op>` (see `cilium.ts`). */
  readonly outcomes: ReadonlyMap<Op | string, OpOutcomes>;
  /** Per check: violations found (0 = passed) and a short note. */
  readonly checks: ReadonlyMap<string, { failed: number; note: string }>;
  readonly violations: readonly Violation[];
  readonly recoveries: readonly Recovery[];
  /** Beside Cilium nodes: every violation of the history, the store and the probe attributed. */
  readonly attribution?: AttributionSummary;
  /**
   * Beside Cilium CRD-mode nodes: the identities deleted and by whom, the deletion check's
   * uncertain cases, the operator's restarts, the endpoints written, and what Cilium's nodes did
   * (duplicates created and answered).
   */
  readonly crd?: {
    readonly deletions: Omit<DeletionResult, "violations">;
    readonly operator: { readonly starts: number; readonly exitsOnItsOwn: number };
    readonly activity: CiliumActivity;
  };
  /**
   * A store of several sides (double-write): the drift found between them once the run settled,
   * by kind (those that break a promise are violations too).
   */
  readonly drift?: Readonly<Record<string, number>>;
  /**
   * Where restarted nodes come back in another configuration (a migration step): each
   * configuration's incarnations, in the order they started.
   */
  readonly configurations?: Readonly<Record<string, readonly string[]>>;
  /** Problems of the harness itself (unparseable log lines, a worker that did not answer). */
  readonly harness: readonly string[];
  readonly dir: string;
}

interface Slot {
  readonly index: number;
  readonly layer: "allocator" | "identity";
  node: string;
  inc: string;
  generation: number;
  child: Child;
  logPath: string;
  /** Set while the orchestrator itself kills the child, so its exit is no crash. */
  expectExit: boolean;
}

let incarnations = 0;

/** Everything one backend run gathers as it goes, shared by its phases. */
interface RunState {
  readonly backend: string;
  readonly options: NemesisOptions;
  readonly dir: string;
  readonly startedAt: number;
  readonly random: () => number;
  readonly workload: Workload;
  readonly families: { readonly plain: string[]; readonly identity: string[] };
  readonly store: NemesisRunStore;
  /** Problems of the harness itself. */
  readonly harness: string[];
  readonly violations: Violation[];
  readonly faults: FaultRecord[];
  readonly stops: StopWindow[];
  readonly crashes: Violation[];
  /** Identity-layer incarnations: their held IDs may change without an event they can see. */
  readonly identityIncs: Set<string>;
  readonly slots: Slot[];
  readonly probeLog: LineLog;
  /**
   * Each fault as it begins and as it ends (`faults.jsonl`): the report has them too, but a run
   * whose harness failed writes no report, and which fault left the store down is then the first
   * question.
   */
  readonly faultLog: LineLog;
  gc?: Child;
  cilium?: CiliumNodes;
  /** Cilium's operator GC (beside Cilium CRD-mode nodes). */
  operator?: CiliumOperator;
  /** The store's record of its changes (beside Cilium nodes: the attribution's evidence). */
  storeLog?: AsyncDisposable;
  /** Each worker incarnation's configuration, where the store gives one (`nodeSpec`). */
  readonly configurations: Map<string, string>;
  /** The drift between the store's sides once the run settled (a store of several sides). */
  drift?: Record<string, number>;
}

/**
 * Writes the store's record of its changes to `path` as JSON lines, if the store keeps one; the
 * handle stops the record and closes the file.
 */
async function recordStore(
  store: NemesisRunStore,
  path: string,
): Promise<AsyncDisposable | undefined> {
  if (!store.recordChanges) return undefined;
  const log = new LineLog(path);
  try {
    const recorder = await store.recordChanges((change) => log.writeLine(JSON.stringify(change)));
    return {
      async [Symbol.asyncDispose]() {
        try {
          await recorder[Symbol.asyncDispose]();
        } finally {
          log.close();
        }
      },
    };
  } catch (err) {
    log.close();
    throw err;
  }
}

/** Runs the nemesis on `backend` with `options`; logs go under `dir`. */
export async function runBackend(
  backend: string,
  options: NemesisOptions,
  dir: string,
): Promise<BackendReport> {
  const startedAt = Date.now();
  await Deno.mkdir(dir, { recursive: true });
  const random = prng(options.seed);
  const workload = workloadFor(options.workload, backend, options.cilium > 0);
  const run: RunState = {
    backend,
    options,
    dir,
    startedAt,
    random,
    workload,
    families: {
      plain: workload.ranked ? [...workload.plainKeys] : shuffle(random, [...workload.plainKeys]),
      identity: shuffle(random, identityKeys()),
    },
    store: await hooksOf(backend).startRun(dir, { ...workload, seed: options.seed }),
    harness: [],
    violations: [],
    faults: [],
    stops: [],
    crashes: [],
    identityIncs: new Set<string>(["probe-identity@probe"]),
    slots: [],
    probeLog: new LineLog(`${dir}/probe.jsonl`),
    faultLog: new LineLog(`${dir}/${FAULT_LOG}`),
    configurations: new Map(),
  };
  try {
    if (options.cilium > 0) run.storeLog = await recordStore(run.store, `${dir}/${STORE_LOG}`);
    await startProcesses(run);
    await faultPhase(run);
    await settleAndCompare(run);
    await probeAndDrain(run);
    run.violations.push(...run.crashes);
  } finally {
    await shutdown(run);
  }
  return await report(run, await checkLogs(run));
}

/** Starts worker `index` as `node`, waits until it is ready, and watches it for a crash. */
async function spawnWorker(run: RunState, index: number, node: string, generation: number) {
  const { options, workload, dir } = run;
  const layer = isIdentityWorker(index) ? "identity" : "allocator";
  const inc = `${node}@${++incarnations}`;
  if (layer === "identity") run.identityIncs.add(inc);
  const files = `${dir}/worker-${inc.replace("@", "-")}`;
  const logPath = `${files}.jsonl`;
  // A migration step: a restarted node may come back in another configuration.
  const opens = run.store.nodeSpec?.(index, generation);
  if (opens) run.configurations.set(inc, opens.label);
  const config: WorkerConfig = {
    store: opens?.spec ?? run.store.spec,
    node,
    inc,
    layer,
    seed: options.seed * 1_000 + index * 37 + generation,
    keys: layer === "identity" ? run.families.identity : run.families.plain,
    range: layer === "identity" ? IDENTITY_RANGE : workload.plainRange,
    timings: workload.timings,
    lanes: 3,
    pauseMs: [...workload.pauseMs],
    mix: workload.mix,
    targetHeld: layer === "identity" ? 12 : 30,
    logPath,
  };
  const child = await Child.spawn(inc, "nemesis/worker.ts", config, `${files}.stderr`);
  const slot: Slot = { index, layer, node, inc, generation, child, logPath, expectExit: false };
  child.status.then((status) => {
    if (slot.expectExit || slot.child !== child) return;
    run.crashes.push({
      check: CRASH_CHECK,
      message: `${inc} exited on its own with code ${status.code}${
        status.signal ? ` (${status.signal})` : ""
      }`,
      evidence: { inc, stderr: `${files}.stderr` },
    });
  });
  await child.waitFor("ready", START_BOUND_MS);
  return slot;
}

/** The fault side of a worker slot. */
function target(slot: Slot): FaultTarget {
  return {
    node: slot.node,
    inc: slot.inc,
    signal: (signal) => {
      if (signal === "SIGKILL") slot.expectExit = true;
      return slot.child.signal(signal);
    },
  };
}

/** Starts the GC loop, the workers and the Cilium nodes. */
async function startProcesses(run: RunState): Promise<void> {
  const { options, dir, workload: { timings, plainRange } } = run;
  const gcConfig: GcConfig = {
    store: run.store.spec,
    node: "gc",
    // One pass covers both families' ranges (Cilium's operator collects the whole space).
    range: {
      min: Math.min(IDENTITY_RANGE.min, plainRange.min),
      max: Math.max(IDENTITY_RANGE.max, plainRange.max),
    },
    timings,
    logPath: `${dir}/gc.jsonl`,
    // Beside Cilium's operator: idalloc's GC waits its heartbeat timeout after a mark, as it.
    ...(run.store.ciliumCrd ? { gcGraceMs: run.store.ciliumCrd.heartbeatTimeoutMs } : {}),
  };
  run.gc = await Child.spawn("gc", "nemesis/gc_loop.ts", gcConfig, `${dir}/gc.stderr`);
  await run.gc.waitFor("ready", START_BOUND_MS);
  for (let i = 0; i < options.nodes; i++) run.slots.push(await spawnWorker(run, i, `w${i}`, 0));
  const crd = run.store.ciliumCrd;
  const where: CiliumStore | undefined = crd
    ? { kubeconfig: crd.kubeconfig, endpoint: (n, k, id) => crd.setEndpoint(n, k, id) }
    : run.store.cilium;
  if (options.cilium > 0 && crd) {
    run.operator = await CiliumOperator.start({
      kubeconfig: crd.kubeconfig,
      heartbeatTimeoutMs: crd.heartbeatTimeoutMs,
      intervalMs: OPERATOR_INTERVAL_MS,
      dir,
    });
  }
  if (options.cilium > 0 && where) {
    run.cilium = await CiliumNodes.start({
      count: options.cilium,
      store: where,
      range: plainRange,
      keys: run.families.plain.length,
      leaseTtlMs: timings.leaseTtlMs,
      // Paused and ended by the run; this only bounds a node the run failed to end.
      workerSeconds: options.seconds + 600,
      seed: options.seed,
      dir,
      crashed: (message, evidence) => run.crashes.push({ check: CRASH_CHECK, message, evidence }),
    });
  }
}

/** Cilium operator's GC interval beside Cilium CRD-mode nodes. */
const OPERATOR_INTERVAL_MS = 1_000;

/** `store`, with the operator's restart among its faults (it is Cilium's, beside the store). */
function withOperator(store: NemesisRunStore, operator: CiliumOperator): NemesisRunStore {
  return new Proxy(store, {
    get(target, prop) {
      if (prop === "injectFault") {
        return async (kind: string, random: () => number) =>
          kind === OPERATOR_FAULT.kind
            ? { detail: await operator.restart(random) }
            : await target.injectFault!(kind, random);
      }
      const value = Reflect.get(target, prop, target);
      return typeof value === "function" ? value.bind(target) : value;
    },
  });
}

/** What the nemesis acts on in this run. */
function faultContext(run: RunState): FaultContext {
  const { slots, cilium, random, workload, operator } = run;
  const store = operator ? withOperator(run.store, operator) : run.store;
  const hooks = hooksOf(run.backend);
  return {
    random,
    store,
    storeFaults: {
      ...hooks.storeFaults ?? {},
      ...(operator ? { [OPERATOR_FAULT.kind]: OPERATOR_FAULT.label } : {}),
    },
    timings: workload.timings,
    skewMs: store.skewMs,
    garbage: hooks.garbageKinds.filter((g) => run.options.garbage.has(g)),
    garbageTargets: garbageTargets(
      [...run.families.plain, ...run.families.identity],
      workload.plainRange,
      random,
    ),
    // Slots past the idalloc workers are Cilium nodes: every fault on a node may hit either.
    slots: slots.length + (cilium?.count ?? 0),
    target: (i) => i < slots.length ? target(slots[i]) : cilium!.target(i - slots.length),
    restart: async (i, rename) => {
      if (i >= slots.length) return await cilium!.restart(i - slots.length, rename);
      const old = slots[i];
      old.expectExit = true;
      await old.child.kill();
      await old.child.settled();
      const generation = old.generation + 1;
      const node = rename ? `w${i}-g${generation}` : old.node;
      slots[i] = await spawnWorker(run, i, node, generation);
      return target(slots[i]);
    },
    record: (f) => {
      run.faults.push(f);
      run.faultLog.writeLine(JSON.stringify(f));
    },
    begin: (kind, start) => run.faultLog.writeLine(JSON.stringify({ begin: kind, start })),
    stopped: (w) => run.stops.push(w),
    overlapEveryMs: workload.faultEveryMs,
  };
}

/** Injects the faults the backend supports for the fault phase. */
async function faultPhase(run: RunState): Promise<void> {
  const t0 = Date.now();
  const end = t0 + run.options.seconds * 1_000;
  const supported = faultKindsOf(run.backend);
  const kinds = [...run.options.faults].filter((k) => supported.includes(k));
  // The operator's restart comes with the operator (beside Cilium CRD-mode nodes), whatever
  // `--faults` lists: it is no kind of the store's.
  if (run.operator) kinds.push(OPERATOR_FAULT.kind);
  const ctx = faultContext(run);
  if (kinds.includes("garbage") && ctx.garbage.length === 0) {
    kinds.splice(kinds.indexOf("garbage"), 1);
  }
  await sleep(3_000);
  // No fault starts in the last five seconds; the one in progress finishes.
  await runNemesis(ctx, kinds, end - 5_000);
  if (Date.now() < end) await sleep(end - Date.now());
}

/** Stops the calls, lets the cluster settle, and compares the store with what the workers hold. */
async function settleAndCompare(run: RunState): Promise<void> {
  const { slots, harness, workload: { timings } } = run;
  // Cilium nodes only pause: their leases and references stay live through the store checks.
  await Promise.all([
    run.cilium?.pause(timings.callTimeoutMs + 15_000, harness),
    ...slots.map(async (s) => {
      await s.child.send("stop");
      await s.child.waitFor("stopped", timings.callTimeoutMs + 15_000).catch((err) => {
        harness.push(`${s.inc}: ${err}`);
      });
    }),
  ]);
  // A lease lost near the end is replaced within a third of its TTL and the held references
  // re-created by the sync that follows; give that time before judging the store.
  await sleep(timings.leaseTtlMs + timings.syncIntervalMs + 1_000);
  await run.store.ciliumCrd?.flushEndpoints(15_000);
  await Promise.all(slots.map(async (s) => {
    await s.child.send("holds");
    await s.child.waitFor("holds", 15_000).catch((err) => harness.push(`${s.inc}: ${err}`));
  }));
  const snapshot = await run.store.snapshot();
  await Deno.writeTextFile(`${run.dir}/snapshot.json`, JSON.stringify(snapshot, null, 1));
  const holdsRecords = (await readRecords(slots.map((s) => s.logPath), harness, '"t":"holds"'))
    .filter((r): r is Extract<LogRecord, { t: "holds" }> => r.t === "holds");
  const liveIncs = new Set(slots.map((s) => s.inc));
  const holders: LiveHolds[] = holdsRecords
    .filter((h) => liveIncs.has(h.inc))
    .map((h) => ({ node: h.node, inc: h.inc, holds: h.holds }));
  for (const h of holdsRecords) {
    const modelled = Object.keys(h.holds).length + (h.fenced?.length ?? 0);
    if (h.heldKeys >= 0 && h.heldKeys !== modelled) {
      harness.push(`${h.inc}: the model holds ${modelled} keys, the allocator ${h.heldKeys}`);
    }
  }
  // A planted master that parses (an oversized one) is garbage, not data.
  const planted = new Set(run.faults.flatMap((f) => f.plantedMasters ?? []));
  if (snapshot.sides) {
    // A store of several sides: each side's store checks, and their agreement.
    const sides = checkSides(snapshot, holders, planted);
    run.drift = sides.drift;
    run.violations.push(...sides.violations);
    return;
  }
  const storeResult = checkStore(
    {
      ...snapshot,
      masters: snapshot.masters.filter((m) => !isPlantedMaster(planted, m)),
      // Cilium's CRD-mode agents create identities without a lock: a key may have several.
      strictMasters: snapshot.strictMasters && !run.store.ciliumCrd,
    },
    holders,
  );
  run.violations.push(...storeResult.violations);
}

/** Probes every key, then drains every node and waits for GC to collect what they held. */
async function probeAndDrain(run: RunState): Promise<void> {
  const { store, families, harness, workload, slots } = run;
  const { timings } = workload;
  run.violations.push(
    ...await probeKeys(store.spec, families, workload.plainRange, timings, run.probeLog).catch(
      (err) => {
        harness.push(`probe: ${err}`);
        return [];
      },
    ),
  );
  // Cilium nodes end instead of draining (the worker has no release-all): their lease lapses,
  // and GC must collect what they held with the rest.
  await run.cilium?.stop(timings.callTimeoutMs + 5_000);
  // Their endpoints go with them (CRD mode): only then may GC collect what they held.
  await run.store.ciliumCrd?.flushEndpoints(30_000);
  await Promise.all(slots.map(async (s) => {
    s.expectExit = true;
    await s.child.send("drain");
    await s.child.waitFor("drained", 120_000).catch((err) => harness.push(`${s.inc}: ${err}`));
  }));
  const drain = await waitForDrain(
    store,
    new Set([...families.plain, ...families.identity]),
    workload,
  );
  if (drain.left.length > 0) {
    run.violations.push({
      check: DRAIN_CHECK,
      message: `${drain.left.length} master(s) of released keys still stored ${
        Math.round(drain.waitedMs / 1_000)
      } s after every node released everything: ${
        drain.left.slice(0, 5).map((m) => `${m.id} → ${short(m.key)}`).join(", ")
      }${
        drain.sides === undefined
          ? ""
          : ` (by side: ${
            Object.entries(drain.sides).map(([side, ids]) => `${side} ${ids.join(" ") || "none"}`)
              .join(", ")
          })`
      }`,
      // When it gave up: the attribution asks which Cilium mutexes were held then.
      evidence: { ...drain, until: Date.now() },
    });
  }
}

/** Ends every process of the run and stops the store, whatever happened before. */
async function shutdown(run: RunState): Promise<void> {
  const { gc, harness } = run;
  await run.cilium?.[Symbol.asyncDispose]();
  await run.operator?.[Symbol.asyncDispose]();
  await Promise.allSettled(run.slots.map(async (s) => {
    s.expectExit = true;
    await s.child[Symbol.asyncDispose]();
  }));
  if (gc) {
    await gc.send("stop");
    await gc.waitFor("stopped", 30_000).catch((err) => harness.push(`gc: ${err}`));
    await gc[Symbol.asyncDispose]();
  }
  run.probeLog.close();
  run.faultLog.close();
  try {
    await run.storeLog?.[Symbol.asyncDispose]();
  } catch (err) {
    harness.push(`store log: ${err}`);
  }
  await run.store[Symbol.asyncDispose]();
}

/** What the history and call checks found in every log of the run. */
interface LogChecks {
  readonly records: readonly LogRecord[];
  readonly history: ReturnType<typeof checkHistory>;
  readonly calls: ReturnType<typeof checkCalls>;
  readonly ciliumOutcomes?: ReadonlyMap<string, OpOutcomes>;
  readonly attribution?: AttributionSummary;
  /** Violations beyond the limit, per check, of the attributed history. */
  readonly attributedDropped?: Record<string, number>;
  readonly crd?: BackendReport["crd"];
}

/** idalloc's GC passes, as the GC loop logged them. */
async function gcPasses(
  path: string,
): Promise<{ start: number; end: number; deleted?: number[] }[]> {
  const text = await Deno.readTextFile(path).catch(() => "");
  const out = [];
  for (const line of text.split("\n")) {
    try {
      const r = JSON.parse(line);
      if (r.t === "gc") out.push({ start: r.start, end: r.end, deleted: r.deleted });
    } catch {
      // The loop's last line, cut by its end.
    }
  }
  return out;
}

/**
 * Beside Cilium CRD-mode nodes: the deletion check (`checks/deletions.ts`) on the store's record
 * and idalloc's GC log, and what Cilium's nodes did with duplicates.
 */
async function crdChecks(
  run: RunState,
  records: readonly LogRecord[],
): Promise<{ violations: Violation[]; crd: NonNullable<BackendReport["crd"]> } | undefined> {
  const { cilium, operator, dir } = run;
  if (!run.store.ciliumCrd || !cilium || !run.storeLog) return undefined;
  const { changes } = await readStoreLog(`${dir}/${STORE_LOG}`);
  const { violations, ...deletions } = checkDeletions({
    changes,
    gcPasses: await gcPasses(`${dir}/gc.jsonl`),
    skewMs: run.store.skewMs,
    planted: new Set(run.faults.flatMap((f) => f.plantedMasters ?? [])),
    // What each idalloc node answered: a reference of a join under way is no hold (`refs.ts`).
    records,
  });
  const activity = ciliumActivity(new StoreHistory(changes), records, cilium.incs, cilium.nodes);
  const exits = operator?.exits ?? [];
  return {
    violations,
    crd: {
      deletions,
      operator: {
        starts: operator?.starts ?? 0,
        exitsOnItsOwn: exits.filter((e) => !e.asked).length,
      },
      activity,
    },
  };
}

/** Reads every log back and runs the history and call checks. */
async function checkLogs(run: RunState): Promise<LogChecks> {
  const { dir, harness, cilium, stops } = run;
  const logs: string[] = [];
  for await (const e of Deno.readDir(dir)) {
    // The GC loop's passes, the store's record and the faults are no calls.
    if (e.name.endsWith(".jsonl") && ![`gc.jsonl`, STORE_LOG, FAULT_LOG].includes(e.name)) {
      logs.push(`${dir}/${e.name}`);
    }
  }
  const records = await readRecords(logs, harness);
  for (const r of records) {
    if (r.t === "note") harness.push(`${r.inc} noted: ${r.text}`);
  }
  // Cilium's answers join the history only: the call checks test idalloc's API (typed errors,
  // deadline signals), and Cilium emits no reassigned events, so its held IDs may change silently.
  const ciliumCalls = await cilium?.records(harness);
  // Only the stall windows themselves are excused: a node's own answers after a stall count.
  const history = checkHistory([...records, ...ciliumCalls?.records ?? []], {
    silentChangeAllowed: new Set([...run.identityIncs, ...cilium?.incs ?? []]),
    stops,
    // Beside Cilium every violation is attributed before any is left out.
    limit: cilium ? Infinity : undefined,
  });
  const calls = checkCalls(records, {
    callTimeoutMs: run.workload.timings.callTimeoutMs,
    stops,
    alsoAllowed: run.options.cilium > 0 ? new Set(["SplitKeyError"]) : undefined,
  });
  // Beside Cilium only idalloc's share of the history's, the store's and the probe's violations
  // fails the run.
  const checks = {
    oneLiveId: STORE_CHECKS.oneLiveId,
    oneKey: STORE_CHECKS.oneKey,
    holds: STORE_CHECKS.holds,
    probe: PROBE_CHECK,
    drain: DRAIN_CHECK,
    deletion: DELETION_CHECK,
    errors: ERROR_CHECK,
  };
  const crd = await crdChecks(run, [...records, ...ciliumCalls?.records ?? []]);
  const attributable = new Set<string>(Object.values(checks));
  const earlier = cilium ? run.violations.filter((v) => attributable.has(v.check)) : [];
  if (cilium) {
    const rest = run.violations.filter((v) => !attributable.has(v.check));
    run.violations.splice(0, run.violations.length, ...rest);
  }
  // An InvalidIdError beside Cilium may be its doing (a key whose only identities a Cilium node
  // wrote outside idalloc's range): attributed like the probe's failures; other errors stay
  // idalloc's.
  const ciliumErrors = cilium ? calls.errors.filter(invalidId) : [];
  const callErrors = cilium ? calls.errors.filter((v) => !invalidId(v)) : calls.errors;
  const attributed = cilium
    ? await attributeRun({
      violations: [
        ...earlier,
        ...history.overlaps,
        ...history.splits,
        ...crd?.violations ?? [],
        ...ciliumErrors,
      ],
      checks,
      storeLogPath: run.storeLog ? `${dir}/${STORE_LOG}` : undefined,
      ciliumIncs: cilium.incs,
      ciliumNodes: cilium.nodes,
      faults: run.faults,
      stops,
      records: [...records, ...ciliumCalls?.records ?? []],
      leaseTtlMs: run.workload.timings.leaseTtlMs,
      // Cilium's CRD mode gives a key its oldest identity; its kvstore mode its newest.
      keyLookup: run.store.ciliumCrd ? "oldest" : "newest",
      limit: 25,
    })
    : undefined;
  for (const line of attributed?.bad ?? []) harness.push(`${STORE_LOG}: unparseable line ${line}`);
  run.violations.push(
    ...attributed?.charged ?? [...history.overlaps, ...history.splits],
    ...history.idChanges,
    ...calls.hangs,
    ...callErrors,
  );
  return {
    records,
    history,
    calls,
    ciliumOutcomes: ciliumCalls?.outcomes,
    attribution: attributed?.summary,
    attributedDropped: attributed?.dropped,
    crd: crd?.crd,
  };
}

/** The run's report, also written to `report.json` in its directory. */
async function report(run: RunState, logs: LogChecks): Promise<BackendReport> {
  const { history, calls } = logs;
  const counts = new Map<string, { failed: number; note: string }>();
  for (const name of CHECK_ORDER) counts.set(name, { failed: 0, note: "" });
  for (const v of run.violations) counts.get(v.check)!.failed++;
  for (const dropped of [history.dropped, calls.dropped, logs.attributedDropped ?? {}]) {
    for (const [check, n] of Object.entries(dropped)) counts.get(check)!.failed += n;
  }
  counts.get(HISTORY_CHECK)!.note = `${history.answers} answers in ${history.runs} runs`;
  // The deletion check runs beside Cilium CRD-mode nodes only.
  if (logs.crd) {
    const d = logs.crd.deletions;
    counts.get(DELETION_CHECK)!.note = `${d.deletions} deletions judged` +
      (d.uncertain.length > 0 ? `, ${d.uncertain.length} uncertain (across a record gap)` : "") +
      (d.raced.length > 0 ? `, ${d.raced.length} raced a join (not answered)` : "");
  } else counts.delete(DELETION_CHECK);
  // The agreement across sides is judged on a store of several sides only.
  if (run.drift) counts.get(SIDES_CHECK)!.note = driftNote(run.drift);
  else counts.delete(SIDES_CHECK);
  // Beside Cilium: the violations that are Cilium's own are listed, not counted as failures.
  const inherited = new Map<string, number>();
  for (const a of logs.attribution?.attributions ?? []) {
    if (IDALLOC_CLASSES.has(a.class)) continue;
    inherited.set(a.violation.check, (inherited.get(a.violation.check) ?? 0) + 1);
  }
  for (const [check, n] of inherited) {
    const c = counts.get(check)!;
    c.note = [c.note, `${n} of Cilium's not counted`].filter((x) => x !== "").join("; ");
  }
  const callTotal = [...calls.outcomes.values()].reduce((n, o) => n + o.ok + sum(o.errors), 0);
  counts.get("every call ends within its signal")!.note = `${callTotal} calls`;

  const result: BackendReport = {
    backend: run.backend,
    seed: run.options.seed,
    seconds: run.options.seconds,
    startedAt: run.startedAt,
    durationMs: Date.now() - run.startedAt,
    workers: {
      plain: run.slots.filter((s) => s.layer === "allocator").length,
      identity: run.slots.filter((s) => s.layer === "identity").length,
      cilium: run.cilium?.count ?? 0,
    },
    faults: run.faults,
    outcomes: new Map([...calls.outcomes, ...logs.ciliumOutcomes ?? []]),
    checks: counts,
    violations: run.violations,
    recoveries: recoveries(run.faults, logs.records),
    attribution: logs.attribution,
    crd: logs.crd,
    drift: run.drift,
    configurations: run.configurations.size === 0 ? undefined : byConfiguration(run.configurations),
    harness: run.harness,
    dir: run.dir,
  };
  await Deno.writeTextFile(
    `${run.dir}/report.json`,
    JSON.stringify({ ...result, outcomes: undefined, checks: Object.fromEntries(counts) }, null, 1),
  );
  return result;
}

/** The drift found, by kind, for the table's note. */
function driftNote(drift: Readonly<Record<string, number>>): string {
  const kinds = Object.entries(drift).map(([kind, n]) => `${kind} ${n}`);
  return kinds.length === 0 ? "no drift" : `drift: ${kinds.join(", ")}`;
}

/** Incarnations by configuration, in the order they started. */
function byConfiguration(configurations: ReadonlyMap<string, string>): Record<string, string[]> {
  const out: Record<string, string[]> = {};
  for (const [inc, label] of configurations) (out[label] ??= []).push(inc);
  return out;
}

function sum(m: ReadonlyMap<string, number>): number {
  let n = 0;
  for (const v of m.values()) n += v;
  return n;
}

async function readRecords(
  paths: readonly string[],
  harness: string[],
  only?: string,
): Promise<LogRecord[]> {
  const out: LogRecord[] = [];
  for (const path of paths) {
    const text = await Deno.readTextFile(path).catch(() => "");
    const { records, bad } = parseRecords(text, only);
    out.push(...records);
    // A SIGKILL may cut the last line short; anything else is a harness bug.
    const lines = text.trimEnd().split("\n");
    for (const line of bad) {
      if (line !== lines[lines.length - 1]) {
        harness.push(`${path}: unparseable line ${line.slice(0, 200)}`);
      }
    }
  }
  return out;
}

/** From each store fault's `backAt` to the first successful allocate that touched the store. */
function recoveries(faults: readonly FaultRecord[], records: readonly LogRecord[]): Recovery[] {
  const writes = records
    .filter((r): r is Extract<CallRecord, { ok: true }> =>
      r.t === "call" && r.ok && r.op === "allocate" && (r.firstUse ?? !r.held)
    )
    .map((r) => r.end)
    .sort((a, b) => a - b);
  return faults.filter((f) => f.backAt !== undefined).map((f) => {
    const first = writes.find((end) => end >= f.backAt!);
    return {
      label: f.label,
      backAt: f.backAt!,
      ms: first === undefined ? undefined : first - f.backAt!,
    };
  });
}

/** Polls the store until no master of `keys` is left, or the bound passes. */
async function waitForDrain(
  store: NemesisStore,
  keys: ReadonlySet<string>,
  { timings, clockSkewMs }: Workload,
): Promise<{
  left: StoreSnapshot["masters"][number][];
  waitedMs: number;
  refs: unknown[];
  /** A store of several sides: the IDs left on each side. */
  sides?: Record<string, number[]>;
}> {
  const start = Date.now();
  // Leases of killed nodes lapse, then two GC passes; plus room for a slow pass.
  const bound = timings.leaseTtlMs + clockSkewMs + 6 * timings.gcIntervalMs + 15_000;
  for (;;) {
    const snapshot = await store.snapshot();
    const left = snapshot.masters.filter((m) => keys.has(m.key));
    if (left.length === 0 || Date.now() - start > bound) {
      const leftKeys = new Set(left.map((m) => m.key));
      return {
        left,
        waitedMs: Date.now() - start,
        refs: snapshot.refs.filter((r) => leftKeys.has(r.key)),
        ...(snapshot.sides === undefined ? {} : {
          sides: Object.fromEntries(
            Object.entries(snapshot.sides).map((
              [side, s],
            ) => [side, s.masters.filter((m) => leftKeys.has(m.key)).map((m) => m.id)]),
          ),
        }),
      };
    }
    await sleep(500);
  }
}

/** A call check violation of a call that failed with `InvalidIdError`. */
function invalidId(v: Violation): boolean {
  return (v.evidence as { error?: unknown } | undefined)?.error === "InvalidIdError";
}
