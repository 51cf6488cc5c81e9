// The migration between Cilium's two identity stores as a user runs it, end to end, with real
// nodes: Cilium v1.16 kvstore nodes (`interop116`) and idalloc etcd nodes (each in its own process)
// hold identities; then every node is restarted, one at a time, in `doublewrite-readkvstore`
// (Cilium's nodes as `interop117`), `doublewrite-readcrd`, `crd`, and back through
// `doublewrite-readcrd` and `doublewrite-readkvstore` to `kvstore`. Each restarted node takes its
// held label sets again, plus new ones it shares with the next node restarted (so each mode's
// new identities are made by one kind of node and joined by the other). At the end of a
// double-write step the operator's check is run as a user would: `idalloc doctor` lists the drift
// and `doctor --fix` copies what is on one side only, so that the side read next lacks nothing.
//
// Asserted at every step: no held label set changes ID (every restarted node's answer, and every
// idalloc node's answer from memory and from the store), nothing is lost (every identity ever
// made, also those no node holds, is on the side the mode reads; in the double-write modes on both,
// with 0 on one side only and 0 differing). Time per step and identities per side go to stderr.
//
// Not in CI (no Cilium build there): skipped loudly where `interop116`/`interop117` are not built.
import assert from "node:assert/strict";
import { existsSync } from "node:fs";
import { join } from "node:path";
import process from "node:process";
import {
  countDrift,
  type DriftCount,
  type IdentityAllocationMode,
  isDoubleWrite,
  readSideOf,
} from "../../../src/backends/doublewrite/mod.ts";
import { etcdUnavailable } from "../../../src/backends/etcd/testing/cluster.ts";
import {
  type CiliumCrdNode,
  ciliumCrdNode,
  CiliumProcess,
  startCiliumCluster,
} from "../../../src/backends/k8s/testing/cilium.ts";
import { kubeApiserverUnavailable } from "../../../src/backends/k8s/testing/cluster.ts";
import { ScriptProcess } from "../../_support/script_process.ts";
import { cli } from "../../cli/_run.ts";
import { keyOf, labelSets } from "../k8s/_cilium.ts";
import type { AllocReport, AnswersReport } from "./_migration_node.ts";
import { labelsWriter, NAMESPACE, Stores } from "./_world.ts";

/** The v1.16 node and the 1.17.0-dev node (`$CILIUM_INTEROP117`, else beside it), or why not. */
function ciliumNodes(): { v116: CiliumCrdNode; v117: CiliumCrdNode } | { why: string } {
  const v116 = ciliumCrdNode();
  if (!("bin" in v116)) return v116;
  const bin = process.env.CILIUM_INTEROP117 ?? join(v116.bin, "..", "interop117");
  if (!existsSync(bin)) {
    return {
      why: `the Cilium 1.17.0-dev node is not built here (missing ${bin}): run ` +
        "'bash ../shared/cilium-node/build.sh --v117 <git dir>' (../shared/cilium-node/README.md), " +
        "or point CILIUM_INTEROP117 at the binary",
    };
  }
  return { v116, v117: { bin, crds: v116.crds } };
}

const nodes = ciliumNodes();
const missing = kubeApiserverUnavailable() ?? etcdUnavailable() ??
  ("why" in nodes ? nodes.why : undefined);
if (missing !== undefined) {
  const bar = "!".repeat(100);
  console.error(`\n${bar}\n!!! SKIPPING THE CILIUM MIGRATION TEST: ${missing}\n${bar}\n`);
}

/** The steps: a round trip from the kvstore to CRDs and back. */
const STEPS: readonly IdentityAllocationMode[] = [
  "doublewrite-readkvstore",
  "doublewrite-readcrd",
  "crd",
  "doublewrite-readcrd",
  "doublewrite-readkvstore",
  "kvstore",
];

/** A running node of either kind, in one mode. */
interface Running {
  /** Its allocations (key → ID) once it has allocated its label sets. */
  readonly ids: Readonly<Record<string, number>>;
  /** idalloc's node: its answers for its held keys. */
  answers?(): Promise<AnswersReport>;
  /** Stops it (a restart: nothing released). */
  stop(): Promise<void>;
  /** Kills it if still running. */
  [Symbol.asyncDispose](): Promise<void>;
}

/** One member of the cluster, across its restarts. */
interface Member {
  readonly name: string;
  readonly kind: "cilium" | "idalloc";
  /** The label sets it holds. */
  sets: string[][];
  running?: Running;
}

/** What one step measured. */
interface StepFigures {
  readonly step: string;
  readonly seconds: number;
  readonly restarts: number;
  readonly newIdentities: number;
  /** Sides once every node runs in the new mode, before the doctor. */
  readonly before: DriftCount;
  /** What `doctor` listed as drift, and what `doctor --fix` copied (double-write modes). */
  readonly drift: { readonly found: number; readonly copied: number; readonly kinds: string[] };
  /** Sides at the end of the step. */
  readonly after: DriftCount;
}

