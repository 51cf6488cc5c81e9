/**
 * Real Cilium v1.16 nodes beside the idalloc workers (`deno task nemesis --backend etcd --cilium N`):
 * `interop116` from `../shared/cilium-node/` (built from Cilium's own `pkg/allocator` and
 * `pkg/kvstore/allocator`, never part of this repository) in its fault-test worker mode, on the same
 * etcd and prefix, with the workload's lease TTL, ID range and key count, and master-key protection
 * as cilium-agent sets it. On Kubernetes (`--backend k8s --cilium N`) the same worker runs in
 * Cilium's CRD mode (`-kubeconfig`: `CiliumIdentity` objects through Cilium's own clientset and
 * identity backend), and the `CiliumEndpoint`s a real agent would write for what its node holds
 * are written beside it ({@linkcode EndpointTracker}); Cilium's operator GC is `cilium_operator.ts`.
 *
 * The Go worker prints one JSON line per call (`{op, key, id, node, t0, t1, last?, err?}`). Those
 * lines are kept raw as evidence (`cilium-<inc>.out`) and converted afterwards into the nemesis
 * {@linkcode LogRecord}s ({@linkcode convertCiliumOutput}), so the history check judges Cilium's
 * answers together with idalloc's: no key told two IDs at once by any two nodes, whichever side.
 * Checks that test idalloc's own API (typed errors, call deadlines, held-key reassignment events,
 * held keys against the store) do not apply to Cilium and are not fed its records.
 *
 * @module
 */
import { join } from "node:path";
import { z } from "zod";
import type { OpOutcomes } from "./checks/calls.ts";
import { Child, START_BOUND_MS } from "./child.ts";
import type { FaultTarget } from "./faults.ts";
import { LineLog, type LogRecord } from "./records.ts";

/** Environment variable naming the `interop116` binary, overriding the default place. */
export const CILIUM_BINARY_ENV = "CILIUM_INTEROP116";

/**
 * Where `interop116` is expected: `$CILIUM_INTEROP116`, else `build.sh`'s output directory
 * (`$CILIUM_WORK/bin`, default `${XDG_CACHE_HOME:-~/.cache}/cilium-node/bin`).
 */
export function ciliumBinary(env: Readonly<Record<string, string | undefined>>): string {
  if (env[CILIUM_BINARY_ENV]) return env[CILIUM_BINARY_ENV]!;
  const work = env.CILIUM_WORK ??
    join(env.XDG_CACHE_HOME ?? join(env.HOME ?? "/root", ".cache"), "cilium-node");
  return join(work, "bin", "interop116");
}

/** Why Cilium nodes cannot run here (with how to build them), or `undefined` when they can. */
export function ciliumUnavailable(
  env: Readonly<Record<string, string | undefined>> = Deno.env.toObject(),
): string | undefined {
  const path = ciliumBinary(env);
  try {
    if (Deno.statSync(path).isFile) return undefined;
  } catch {
    // Absent: explained below.
  }
  return `the Cilium v1.16 node ${path} is not built. It is a tool for this machine, not part of ` +
    `the project: fetch Cilium's source as a git dir (github:skmatti/cilium), then run ` +
    `'bash ../shared/cilium-node/build.sh --v116 <git dir>' (see ../shared/cilium-node/README.md; ` +
    `output in $CILIUM_WORK/bin), or point ${CILIUM_BINARY_ENV} at the binary`;
}

/** One line of the Go worker (a call, or the `held` reply to SIGUSR1). */
const lineSchema = z.object({
  node: z.string(),
  op: z.enum(["allocate", "release-start", "release", "get", "error"]).optional(),
  key: z.string().optional(),
  id: z.number().int().nonnegative().optional(),
  t0: z.number().optional(),
  t1: z.number().optional(),
  last: z.boolean().optional(),
  err: z.string().optional(),
  held: z.record(z.string(), z.number()).optional(),
});

/**
 * The outcome rows of Cilium's calls in the table. A failed allocate or get prints no op or key
 * (`{op: "error", t0, t1, err}`), so those two share a row.
 */
export const CILIUM_OPS = {
  allocate: "cilium allocate",
  release: "cilium release",
  get: "cilium get",
  unknown: "cilium allocate|get",
} as const;

