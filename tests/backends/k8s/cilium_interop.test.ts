// idalloc beside real Cilium v1.16 nodes in CRD mode (`interop116 -kubeconfig`, Cilium's own
// pkg/k8s/identitybackend and pkg/allocator), on a real API server with Cilium's own CRDs: the
// same IDs for the same label sets whoever comes first; a race of Cilium and idalloc nodes in
// separate processes, judged by Cilium's own lookup rule; each side's GC against the other's
// holders; a killed idalloc node's identities collected. Not in CI (no Cilium build there): the
// tests skip loudly where the node is not built. The figures go to stderr for the closing note.
import assert from "node:assert/strict";
import { mkdir, mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Allocator } from "../../../mod.ts";
import { K8sBackend } from "../../../src/backends/k8s/mod.ts";
import { NODE_SELECTOR } from "../../../src/backends/k8s/layout.ts";
import { LEASES } from "../../../src/backends/k8s/options.ts";
import {
  ciliumCrdNode,
  ciliumCrds,
  type CiliumLine,
  CiliumProcess,
  runCilium,
} from "../../../src/backends/k8s/testing/cilium.ts";
import { eventually } from "../../_support/eventually.ts";
import type { ChildAnswers } from "./_interop_child.ts";
import {
  CILIUM_IDENTITIES,
  CILIUM_MANAGER,
  ciliumAnswers,
  ciliumTest,
  IdallocProcess,
  identityEvents,
  type InteropWorld,
  keyOf,
  labelSets,
  NAMESPACE,
  storeByKey,
  world,
} from "./_cilium.ts";

/** An in-process idalloc node on the world's API server; disposing it closes it. */
interface InProcessNode extends AsyncDisposable {
  readonly alloc: Allocator<string>;
}

async function idalloc(
  w: InteropWorld,
  node: string,
  options: { leaseTtlMs?: number; heartbeatTimeoutMs?: number; gcGraceMs?: number } = {},
): Promise<InProcessNode> {
  const backend = await K8sBackend.connect({
    node,
    kubeconfig: w.kubeconfig,
    context: "test",
    namespace: NAMESPACE,
    maxClockSkewMs: 500,
    ...(options.heartbeatTimeoutMs ? { heartbeatTimeoutMs: options.heartbeatTimeoutMs } : {}),
  });
  const alloc = await Allocator.open(backend, {
    min: 256,
    max: 65535,
    leaseTtlMs: options.leaseTtlMs ?? 3_000,
    ...(options.gcGraceMs !== undefined ? { gcGraceMs: options.gcGraceMs } : {}),
  });
  return {
    alloc,
    async [Symbol.asyncDispose]() {
      await alloc.close();
      await backend.close();
    },
  };
}

/** Cilium's `SanitizeK8sLabels` of a label set: its `k8s:` labels, minus namespace labels. */
function sanitized(set: readonly string[]): Record<string, string> {
  const out: Record<string, string> = {};
  for (const label of set) {
    const m = /^k8s:([^=]+)=(.*)$/.exec(label);
    if (m && !m[1].startsWith("io.cilium.k8s.namespace.labels")) out[m[1]] = m[2];
  }
  return out;
}