Deno.test({
  name:
    "migration: kvstore → readkvstore → readcrd → crd and back, with Cilium's nodes; no held ID " +
    "changes, nothing lost",
  ignore: missing !== undefined,
  async fn() {
    const { v116, v117 } = nodes as { v116: CiliumCrdNode; v117: CiliumCrdNode };
    await using cluster = await startCiliumCluster(v117);
    const kubeconfig = await cluster.kubeconfig("admin", { context: "test", namespace: NAMESPACE });
    const stores = new Stores(cluster, kubeconfig);
    const dir = await Deno.makeTempDir({ prefix: "idalloc-migration-" });
    const labelsFile = labelsWriter(dir);

    /** Starts `member` in `mode` (its `step`-th incarnation) and allocates its label sets. */
    const start = async (member: Member, mode: IdentityAllocationMode, step: number) => {
      const name = `${member.name}-s${step}`;
      const file = await labelsFile(member.sets);
      if (member.kind === "cilium") {
        // Before the migration the cluster runs Cilium v1.16; from its first step on, 1.17.
        const node = step === 0 ? v116 : v117;
        const modeArgs = step === 0 ? ["-etcd", stores.etcd] : [
          ...["-mode", mode],
          ...(mode === "crd" ? [] : ["-etcd", stores.etcd]),
          ...(mode === "kvstore" ? [] : ["-kubeconfig", kubeconfig]),
        ];
        const proc = new CiliumProcess(node, [
          ...modeArgs,
          ...["-node", name, "-labels", file, "-concurrency", "4", "-hold"],
        ]);
        const line = await proc.line(1).catch(async (err) => {
          await proc[Symbol.asyncDispose]();
          throw err;
        });
        assert.deepEqual(line.errors ?? [], [], `${name} (${mode}): Cilium's errors`);
        return {
          ids: line.mapping ?? {},
          stop: () => proc.stop(),
          [Symbol.asyncDispose]: () => proc[Symbol.asyncDispose](),
        } satisfies Running;
      }
      const child = new ScriptProcess(
        new URL("./_migration_node.ts", import.meta.url).pathname,
        [JSON.stringify({ etcd: stores.etcd, kubeconfig, mode, node: name })],
        { stdin: true },
      );
      const next = async <T>(): Promise<T> => {
        const line = await child.nextLine();
        if (line === undefined) throw new Error(`${name} ended: ${child.stderr}`);
        return JSON.parse(line) as T;
      };
      try {
        assert.deepEqual(await next(), { ready: true }, child.stderr);
        child.writeLine(`alloc ${file}`);
        const report = await next<AllocReport>();
        assert.deepEqual(report.errors, [], `${name} (${mode}): idalloc's errors`);
        return {
          ids: report.ids,
          answers: async () => {
            child.writeLine("answers");
            return await next<AnswersReport>();
          },
          stop: async () => {
            child.writeLine("end");
            await child.success(name);
          },
          [Symbol.asyncDispose]: () => child[Symbol.asyncDispose](),
        } satisfies Running;
      } catch (err) {
        await child[Symbol.asyncDispose]();
        throw err;
      }
    };

    // Every identity ever made: label set → ID. A held one must never change.
    const expected = new Map<string, number>();
    const changes: string[] = [];
    const note = (who: string, ids: Readonly<Record<string, number>>) => {
      for (const [key, id] of Object.entries(ids)) {
        const was = expected.get(key);
        if (was === undefined) expected.set(key, id);
        else if (was !== id) changes.push(`${who}: ${key} was ${was}, now ${id}`);
      }
    };

    const shared = labelSets("shared", 4);
    const members: Member[] = [
      { name: "c1", kind: "cilium", sets: [...labelSets("c1", 6), ...shared] },
      { name: "i1", kind: "idalloc", sets: [...labelSets("i1", 6), ...shared] },
      { name: "c2", kind: "cilium", sets: [...labelSets("c2", 6), ...shared] },
      { name: "i2", kind: "idalloc", sets: [...labelSets("i2", 6), ...shared] },
    ];
    const figures: StepFigures[] = [];
    try {
      // Before: Cilium v1.16 and idalloc on the kvstore. A node that came and went left four
      // identities nobody holds (released; the masters stay until GC, which is not run here).
      const gone = labelSets("orphan", 4);
      await using orphanNode = new CiliumProcess(v116, [
        ...["-etcd", stores.etcd, "-node", "c0", "-labels", await labelsFile(gone), "-release"],
      ]);
      const [orphans] = await Promise.all([orphanNode.line(1), orphanNode.exited]);
      assert.deepEqual(orphans.errors ?? [], []);
      note("c0", orphans.mapping ?? {});
      for (const member of members) {
        member.running = await start(member, "kvstore", 0);
        note(`${member.name}-s0`, member.running.ids);
      }
      let sides = await stores.sides();
      const count = countDrift(sides.kvstore, sides.crd);
      console.error(
        `migration: before, kvstore: ${expected.size} identities (${members.length} nodes ` +
          `holding ${new Set(members.flatMap((m) => m.sets.map(keyOf))).size}, 4 held by ` +
          `nobody); sides ${JSON.stringify(count)}`,
      );
      assert.equal(count.kvstore.total, expected.size);

      let previous: IdentityAllocationMode = "kvstore";
      for (const [index, mode] of STEPS.entries()) {
        const step = index + 1;
        const started = performance.now();
        const sizeBefore = expected.size;
        // New label sets of this step: each pair of nodes restarted one after the other shares
        // two, made by the first and joined by the second (forward: Cilium first; back: idalloc).
        const order = step <= 3 ? members : [members[1], members[0], members[3], members[2]];
        for (const [i, member] of order.entries()) {
          if (i % 2 === 0) {
            const fresh = labelSets(`s${step}-${member.name}`, 2);
            member.sets.push(...fresh);
            order[i + 1].sets.push(...fresh);
          }
          const heldBefore = member.sets.map(keyOf).filter((k) => expected.has(k));
          await member.running?.stop();
          member.running = await start(member, mode, step);
          const ids = member.running.ids;
          for (const key of heldBefore) {
            if (ids[key] !== expected.get(key)) {
              changes.push(
                `${member.name}-s${step} (${mode}): ${key} was ` +
                  `${expected.get(key)}, now ${ids[key]}`,
              );
            }
          }
          note(`${member.name}-s${step}`, ids);
        }
        // Every idalloc node answers every held key as it was, from memory and from the store.
        for (const member of members) {
          const answers = await member.running!.answers?.();
          if (answers === undefined) continue;
          assert.equal(answers.reassigned, 0, `${member.name}: reassigned`);
          for (const [key, id] of Object.entries(answers.cached)) {
            if (id !== expected.get(key) || answers.store[key] !== expected.get(key)) {
              changes.push(
                `${member.name}-s${step} answers ${key}: ${id} (memory), ` +
                  `${answers.store[key]} (store), expected ${expected.get(key)}`,
              );
            }
          }
        }
        assert.deepEqual(changes, [], `${previous} → ${mode}: held label sets changed ID`);

        sides = await stores.sides();
        const before = countDrift(sides.kvstore, sides.crd);
        let drift = { found: 0, copied: 0, kinds: [] as string[] };
        if (isDoubleWrite(mode)) {
          // The operator's check before the next step: nothing on one side only.
          const listed = await cli([...stores.cli(mode), "doctor", "--json"]);
          const found = (JSON.parse(listed.stdout || "[]") as { kind: string }[])
            .filter((f) =>
              f.kind.endsWith("-only") || f.kind === "labels-differ" ||
              f.kind === "key-split"
            );
          const fixed = await cli([...stores.cli(mode), "doctor", "--fix", "--json"]);
          assert.equal(fixed.code, 0, `doctor --fix in ${mode}: ${fixed.stderr}`);
          const outcomes = JSON.parse(fixed.stdout || "[]") as { outcome: string }[];
          drift = {
            found: found.length,
            copied: outcomes.filter((o) => o.outcome === "copied").length,
            kinds: [...new Set(found.map((f) => f.kind))].sort(),
          };
          sides = await stores.sides();
        }
        const after = countDrift(sides.kvstore, sides.crd);
        // Nothing lost: every identity ever made is on the side read (both, double-writing).
        const read = readSideOf(mode);
        const needed = isDoubleWrite(mode) ? ["kvstore", "crd"] as const : [read];
        for (const side of needed) {
          const lost = [...expected].filter(([key, id]) => sides[side].get(id) !== key);
          assert.deepEqual(lost, [], `${previous} → ${mode}: lost on the ${side} side`);
        }
        if (isDoubleWrite(mode)) {
          assert.equal(after.kvstore.only, 0, `${mode}: kvstore only after doctor --fix`);
          assert.equal(after.crd.only, 0, `${mode}: CRD only after doctor --fix`);
          assert.deepEqual(after.differing, []);
        }
        const figure: StepFigures = {
          step: `${previous} → ${mode}`,
          seconds: Math.round((performance.now() - started) / 100) / 10,
          restarts: members.length,
          newIdentities: expected.size - sizeBefore,
          before,
          drift,
          after,
        };
        figures.push(figure);
        console.error(`migration step ${step}: ${JSON.stringify(figure)}`);
        previous = mode;
      }
      assert.deepEqual(changes, []);
      // 4 orphans + 28 held before, 4 new per pair and step.
      assert.equal(expected.size, 32 + STEPS.length * 4);
    } finally {
      for (const member of members) await member.running?.[Symbol.asyncDispose]();
      await Deno.remove(dir, { recursive: true });
      console.error(`migration figures: ${JSON.stringify(figures)}`);
    }
  },
});