/** What {@linkcode convertCiliumOutput} made of one incarnation's output. */
export interface CiliumConversion {
  readonly records: LogRecord[];
  /** Calls by outcome, under {@linkcode CILIUM_OPS} names; failures by their error's first words. */
  readonly outcomes: Map<string, OpOutcomes>;
  /** The last `held` reply (SIGUSR1), if any. */
  readonly held?: Readonly<Record<string, number>>;
  /** Lines that do not parse or do not fit the worker's sequence. */
  readonly bad: string[];
}

/**
 * Converts the stdout of one Go worker incarnation into nemesis records.
 *
 * - `allocate` → an `allocate` call; `held` is whether the worker already held the key (its
 *   answer then comes from Cilium's local keys, like idalloc's answer from its hold).
 * - `get` → a `get` call, `held` when the worker holds the key: Cilium answers `Get` from its
 *   watch cache (then the store), which is what an agent tells a caller asking for a held key's
 *   ID, so it is an answer of the hold. An ID of 0 is Cilium's "no ID".
 * - `release-start` (the worker's count drops here, `last` on the last use) and its `release` →
 *   one `release` call with `lastUse`, spanning both lines' times.
 * - `error` → a failed `release` after a `release-start`; otherwise a failed allocate or get,
 *   which the worker does not tell apart: counted, but no record (the history ignores failures).
 *
 * The worker is sequential, so a key is held for a whole call exactly when it was at its start.
 * Times are ms with a fraction; starts are floored and ends ceiled, which only widens a call's
 * window (the history's conservative side).
 */
export function convertCiliumOutput(
  text: string,
  who: { readonly node: string; readonly inc: string },
): CiliumConversion {
  const records: LogRecord[] = [];
  const outcomes = new Map<string, OpOutcomes>();
  const bad: string[] = [];
  let held: Record<string, number> | undefined;
  const uses = new Map<string, number>();
  let pending: { key: string; last: boolean; start: number } | undefined;
  const count = (op: string, error?: string) => {
    let o = outcomes.get(op);
    if (!o) outcomes.set(op, o = { ok: 0, errors: new Map() });
    if (error === undefined) o.ok++;
    else o.errors.set(error, (o.errors.get(error) ?? 0) + 1);
  };
  const base = { t: "call", node: who.node, inc: who.inc } as const;
  for (const line of text.split("\n")) {
    if (line.trim() === "") continue;
    let parsed;
    try {
      parsed = lineSchema.safeParse(JSON.parse(line));
    } catch {
      bad.push(line);
      continue;
    }
    if (!parsed.success) {
      bad.push(line);
      continue;
    }
    const l = parsed.data;
    if (l.held) {
      held = l.held;
      continue;
    }
    const start = Math.floor(l.t0 ?? NaN);
    const end = Math.ceil(l.t1 ?? NaN);
    const timed = Number.isFinite(start) && (l.op === "release-start" || Number.isFinite(end));
    if (!l.op || !timed || (l.op !== "error" && l.key === undefined)) {
      bad.push(line);
      continue;
    }
    const key = l.key ?? "";
    // Only an error may follow a release-start (the worker prints one of them per release).
    if (pending && l.op !== "release" && l.op !== "error") {
      bad.push(line);
      pending = undefined;
    }
    switch (l.op) {
      case "allocate": {
        const before = uses.get(key) ?? 0;
        uses.set(key, before + 1);
        records.push({
          ...base,
          op: "allocate",
          key,
          start,
          end,
          ok: true,
          id: l.id,
          held: before > 0,
        });
        count(CILIUM_OPS.allocate);
        break;
      }
      case "get": {
        const id = l.id === 0 ? undefined : l.id;
        records.push({ ...base, op: "get", key, start, end, ok: true, id, held: uses.has(key) });
        count(CILIUM_OPS.get);
        break;
      }
      case "release-start": {
        const left = (uses.get(key) ?? 0) - 1;
        if (left > 0) uses.set(key, left);
        else uses.delete(key);
        pending = { key, last: l.last ?? false, start };
        break;
      }
      case "release": {
        if (!pending || pending.key !== key) {
          bad.push(line);
          pending = undefined;
          break;
        }
        records.push({
          ...base,
          op: "release",
          key,
          start: pending.start,
          end,
          ok: true,
          held: true,
          lastUse: pending.last,
        });
        count(CILIUM_OPS.release);
        pending = undefined;
        break;
      }
      case "error": {
        const error = errorName(l.err ?? "");
        if (pending) {
          records.push({
            ...base,
            op: "release",
            key: pending.key,
            start: pending.start,
            end,
            ok: false,
            held: true,
            error,
            message: (l.err ?? "").slice(0, 500),
            typed: false,
            retryable: false,
            deadline: false,
          });
          count(CILIUM_OPS.release, error);
          pending = undefined;
        } else count(CILIUM_OPS.unknown, error);
        break;
      }
    }
  }
  return { records, outcomes, held, bad };
}

