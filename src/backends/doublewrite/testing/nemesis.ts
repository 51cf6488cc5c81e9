/**
 * The double-write store's nemesis hooks, composed of the etcd harness's and the Kubernetes
 * harness's: a run starts both of their stores (a private 3-member etcd as Cilium's kvstore, a
 * private kube-apiserver with Cilium's CRDs), and its workers are idalloc nodes on a
 * {@linkcode DoubleWriteBackend} of the two. Every store fault of either side is offered under its
 * own kind (the kvstore's etcd members killed, all down, compacted; the API server restarted, its
 * etcd restarted, its watches expired), injected by that side's own code; a lease is revoked on
 * one side, drawn by the seed. No garbage is planted: each side's own run does that.
 *
 * **A migration step during the run**: workers start in the mode the step leaves, and every
 * restart after a kill brings the worker back in the mode it enters, so both modes run side by
 * side as in a rolling restart; the GC loop and the probe run in the mode entered. Even seeds
 * step toward the CRDs (`doublewrite-readkvstore` → `doublewrite-readcrd`), odd seeds back
 * (`./nemesis_spec.ts`).
 *
 * @module
 */
import { etcdNemesis } from "../../etcd/testing/nemesis.ts";
import { k8sNemesis } from "../../k8s/testing/nemesis.ts";
import type {
  GrowthSample,
  NemesisHooks,
  NemesisRunStore,
  NemesisStore,
  NemesisStoreSpec,
  NemesisTimings,
  NemesisWorkload,
  OpenBackendExtra,
  OpenedBackend,
} from "../../../testing/nemesis.ts";
import { DoubleWriteBackend } from "../backend.ts";
import type { Side } from "../mode.ts";
import {
  disposeBoth,
  DoubleWriteNemesisStore,
  type DoubleWriteSides,
  sideCounts,
  type SideFaults,
} from "./nemesis_store.ts";
import { DOUBLEWRITE_KIND, doubleWriteSpec, migrationOf } from "./nemesis_spec.ts";

/** Each side's harness hooks. */
const SIDES: Readonly<Record<Side, NemesisHooks>> = { kvstore: etcdNemesis, crd: k8sNemesis };

/** Every store fault of either side, routed to it and labelled with its name. */
const SIDE_FAULTS: SideFaults = Object.fromEntries(
  (Object.entries(SIDES) as [Side, NemesisHooks][]).flatMap(([side, hooks]) =>
    Object.entries(hooks.storeFaults ?? {}).map(([kind, label]) => [
      kind,
      { side, label: `${side}: ${label}` },
    ])
  ),
);

/** What `open` made of each side, each disposed when the other fails to open. */
async function both<T extends AsyncDisposable>(
  open: (hooks: NemesisHooks, side: Side) => Promise<T>,
): Promise<{ kvstore: T; crd: T }> {
  const kvstore = await open(SIDES.kvstore, "kvstore");
  try {
    return { kvstore, crd: await open(SIDES.crd, "crd") };
  } catch (err) {
    await kvstore[Symbol.asyncDispose]();
    throw err;
  }
}

/** A run's store: both sides' own run stores, and the migration step of the run's seed. */
async function startRun(dir: string, workload: NemesisWorkload): Promise<NemesisRunStore> {
  const sides: DoubleWriteSides = await both((hooks) => hooks.startRun(dir, workload));
  const step = migrationOf(workload.seed);
  return new DoubleWriteNemesisStore(
    { kind: DOUBLEWRITE_KIND, mode: step.to, kvstore: sides.kvstore.spec, crd: sides.crd.spec },
    sides,
    { faults: SIDE_FAULTS, leaving: step.from },
  );
}

/** The store `spec` names, each side opened by its harness (the growth worker's counts). */
async function openStore(spec: NemesisStoreSpec): Promise<NemesisStore> {
  const s = doubleWriteSpec(spec);
  return new DoubleWriteNemesisStore(s, await both((hooks, side) => hooks.openStore(s[side])));
}

/** `node`'s double-write backend in the mode `spec` names, each side opened by its harness. */
async function openBackend(
  spec: NemesisStoreSpec,
  node: string,
  extra?: OpenBackendExtra,
): Promise<OpenedBackend> {
  const s = doubleWriteSpec(spec);
  const sides = await both((hooks, side) => hooks.openBackend(s[side], node, extra));
  return {
    backend: new DoubleWriteBackend({
      mode: s.mode,
      kvstore: sides.kvstore.backend,
      crd: sides.crd.backend,
    }),
    [Symbol.asyncDispose]: () => disposeBoth(sides),
  };
}

/** `sample` as one side's growth run saw it. */
function sideSample(side: Side, sample: GrowthSample): GrowthSample {
  return { ...sample, counts: sideCounts(side, sample.counts) };
}

/** The double-write store's nemesis hooks (see the module doc). */
export const doubleWriteNemesis: NemesisHooks = {
  faults: ["kill", "stall", "lease-revoke"],
  storeFaults: Object.fromEntries(Object.entries(SIDE_FAULTS).map(([k, f]) => [k, f.label])),
  garbageKinds: [],
  // Both stores start, one after the other, and both are read by the checks.
  overhead: {
    fixed: SIDES.kvstore.overhead.fixed + SIDES.crd.overhead.fixed,
    share: Math.max(SIDES.kvstore.overhead.share, SIDES.crd.overhead.share),
  },
  cilium: false,
  // The CRD side's lease (5 s: each renewal is an API write) on the kvstore's timings.
  timings: (name: string, timings: NemesisTimings) =>
    SIDES.crd.timings(name, SIDES.kvstore.timings(name, timings)),
  startRun,
  async startGrowth(dir: string) {
    const sides = await both((hooks) => hooks.startGrowth(dir));
    return {
      spec: {
        kind: DOUBLEWRITE_KIND,
        mode: migrationOf(undefined).from,
        kvstore: sides.kvstore.spec,
        crd: sides.crd.spec,
      },
      [Symbol.asyncDispose]: () => disposeBoth(sides),
    };
  },
  openStore,
  openBackend,
  growth: {
    check(sample, bounds, fail) {
      for (const side of ["kvstore", "crd"] as const) {
        SIDES[side].growth.check(
          sideSample(side, sample),
          bounds,
          (what) => fail(`${side}: ${what}`),
        );
      }
    },
    columns: [
      ...SIDES.kvstore.growth.columns.map((c) => `kv ${c}`),
      ...SIDES.crd.growth.columns.map((c) => `crd ${c}`),
    ],
    row: (sample) => [
      ...SIDES.kvstore.growth.row(sideSample("kvstore", sample)),
      ...SIDES.crd.growth.row(sideSample("crd", sample)),
    ],
  },
};
