/**
 * A double-write nemesis store: the etcd harness's store (Cilium's kvstore) and the Kubernetes
 * harness's store (Cilium's CRDs) side by side, each read, faulted and revoked by its own
 * harness's code; this module only routes to the side and names it. Its snapshot is both sides'
 * (`sides`), with the drift between them classified as the double-write doctor classifies it
 * (`classifyDrift`): a label set with two IDs across the sides (`key-split`) or an ID with two label
 * sets (`labels-differ`) breaks idalloc's promise when every writer is idalloc's; an identity on
 * one side only is a leftover the doctor copies or GC collects, and only counted.
 *
 * @module
 */
import type {
  GarbageTargets,
  NemesisRunStore,
  NemesisStore,
  NodeStoreSpec,
  Planted,
  SideDrift,
  SnapshotMaster,
  StoreFaultOutcome,
  StoreSnapshot,
} from "../../../testing/nemesis.ts";
import { classifyDrift, type Drift } from "../doctor.ts";
import type { DoubleWriteMode, Side } from "../mode.ts";
import type { DoubleWriteNemesisSpec } from "./nemesis_spec.ts";

/** The side that offers each store fault, and the fault's label there. */
export type SideFaults = Readonly<Record<string, { readonly side: Side; readonly label: string }>>;

/** What a double-write store is made of. */
export interface DoubleWriteSides {
  /** The kvstore side: the etcd harness's store. */
  readonly kvstore: NemesisStore;
  /** The CRD side: the Kubernetes harness's store. */
  readonly crd: NemesisStore;
}

/** The drift kinds that break a promise among idalloc's nodes (see the module doc). */
const BROKEN: ReadonlySet<string> = new Set(["labels-differ", "key-split"]);

/** Both sides' stores as one nemesis store (see the module doc). */
export class DoubleWriteNemesisStore implements NemesisRunStore {
  readonly kind: string;
  readonly spec: DoubleWriteNemesisSpec;
  readonly skewMs: number;
  readonly #sides: DoubleWriteSides;
  readonly #faults: SideFaults;
  /** The mode the run's migration step leaves (its first incarnations' mode). */
  readonly leaving: DoubleWriteMode;

  /**
   * The store `spec` names, made of `sides` (disposed with it); `faults` routes each store fault
   * to the side that offers it; `leaving` is the mode a run's migration step leaves for
   * `spec.mode` (absent: no step, every node opens `spec.mode`).
   */
  constructor(
    spec: DoubleWriteNemesisSpec,
    sides: DoubleWriteSides,
    options: { readonly faults?: SideFaults; readonly leaving?: DoubleWriteMode } = {},
  ) {
    this.kind = spec.kind;
    this.spec = spec;
    this.#sides = sides;
    this.#faults = options.faults ?? {};
    this.leaving = options.leaving ?? spec.mode;
    // A lease is judged by the later of the two sides' margins.
    this.skewMs = Math.max(sides.kvstore.skewMs, sides.crd.skewMs);
  }

  /**
   * A migration step's rolling restart: a worker's first incarnation opens the mode the step
   * leaves, every restart the mode it enters (the run's `spec`, which the GC loop and the probe
   * open too).
   */
  nodeSpec(_slot: number, generation: number): NodeStoreSpec {
    const mode = generation === 0 ? this.leaving : this.spec.mode;
    return { spec: { ...this.spec, mode }, label: mode };
  }

  async snapshot(): Promise<StoreSnapshot> {
    const [kvstore, crd] = await Promise.all([
      this.#sides.kvstore.snapshot(),
      this.#sides.crd.snapshot(),
    ]);
    return bothSnapshots(kvstore, crd);
  }

  /** No garbage kinds are offered: each side's own run plants its own. */
  plant(kind: string, _targets: GarbageTargets): Promise<Planted> {
    return Promise.reject(new Error(`garbage kind ${kind} is not planted on a double-write store`));
  }

  /** Revokes `node`'s lease on one side, drawn with `random`: its references there die at once. */
  async revokeLease(node: string, random: () => number): Promise<string> {
    const side: Side = random() < 0.5 ? "kvstore" : "crd";
    return `${side}: ${await this.#sides[side].revokeLease(node, random)}`;
  }