/**
 * A short name for a Go error: its first clause, without IDs or keys, so that the table's
 * failure column groups like errors (e.g. `unable to create secondary key '…'` → `unable to create
 * secondary key`).
 */
export function errorName(err: string): string {
  const first = err.split(/[:'"]/)[0].replace(/\d+/g, "N").trim();
  return (first || "error").slice(0, 60);
}

/** Where the Cilium nodes keep their identities. */
export type CiliumStore =
  /** Cilium's kvstore mode: etcd client URLs (node `i` connects to `endpoints[i % length]`:
   * Cilium takes one address) and the allocator's prefix. */
  | { readonly endpoints: readonly string[]; readonly prefix: string }
  /** Cilium's CRD mode (`identity-allocation-mode=crd`): a kubeconfig, and what writes the
   * `CiliumEndpoint` of a node's use of a key (`id` undefined: gone), as an agent does. */
  | {
    readonly kubeconfig: string;
    readonly endpoint: (node: string, key: string, id: number | undefined) => void;
  };

/** The command-line arguments that put node `index` on `store`. */
export function storeArgs(store: CiliumStore, index: number): string[] {
  if ("kubeconfig" in store) return ["-kubeconfig", store.kubeconfig];
  return ["-etcd", store.endpoints[index % store.endpoints.length], "-prefix", store.prefix];
}

/**
 * Follows one incarnation's calls as an agent's endpoints would: a key's first use writes its
 * endpoint (naming the ID the node got), the last release (its start: the pod is gone first)
 * deletes it; {@linkcode EndpointTracker.drop} deletes them all (the node died or ended).
 */
export class EndpointTracker {
  readonly #node: string;
  readonly #write: (node: string, key: string, id: number | undefined) => void;
  readonly #uses = new Map<string, number>();

  /** Tracks node `node`'s endpoints, written through `write`. */
  constructor(node: string, write: (node: string, key: string, id: number | undefined) => void) {
    this.#node = node;
    this.#write = write;
  }

  /** One line of the node's output. */
  line(line: string): void {
    let l: { op?: string; key?: string; id?: number; last?: boolean };
    try {
      l = JSON.parse(line);
    } catch {
      return;
    }
    if (typeof l.key !== "string") return;
    if (l.op === "allocate" && typeof l.id === "number" && l.id > 0) {
      const n = this.#uses.get(l.key) ?? 0;
      this.#uses.set(l.key, n + 1);
      if (n === 0) this.#write(this.#node, l.key, l.id);
    } else if (l.op === "release-start") {
      const n = (this.#uses.get(l.key) ?? 0) - 1;
      if (n > 0) this.#uses.set(l.key, n);
      else {
        this.#uses.delete(l.key);
        this.#write(this.#node, l.key, undefined);
      }
    }
  }

  /** Deletes every endpoint of the node. */
  drop(): void {
    for (const key of this.#uses.keys()) this.#write(this.#node, key, undefined);
    this.#uses.clear();
  }
}

/** What {@linkcode CiliumNodes.start} needs. */
export interface CiliumNodesOptions {
  readonly count: number;
  readonly store: CiliumStore;
  readonly range: { readonly min: number; readonly max: number };
  /** Keys `k8s:app=k0;` … of the Go worker's family (`-worker-keys`). */
  readonly keys: number;
  readonly leaseTtlMs: number;
  /** How long each worker would call on its own; the run pauses and ends it earlier. */
  readonly workerSeconds: number;
  readonly seed: number;
  readonly dir: string;
  /** Called when a node exits without the orchestrator having asked (a crash). */
  readonly crashed: (message: string, evidence: unknown) => void;
}

interface CiliumSlot {
  readonly index: number;
  node: string;
  inc: string;
  generation: number;
  child: Child;
  expectExit: boolean;
  /** Resolves on the incarnation's next `held` reply. */
  held?: () => void;
  /** Its endpoints (CRD mode). */
  endpoints?: EndpointTracker;
}

/** One incarnation as it ran: the evidence file to convert after the run. */
interface Incarnation {
  readonly node: string;
  readonly inc: string;
  readonly outPath: string;
}

/**
 * The Cilium nodes of a run: spawned, killed and restarted, paused for the settle phase and ended
 * before the drain, every incarnation's output kept in `<dir>/cilium-<inc>.out`.
 */
export class CiliumNodes implements AsyncDisposable {
  readonly #o: CiliumNodesOptions;
  readonly #binary: string;
  readonly #slots: CiliumSlot[] = [];
  readonly #incarnations: Incarnation[] = [];
  #next = 0;

  private constructor(o: CiliumNodesOptions, binary: string) {
    this.#o = o;
    this.#binary = binary;
  }

  /** Starts `o.count` nodes, each once it made its first call (its initial sync done). */
  static async start(o: CiliumNodesOptions): Promise<CiliumNodes> {
    const nodes = new CiliumNodes(o, ciliumBinary(Deno.env.toObject()));
    try {
      for (let i = 0; i < o.count; i++) nodes.#slots.push(await nodes.#spawn(i, `c${i}`, 0));
    } catch (err) {
      await nodes[Symbol.asyncDispose]();
      throw err;
    }
    return nodes;
  }

  /** Number of node slots. */
  get count(): number {
    return this.#slots.length;
  }

  /** Every node name so far (the last segment of their references in the store). */
  get nodes(): ReadonlySet<string> {
    return new Set(this.#incarnations.map((i) => i.node));
  }

  /** Every incarnation so far (Cilium emits no `reassigned` events: their held IDs may change). */
  get incs(): ReadonlySet<string> {
    return new Set(this.#incarnations.map((i) => i.inc));
  }

  async #spawn(index: number, node: string, generation: number): Promise<CiliumSlot> {
    const o = this.#o;
    const inc = `${node}@c${++this.#next}`;
    const files = join(o.dir, `cilium-${inc.replace("@", "-")}`);
    const outPath = `${files}.out`;
    const out = new LineLog(outPath);
    this.#incarnations.push({ node, inc, outPath });
    let ready!: () => void;
    const started = new Promise<void>((resolve) => ready = resolve);
    const slot: CiliumSlot = {
      index,
      node,
      inc,
      generation,
      expectExit: false,
      child: undefined as unknown as Child,
    };
    const store = o.store;
    if ("kubeconfig" in store) slot.endpoints = new EndpointTracker(node, store.endpoint);
    const args = [
      ...storeArgs(store, index),
      "-node",
      node,
      "-lease-ttl",
      `${o.leaseTtlMs}ms`,
      "-min",
      String(o.range.min),
      "-max",
      String(o.range.max),
      "-master-key-protection",
      "-worker-seconds",
      String(o.workerSeconds),
      "-worker-keys",
      String(o.keys),
      "-worker-seed",
      String(o.seed * 1_000 + 500 + index * 37 + generation),
    ];
    slot.child = await Child.exec(inc, this.#binary, args, `${files}.stderr`, (line) => {
      if (line === "") return;
      out.writeLine(line);
      slot.endpoints?.line(line);
      ready();
      if (line.includes('"held"')) slot.held?.();
    });
    const child = slot.child;
    // The log closes once the pipes drained: lines may still arrive after the exit status.
    // A dead node's pods go with it, and so do their endpoints (once its last line is read).
    child.settled().then(() => {
      out.close();
      slot.endpoints?.drop();
    });
    child.status.then((status) => {
      if (slot.expectExit || slot.child !== child) return;
      o.crashed(
        `Cilium node ${inc} exited on its own with code ${status.code}${
          status.signal ? ` (${status.signal})` : ""
        }`,
        { inc, stderr: `${files}.stderr` },
      );
    });
    // The worker makes its first call right after Cilium's initial list-and-watch.
    let timer: ReturnType<typeof setTimeout> | undefined;
    const timeout = new Promise<never>((_, reject) => {
      timer = setTimeout(
        () =>
          reject(
            new Error(
              `Cilium node ${inc} made no call within ${START_BOUND_MS / 1_000} s ` +
                `(see ${files}.stderr)`,
            ),
          ),
        START_BOUND_MS,
      );
    });
    const died = child.status.then((status) => {
      throw new Error(
        `Cilium node ${inc} exited with code ${status.code} before its first call (see ${files}.stderr)`,
      );
    });
    try {
      await Promise.race([started, timeout, died]);
    } finally {
      clearTimeout(timer);
    }
    return slot;
  }

  /** The fault target of slot `i`. */
  target(i: number): FaultTarget {
    const slot = this.#slots[i];
    return {
      node: slot.node,
      inc: slot.inc,
      signal: (signal) => {
        if (signal === "SIGKILL") slot.expectExit = true;
        return slot.child.signal(signal);
      },
    };
  }

  /** SIGKILLs slot `i`'s node and starts a new incarnation, as `c<i>-g<gen>` if `rename`. */
  async restart(i: number, rename: boolean): Promise<FaultTarget> {
    const old = this.#slots[i];
    old.expectExit = true;
    await old.child.kill();
    await old.child.settled();
    // Before a new incarnation under the name writes endpoints of the same names.
    old.endpoints?.drop();
    const generation = old.generation + 1;
    this.#slots[i] = await this.#spawn(i, rename ? `c${i}-g${generation}` : old.node, generation);
    return this.target(i);
  }

  /**
   * Pauses every node (SIGUSR1: the worker finishes its call and prints what it holds), so the
   * store settles while Cilium's lease and references stay alive; problems go to `harness`.
   */
  async pause(timeoutMs: number, harness: string[]): Promise<void> {
    await Promise.all(this.#slots.map(async (slot) => {
      const replied = new Promise<void>((resolve) => slot.held = resolve);
      slot.child.signal("SIGUSR1");
      let timer: ReturnType<typeof setTimeout> | undefined;
      const late = new Promise<boolean>((resolve) => {
        timer = setTimeout(() => resolve(false), timeoutMs);
      });
      const ok = await Promise.race([replied.then(() => true), late]);
      clearTimeout(timer);
      if (!ok) harness.push(`Cilium node ${slot.inc} did not pause within ${timeoutMs} ms`);
    }));
  }

  /**
   * Ends every node (SIGTERM; SIGKILL if it is still there after `graceMs`), so its lease lapses
   * and GC may collect what it held.
   */
  async stop(graceMs: number): Promise<void> {
    await Promise.all(this.#slots.map(async (slot) => {
      slot.expectExit = true;
      slot.child.signal("SIGCONT");
      slot.child.signal("SIGTERM");
      const timer = setTimeout(() => slot.child.signal("SIGKILL"), graceMs);
      await slot.child.settled();
      clearTimeout(timer);
      slot.endpoints?.drop();
    }));
  }

  /** Every incarnation's output, converted; unparseable lines go to `harness`. */
  async records(harness: string[]): Promise<{
    records: LogRecord[];
    outcomes: Map<string, OpOutcomes>;
  }> {
    const records: LogRecord[] = [];
    const outcomes = new Map<string, OpOutcomes>();
    for (const inc of this.#incarnations) {
      const text = await Deno.readTextFile(inc.outPath).catch(() => "");
      const c = convertCiliumOutput(text, inc);
      records.push(...c.records);
      for (const line of c.bad) {
        harness.push(`${inc.outPath}: unexpected line ${line.slice(0, 200)}`);
      }
      for (const [op, o] of c.outcomes) {
        let sum = outcomes.get(op);
        if (!sum) outcomes.set(op, sum = { ok: 0, errors: new Map() });
        sum.ok += o.ok;
        for (const [e, n] of o.errors) sum.errors.set(e, (sum.errors.get(e) ?? 0) + n);
      }
    }
    return { records, outcomes };
  }

  /** Kills every node left and waits for its pipes. */
  async [Symbol.asyncDispose](): Promise<void> {
    await Promise.allSettled(this.#slots.map(async (slot) => {
      slot.expectExit = true;
      await slot.child[Symbol.asyncDispose]();
    }));
  }
}