Deno.test("where Cilium's CRD-mode node and its CRDs are looked for; its CRDs as installed", async () => {
  const dir = await mkdtemp(join(tmpdir(), "idalloc-cilium-work-"));
  try {
    const missing = ciliumCrdNode({ CILIUM_WORK: dir });
    assert.ok("why" in missing);
    assert.match(missing.why, new RegExp(`missing ${dir}/bin/interop116, ${dir}/crds/`));
    assert.match(missing.why, /build\.sh --v116/);
    await mkdir(join(dir, "bin"));
    await mkdir(join(dir, "crds"));
    await writeFile(join(dir, "bin", "interop116"), "");
    for (const plural of ["ciliumidentities", "ciliumendpoints"]) {
      await writeFile(
        join(dir, "crds", `${plural}.yaml`),
        `---\napiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata:\n` +
          `  creationTimestamp: null\n  name: ${plural}.cilium.io\nspec:\n  group: cilium.io\n` +
          `status:\n  conditions: []\n`,
      );
    }
    const found = { bin: join(dir, "bin", "interop116"), crds: join(dir, "crds") };
    assert.deepEqual(ciliumCrdNode({ CILIUM_WORK: dir }), found);
    assert.deepEqual(
      ciliumCrdNode({ CILIUM_INTEROP116: found.bin, CILIUM_WORK: "/nonexistent" }),
      found,
    );
    assert.deepEqual(await ciliumCrds(found), [
      {
        apiVersion: "apiextensions.k8s.io/v1",
        kind: "CustomResourceDefinition",
        metadata: { name: "ciliumidentities.cilium.io" },
        spec: { group: "cilium.io" },
      },
      {
        apiVersion: "apiextensions.k8s.io/v1",
        kind: "CustomResourceDefinition",
        metadata: { name: "ciliumendpoints.cilium.io" },
        spec: { group: "cilium.io" },
      },
    ]);
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
});

ciliumTest("same IDs for the same 200 label sets, Cilium first and idalloc first", async () => {
  await using w = await world();
  const ciliumFirst = labelSets("cf", 200);
  const idallocFirst = labelSets("if", 200);

  const [c1] = await runCilium(w.node, [
    ...["-kubeconfig", w.kubeconfig, "-node", "c1", "-concurrency", "16", "-labels"],
    await w.labels(ciliumFirst),
  ]);
  assert.deepEqual(c1.errors, []);
  assert.equal(c1.is_new, 200);
  await using i1 = await idalloc(w, "i1");
  const a = i1.alloc;
  await a.waitForInitialSync();
  let joined = 0;
  for (const set of ciliumFirst) {
    const key = keyOf(set);
    const r = await a.allocate(key);
    assert.equal(r.id, c1.mapping?.[key], `${key}: idalloc and Cilium disagree`);
    assert.equal(r.isNew, false, key);
    joined++;
  }

  const ids = new Map<string, number>();
  for (const set of idallocFirst) {
    const r = await a.allocate(keyOf(set));
    assert.equal(r.isNew, true);
    ids.set(keyOf(set), r.id);
  }
  const [c2] = await runCilium(w.node, [
    ...["-kubeconfig", w.kubeconfig, "-node", "c2", "-concurrency", "16", "-labels"],
    await w.labels(idallocFirst),
  ]);
  assert.deepEqual(c2.errors, []);
  assert.equal(c2.is_new, 0, "Cilium created nothing: it found idalloc's identities");
  let agreed = 0;
  for (const [key, id] of ids) {
    assert.equal(c2.mapping?.[key], id, `${key}: Cilium and idalloc disagree`);
    agreed++;
  }

  // One identity per label set, and the same object layout whoever wrote it.
  const byKey = await storeByKey(w.client);
  assert.equal(byKey.size, 400);
  for (const group of byKey.values()) assert.equal(group.length, 1, group[0].key);
  const objects = new Map(
    (await w.client.list(CILIUM_IDENTITIES, {})).items.map((o) => [Number(o.metadata.name), o]),
  );
  for (
    const [sets, creator] of [[ciliumFirst, CILIUM_MANAGER], [idallocFirst, "idalloc"]] as const
  ) {
    for (const set of sets) {
      const [stored] = byKey.get(keyOf(set))!;
      assert.equal(stored.creator, creator);
      assert.deepEqual(objects.get(stored.id)!.metadata.labels, sanitized(set), keyOf(set));
    }
  }
  console.error(
    `interop same-ids: Cilium first ${joined}/200 joined by idalloc at Cilium's IDs; ` +
      `idalloc first ${agreed}/200 found by Cilium (is_new ${c2.is_new})`,
  );
});

/** What one race round left in the store, judged by Cilium's own lookup rule. */
interface RoundFigures {
  /** Identities Cilium's nodes created. */
  ciliumCreated: number;
  /** Identities idalloc's nodes created. */
  idallocCreated: number;
  /** Label sets given two or more identities by Cilium's nodes alone. */
  ciliumDuplicates: number;
  /** Identities Cilium's nodes created for a label set that had one already (creation order). */
  ciliumAdded: number;
  /** The same for idalloc's nodes. */
  idallocAdded: number;
  /** Label sets whose identities tie at the oldest second (Cilium's sort may answer either). */
  ties: number;
  /** Cilium nodes' answers that are not Cilium's own lookup's (they hold a younger duplicate). */
  ciliumOff: number;
  /** idalloc's answers equal to Cilium's lookup right after the race (of nodes × sets). */
  idallocAgreedAtOnce: number;
  /** idalloc's answers equal to Cilium's lookup once settled. */
  idallocAgreed: number;
  /** How long idalloc's nodes took to settle on Cilium's answers (ms). */
  settleMs: number;
}

const RACE_SETS = 300;
const RACE_ROUNDS = 3;

ciliumTest(
  `a race of 2 Cilium and 2 idalloc nodes on ${RACE_SETS} label sets, ${RACE_ROUNDS} rounds (and 4 Cilium nodes for comparison): idalloc answers Cilium's lookup`,
  async () => {
    await using w = await world();
    const figures: RoundFigures[] = [];
    for (let round = 0; round < RACE_ROUNDS; round++) {
      figures.push(await raceRound(w, `r${round}`, ["c1", "c2"], ["i1", "i2"]));
    }
    // Cilium's nodes in idalloc's place: what its agents do among themselves.
    const control = await raceRound(w, "control", ["c1", "c2", "c3", "c4"], []);
    console.error(`interop race (${RACE_SETS} sets, 2 Cilium + 2 idalloc nodes):`);
    for (const [i, f] of figures.entries()) console.error(`  round ${i + 1}: ${JSON.stringify(f)}`);
    console.error(`  4 Cilium nodes: ${JSON.stringify(control)}`);
  },
);

/** One round: the nodes allocate the same new label sets, in the same order, from one instant. */
async function raceRound(
  w: InteropWorld,
  tag: string,
  ciliumNodes: readonly string[],
  idallocNodes: readonly string[],
): Promise<RoundFigures> {
  const sets = labelSets(`race-${tag}`, RACE_SETS);
  const keys = sets.map(keyOf);
  const file = await w.labels(sets);
  const config = {
    kubeconfig: w.kubeconfig,
    context: "test",
    labels: file,
    concurrency: 16,
  };
  await using stack = new AsyncDisposableStack();
  const idalloc = idallocNodes.map((node) =>
    stack.use(new IdallocProcess({ ...config, node: `${node}-${tag}`, leaseTtlMs: 5_000 }))
  );
  await Promise.all(idalloc.map((i) => i.ready()));
  const created = stack.use(await identityEvents(w.client));
  // Cilium's nodes connect and sync in well under a second; all start together.
  const startAt = Date.now() + 2_000;
  const [cilium, mine] = await Promise.all([
    Promise.all(ciliumNodes.map(async (node) => {
      const [line] = await runCilium(w.node, [
        ...["-kubeconfig", w.kubeconfig, "-node", `${node}-${tag}`, "-labels", file],
        ...["-concurrency", "16", "-start-at", String(startAt)],
      ]);
      return line;
    })),
    Promise.all(idalloc.map((i) => i.allocate(startAt))),
  ]);
  for (const r of [...cilium, ...mine]) assert.deepEqual(r.errors, []);
  const byKey = await storeByKey(w.client);
  await created.stop();

  const f: RoundFigures = {
    ciliumCreated: 0,
    idallocCreated: 0,
    ciliumDuplicates: 0,
    ciliumAdded: 0,
    idallocAdded: 0,
    ties: 0,
    ciliumOff: 0,
    idallocAgreedAtOnce: 0,
    idallocAgreed: 0,
    settleMs: 0,
  };
  const place = (id: number) => {
    const at = created.created.get(id);
    assert.ok(at !== undefined, `the creation of ${id} was not seen`);
    return at;
  };
  for (const key of keys) {
    const group = byKey.get(key) ?? [];
    assert.ok(group.length > 0, `${key} has no identity`);
    const made = (who: string) => group.filter((g) => g.creator === who);
    // The key claims: idalloc's nodes never make two identities of one label set.
    assert.ok(made("idalloc").length <= 1, `idalloc made two identities of ${key}`);
    if (made(CILIUM_MANAGER).length > 1) f.ciliumDuplicates++;
    f.ciliumCreated += made(CILIUM_MANAGER).length;
    f.idallocCreated += made("idalloc").length;
    for (const g of group) {
      if (!group.some((o) => place(o.id) < place(g.id))) continue;
      if (g.creator === "idalloc") f.idallocAdded++;
      else f.ciliumAdded++;
    }
    const answers = ciliumAnswers(group);
    // idalloc's rule picks one of the IDs Cilium's lookup may answer (ties: the lowest).
    assert.ok(answers.includes(group[0].id));
    if (answers.length > 1) f.ties++;
    for (const c of cilium) if (!answers.includes(c.mapping![key])) f.ciliumOff++;
  }
  if (idalloc.length === 0) return f;
  // idalloc's nodes answer Cilium's lookup: a node that meets an older identity of a set while or
  // after it acquires the set moves to it at once (well within a sync interval, 60 s).
  const settleFrom = Date.now();
  const agreed = (a: ChildAnswers) =>
    keys.filter((key) => a.answers[key] === byKey.get(key)![0].id).length;
  let last = await Promise.all(idalloc.map((i) => i.answers()));
  f.idallocAgreedAtOnce = last.reduce((n, a) => n + agreed(a), 0);
  await eventually(
    async () => {
      last = await Promise.all(idalloc.map((i) => i.answers()));
      return last.every((a) => agreed(a) === keys.length);
    },
    "idalloc's nodes answer Cilium's lookup",
    30_000,
  );
  f.settleMs = Date.now() - settleFrom;
  f.idallocAgreed = last.reduce((n, a) => n + agreed(a), 0);
  await Promise.all(idalloc.map((i) => i.end()));
  return f;
}

/** The IDs of `sets` in the store (each must have exactly one). */
async function idsOf(w: InteropWorld, sets: readonly (readonly string[])[]): Promise<number[]> {
  const byKey = await storeByKey(w.client);
  return sets.map((set) => {
    const group = byKey.get(keyOf(set));
    assert.equal(group?.length, 1, keyOf(set));
    return group![0].id;
  });
}

/** The IDs among `ids` that exist now. */
async function existing(w: InteropWorld, ids: readonly number[]): Promise<number[]> {
  const { items } = await w.client.list(CILIUM_IDENTITIES, {});
  const present = new Set(items.map((o) => Number(o.metadata.name)));
  return ids.filter((id) => present.has(id));
}

/** Sums the operator rule's rounds. */
function gcTotals(
  line: CiliumLine,
): { rounds: number; marked: number; deleted: number; conflicts: number } {
  const rounds = line.gc ?? [];
  const sum = (f: "marked" | "deleted" | "conflicts") => rounds.reduce((n, r) => n + r[f], 0);
  return {
    rounds: rounds.length,
    marked: sum("marked"),
    deleted: sum("deleted"),
    conflicts: sum("conflicts"),
  };
}

const HEARTBEAT_TIMEOUT_MS = 5_000;
const OPERATOR_ROUNDS = 51;

ciliumTest(
  `Cilium's operator GC rule never deletes what idalloc nodes hold over ${
    (OPERATOR_ROUNDS - 1) * 1000 / HEARTBEAT_TIMEOUT_MS
  } heartbeat timeouts, and collects the rest`,
  async () => {
    await using w = await world();
    // Renewal every third of the lease, within a third of the heartbeat timeout (validated).
    const options = { heartbeatTimeoutMs: HEARTBEAT_TIMEOUT_MS, leaseTtlMs: 4_000 };
    await using a = await idalloc(w, "a", options);
    await using b = await idalloc(w, "b", options);
    const held = labelSets("held", 40);
    const freed = labelSets("freed", 20);
    const ciliumGone = labelSets("cgone", 20);
    for (const [i, set] of held.entries()) {
      // a holds the first half, b the second, both the middle ten.
      if (i < 25) await a.alloc.allocate(keyOf(set));
      if (i >= 15) await b.alloc.allocate(keyOf(set));
    }
    for (const set of freed) {
      await a.alloc.allocate(keyOf(set));
      await a.alloc.release(keyOf(set));
    }
    const [gone] = await runCilium(w.node, [
      ...["-kubeconfig", w.kubeconfig, "-node", "c-gone", "-labels"],
      await w.labels(ciliumGone),
    ]);
    assert.equal(gone.is_new, ciliumGone.length);
    const heldIds = await idsOf(w, held);
    const unused = [...await idsOf(w, freed), ...await idsOf(w, ciliumGone)];

    await using events = await identityEvents(w.client);
    const [operator] = await runCilium(w.node, [
      ...["-kubeconfig", w.kubeconfig, "-node", "operator", "-gc", String(OPERATOR_ROUNDS)],
      ...["-gc-interval", "1s", "-heartbeat-timeout", `${HEARTBEAT_TIMEOUT_MS}ms`],
    ]);
    // The rule's last marks on held identities are taken off too.
    await eventually(async () => {
      const byKey = await storeByKey(w.client);
      return held.every((set) => byKey.get(keyOf(set))?.[0].mark === undefined);
    }, "idalloc took the last marks off");
    await events.stop();
    const totals = gcTotals(operator);

    assert.deepEqual(await existing(w, heldIds), heldIds, "every held identity is still there");
    assert.deepEqual(await existing(w, unused), [], "every unused identity was collected");
    assert.equal(totals.deleted, unused.length);
    // The rule did mark what idalloc holds, again and again; idalloc took every mark off.
    const heldSet = new Set(heldIds);
    const marks = events.events.filter((e, i) =>
      heldSet.has(e.id) && e.marked &&
      !events.events.slice(0, i).reverse().find((p) => p.id === e.id)?.marked
    ).length;
    const unmarks = events.events.filter((e, i) =>
      heldSet.has(e.id) && !e.marked &&
      events.events.slice(0, i).reverse().find((p) => p.id === e.id)?.marked === true
    ).length;
    assert.ok(marks >= heldIds.length, `the operator rule marked held identities ${marks} times`);
    assert.equal(unmarks, marks, "idalloc removed every mark from what it holds");
    for (const node of [a, b]) assert.equal(node.alloc.status().fence.reassigned, 0);
    assert.equal(events.events.filter((e) => e.type === "DELETED" && heldSet.has(e.id)).length, 0);
    console.error(
      `interop operator GC (heartbeat timeout ${HEARTBEAT_TIMEOUT_MS} ms, ${totals.rounds} rounds ` +
        `1 s apart): ${heldIds.length} held by idalloc kept (marked ${marks} times, unmarked ` +
        `${unmarks} times by idalloc), ${totals.deleted}/${unused.length} unused deleted ` +
        `(${totals.marked} marks, ${totals.conflicts} refused deletes)`,
    );
  },
);

ciliumTest(
  "idalloc's GC never deletes what Cilium's nodes hold (CiliumEndpoints name them) or idalloc nodes hold, and collects the rest",
  async () => {
    await using w = await world();
    const c1Sets = labelSets("c1", 30);
    const c2Sets = labelSets("c2", 30);
    const ciliumGone = labelSets("cgone", 20);
    const idallocHeld = labelSets("iheld", 20);
    const freed = labelSets("freed", 20);
    // Two Cilium nodes hold their label sets; each pod's endpoint names its identity.
    await using c1 = new CiliumProcess(w.node, [
      ...["-kubeconfig", w.kubeconfig, "-node", "c1", "-hold", "-labels"],
      await w.labels(c1Sets),
    ]);
    await using c2 = new CiliumProcess(w.node, [
      ...["-kubeconfig", w.kubeconfig, "-node", "c2", "-hold", "-labels"],
      await w.labels(c2Sets),
    ]);
    const cilium = [await c1.line(), await c2.line()];
    const named = cilium.flatMap((line) => Object.values(line.mapping!));
    for (const id of named) await w.endpoint(`pod-${id}`, id);
    await runCilium(w.node, [
      ...["-kubeconfig", w.kubeconfig, "-node", "c-gone", "-labels"],
      await w.labels(ciliumGone),
    ]);
    await using a = await idalloc(w, "a");
    for (const set of idallocHeld) await a.alloc.allocate(keyOf(set));
    for (const set of freed) {
      await a.alloc.allocate(keyOf(set));
      await a.alloc.release(keyOf(set));
    }
    const heldIds = await idsOf(w, idallocHeld);
    const unused = [...await idsOf(w, ciliumGone), ...await idsOf(w, freed)];

    // Passes back to back: the grace (a lease TTL by default) would only stretch the count.
    await using gc = await idalloc(w, "gc", { gcGraceMs: 0 });
    const keep = [...named, ...heldIds];
    let passes = 0;
    let marked = 0;
    const deleted: number[] = [];
    while ((await existing(w, unused)).length > 0) {
      assert.ok(passes < 5, `collected in ${passes} passes`);
      const stats = await gc.alloc.runGc();
      passes++;
      marked += stats.marked;
      deleted.push(...stats.deletedIds);
      assert.deepEqual(await existing(w, keep), keep, `pass ${passes} kept what is held`);
    }
    assert.deepEqual(deleted.sort(), [...unused].sort());
    await Promise.all([c1.stop(), c2.stop()]);
    console.error(
      `interop idalloc GC: ${named.length} held by Cilium (CiliumEndpoints) and ${heldIds.length} ` +
        `by idalloc kept; ${deleted.length}/${unused.length} unused collected in ${passes} passes ` +
        `(${marked} marks)`,
    );
  },
);

ciliumTest(
  "a killed idalloc node's identities are collected once its lease lapses: by idalloc's GC, and by Cilium's operator rule",
  async () => {
    await using w = await world();
    const spawn = async (
      node: string,
      sets: readonly (readonly string[])[],
      timing: { leaseTtlMs: number; heartbeatTimeoutMs?: number },
    ) => {
      const child = new IdallocProcess({
        kubeconfig: w.kubeconfig,
        context: "test",
        labels: await w.labels(sets),
        concurrency: 8,
        node,
        ...timing,
      });
      await child.ready();
      const result = await child.allocate();
      assert.deepEqual(result.errors, []);
      await child.kill();
      return Object.values(result.ids);
    };

    // idalloc's GC: nothing while the dead node's Lease still runs, everything after. (A Lease
    // long enough for the first pass to come before it lapses, on a loaded machine too.)
    // No grace: the store's default (Cilium's heartbeat timeout, 30 min) would keep what the dead
    // node made a moment ago; the Lease alone is under test here.
    await using gc = await idalloc(w, "gc", { gcGraceMs: 0 });
    const first = await spawn("k1", labelSets("k1", 30), { leaseTtlMs: 15_000 });
    const early = await gc.alloc.runGc();
    const stillLive = await leaseLive(w, "k1");
    if (stillLive) assert.equal(early.marked, 0, "nothing is marked while the Lease runs");
    let passes = 1;
    const deleted: number[] = [];
    const until = Date.now() + 90_000;
    while ((await existing(w, first)).length > 0) {
      assert.ok(Date.now() < until, "idalloc's GC collects the dead node's identities");
      await new Promise((r) => setTimeout(r, 500));
      deleted.push(...(await gc.alloc.runGc()).deletedIds);
      passes++;
    }
    assert.deepEqual(deleted.sort(), [...first].sort());

    // Cilium's operator rule: the dead node no longer takes its marks off.
    const second = await spawn("k2", labelSets("k2", 30), {
      leaseTtlMs: 4_000,
      heartbeatTimeoutMs: HEARTBEAT_TIMEOUT_MS,
    });
    const [operator] = await runCilium(w.node, [
      ...["-kubeconfig", w.kubeconfig, "-node", "operator", "-gc", "16"],
      ...["-gc-interval", "1s", "-heartbeat-timeout", `${HEARTBEAT_TIMEOUT_MS}ms`],
    ]);
    assert.deepEqual(await existing(w, second), [], "the operator rule collected them");
    const totals = gcTotals(operator);
    console.error(
      `interop killed node: idalloc's GC collected ${deleted.length}/${first.length} in ${passes} ` +
        `passes (first pass with the Lease ${stillLive ? "live: 0 marked" : "already lapsed"}); ` +
        `the operator rule collected ${totals.deleted}/${second.length} in ${totals.rounds} rounds`,
    );
  },
);

/** Whether `node`'s Lease is live now (renewTime + duration ahead). */
async function leaseLive(w: InteropWorld, node: string): Promise<boolean> {
  const { items } = await w.client.list(LEASES, {
    namespace: NAMESPACE,
    labelSelector: NODE_SELECTOR,
  });
  const lease = items.find((l) =>
    (l as { spec?: { holderIdentity?: string } }).spec?.holderIdentity === node
  ) as { spec: { renewTime: string; leaseDurationSeconds: number } } | undefined;
  if (!lease) return false;
  return Date.parse(lease.spec.renewTime) + lease.spec.leaseDurationSeconds * 1000 > Date.now();
}