  async counts(): Promise<Record<string, number>> {
    const [kvstore, crd] = await Promise.all([
      this.#sides.kvstore.counts(),
      this.#sides.crd.counts(),
    ]);
    return { ...prefixed("kvstore", kvstore), ...prefixed("crd", crd) };
  }

  fileBytes(): Promise<number> {
    return Promise.resolve(0);
  }

  /** Injects store fault `kind` through the side that offers it. */
  async injectFault(kind: string, random: () => number): Promise<StoreFaultOutcome> {
    const route = this.#faults[kind];
    const side = route === undefined ? undefined : this.#sides[route.side] as NemesisRunStore;
    if (side?.injectFault === undefined) {
      throw new Error(`no store fault '${kind}' on a double-write store`);
    }
    const outcome = await side.injectFault(kind, random);
    return { ...outcome, detail: `${route!.side}: ${outcome.detail}` };
  }

  /** Disposes both sides (stopping their servers when the run owns them). */
  [Symbol.asyncDispose](): Promise<void> {
    return disposeBoth(this.#sides);
  }
}

/** Disposes the CRD side, then the kvstore side, whatever the first did. */
export async function disposeBoth(
  sides: { readonly kvstore: AsyncDisposable; readonly crd: AsyncDisposable },
): Promise<void> {
  try {
    await sides.crd[Symbol.asyncDispose]();
  } finally {
    await sides.kvstore[Symbol.asyncDispose]();
  }
}

/**
 * The snapshot of a double-write store made of its sides' own: every side's masters and
 * references together (what the drain waits to see gone), each side's snapshot under its name
 * for the store checks, its skipped entries named by side, and the drift between the sides as the
 * double-write doctor classifies it.
 */
export function bothSnapshots(kvstore: StoreSnapshot, crd: StoreSnapshot): StoreSnapshot {
  const skipped: Record<string, number> = {};
  for (const [side, s] of [["kvstore", kvstore], ["crd", crd]] as const) {
    for (const [what, n] of Object.entries(s.skipped)) skipped[`${side}: ${what}`] = n;
  }
  return {
    at: Math.max(kvstore.at, crd.at),
    masters: [...kvstore.masters, ...crd.masters],
    refs: [...kvstore.refs, ...crd.refs],
    // One key's master on each side is no duplicate; each side is judged on its own.
    strictMasters: false,
    skipped,
    sides: { kvstore, crd },
    drift: classifyDrift(byId(kvstore.masters), byId(crd.masters)).map(sideDrift),
  };
}

/** `counts` with each category named after `side` (`kvstore id`), as the growth table shows them. */
export function prefixed(side: Side, counts: Record<string, number>): Record<string, number> {
  return Object.fromEntries(Object.entries(counts).map(([what, n]) => [`${side} ${what}`, n]));
}

/** `counts` of one side, as {@linkcode prefixed} named them, without the side's name. */
export function sideCounts(side: Side, counts: Record<string, number>): Record<string, number> {
  const head = `${side} `;
  return Object.fromEntries(
    Object.entries(counts).filter(([what]) => what.startsWith(head)).map((
      [what, n],
    ) => [what.slice(head.length), n]),
  );
}

/** A side's masters as ID → key (a second master of one ID cannot be: IDs name the entries). */
function byId(masters: readonly SnapshotMaster[]): Map<number, string> {
  return new Map(masters.map((m) => [m.id, m.key]));
}

/** One finding of the double-write doctor's classification, as the nemesis reports drift. */
function sideDrift(d: Drift): SideDrift {
  const ids = [d.kvstoreId, d.crdId].filter((id) => id !== undefined);
  const kv = d.kvstoreId === undefined ? "none" : `${d.kvstoreId} → ${d.kvstoreKey}`;
  const crd = d.crdId === undefined ? "none" : `${d.crdId} → ${d.crdKey}`;
  return {
    kind: d.kind,
    broken: BROKEN.has(d.kind),
    ids: [...new Set(ids)],
    message: `${d.kind}: kvstore ${kv}, CRD ${crd}`,
  };
}
