/**
 * `deno task bench k8s-scale`: the Kubernetes backend with many nodes, on one private API server
 * (etcd + kube-apiserver, the repository's test harness) with Cilium's CRDs. Each simulated node
 * is a real idalloc session with its own node Lease, client and watch; many run in each of a few
 * worker processes (`k8s_scale_node.ts`). Only the library's public entries and the test harness
 * are used, and what the bench reports about the store comes from the API server itself (its
 * `/metrics`, a watch of its own, an object as served: `k8s_scale_api.ts`), so it measures
 * whatever layout the backend writes.
 *
 * Scenarios (`--scenarios join,race,gc`), at each node count of `--nodes`, each count on a fresh
 * identity resource (its own CRD group):
 *
 * - **join**: one node allocates the shared label set (a DaemonSet's identity exists before the
 *   other nodes come), then the nodes, synced, all allocate it and 5 of their own at once: time
 *   until every node holds its 6; API requests per join (`apiserver_request_total` before and
 *   after); the bytes a watcher of the identity resource receives per join, in all and for the
 *   shared identity; the shared identity's size as served with its 1 holder and with all n; then
 *   the API requests per second at steady state over `--window` seconds (the backend's syncs run
 *   every 60 s).
 * - **race**: every node allocates one new label set at the same instant: identities created
 *   (want 1) and the p99 time to an answer. Beside it, `--cilium-nodes` real Cilium v1.16 CRD-mode
 *   nodes (`interop116 -kubeconfig`, separate processes) race for a label set of their own, and as
 *   many idalloc nodes for another (where Cilium's node is built here).
 * - **gc**: identities with half named by `CiliumEndpoint`s (`--gc-identities`): idalloc's GC
 *   (grace 0: one pass marks, the next deletes, a third finds nothing to do and reads the
 *   endpoints from the informers the first started) beside Cilium v1.16's operator rule
 *   (`interop116 -gc 3`: seeing, marking, then deleting) on the same set, re-filled: time and requests.
 *
 * Each size's rows are printed on stdout as soon as it is measured (`k8s-scale at 50 nodes: …`),
 * so a run that is stopped keeps what it finished; the table with the growth comes at the end.
 *
 * Every growing figure gets a fitted growth (`∝ n^k` in log–log space, and the linear slope per
 * node or identity) and what it predicts at 5,000 nodes (GC: at 30,000 identities, Cilium's CI
 * ratio of 6 identities per node at 5,000 nodes).
 *
 * @module
 */
import { writeFile } from "node:fs/promises";
import { join } from "node:path";
import { Allocator } from "../mod.ts";
import { K8sBackend, type KubeClient, type KubeObject } from "../src/backends/k8s/mod.ts";
import {
  type CiliumCrdNode,
  ciliumCrdNode,
  ciliumCrds,
  runCilium,
} from "../src/backends/k8s/testing/cilium.ts";
import {
  findKubeApiserver,
  identityResource,
  type KubeTestCluster,
  startKubeApiServer,
} from "../src/backends/k8s/testing/cluster.ts";
import { ApiProbe } from "./k8s_scale_api.ts";
import type { NodeAnswer, WorkerCommand, WorkerConfig, WorkerReply } from "./k8s_scale_node.ts";
import {
  bytes,
  type Figure,
  ms,
  quantile,
  type RequestCounts,
  requestDelta,
  round,
  scaleMarkdown,
  type ScaleOptions,
  scaleRows,
  sizeRows,
  topRequests,
  totalRequests,
} from "./k8s_scale_table.ts";
import { linesOf } from "./scale.ts";
import type { BenchRow } from "./_table.ts";

const WORKER = new URL("./k8s_scale_node.ts", import.meta.url).pathname;
/** The label set every node joins: a DaemonSet's, as kube-dns's or Cilium's own would be. */
const SHARED = "k8s:app=daemonset;k8s:io.kubernetes.pod.namespace=kube-system;";
const OWN = 5;
/** The prediction's node count: the largest clusters Cilium's CRD mode runs on. */
const PREDICT_NODES = 5_000;
/** Identities at 5,000 nodes at Cilium's CI scale test's ratio (1,000 nodes, 6,000 identities). */
const PREDICT_IDENTITIES = 30_000;
/** Kubernetes' limit on an object's annotations together (`TotalAnnotationSizeLimitB`). */
const ANNOTATION_LIMIT = 256 * 1024;
/** The first ID the GC scenario's identities take (inside the allocators' 256–65535). */
const GC_FIRST_ID = 1_000;
/** Creates in flight while filling the GC scenario's store. */
const FILL_WIDTH = 32;

/** A worker or Cilium node that failed, or a scenario that found the store not as it expects. */
export class ScaleBenchError extends Error {
  /** @param message What happened. */
  constructor(message: string) {
    super(message);
    this.name = "ScaleBenchError";
  }
}

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));
const progress = (what: string) => console.error(`  k8s-scale: ${what}`);

/**
 * Prints the rows of `size` on stdout at once, in the final table's form, and with `--markdown`
 * the table so far on stderr: a run that is killed keeps every size it finished.
 */
function printSize(o: ScaleOptions, figures: Figures, size: number, unit: string): void {
  const rows = sizeRows(figures.all(), size, unit);
  const width = Math.max(...rows.map((r) => r.name.length));
  for (const row of rows) console.log(`${row.name.padEnd(width)}  ${row.value}`);
  if (o.markdown) console.error(`\n${scaleMarkdown(figures.all())}\n`);
}

/** One worker process and its replies. */
class ScaleWorker implements AsyncDisposable {
  readonly #child: Deno.ChildProcess;
  readonly #replies: AsyncGenerator<WorkerReply>;
  readonly #stdin: WritableStreamDefaultWriter<Uint8Array>;

  constructor(config: WorkerConfig) {
    this.#child = new Deno.Command(Deno.execPath(), {
      args: ["run", "-A", WORKER, JSON.stringify(config)],
      stdin: "piped",
      stdout: "piped",
      stderr: "inherit",
    }).spawn();
    this.#replies = linesOf<WorkerReply>(this.#child.stdout);
    this.#stdin = this.#child.stdin.getWriter();
  }

  /** The next reply; throws when the worker failed or ended. */
  async reply(): Promise<WorkerReply> {
    const { value, done } = await this.#replies.next();
    if (done) throw new ScaleBenchError("a worker ended without answering");
    if (value.type === "error") throw new ScaleBenchError(`a worker failed: ${value.message}`);
    return value;
  }

  /** Sends `command`. */
  async send(command: WorkerCommand): Promise<void> {
    await this.#stdin.write(new TextEncoder().encode(`${JSON.stringify(command)}\n`));
  }

  /** Errors nothing caught in the worker so far (as of its last answers). */
  uncaught = 0;

  /** Sends `command` and returns the nodes' answers. */
  async answers(command: WorkerCommand): Promise<readonly NodeAnswer[]> {
    await this.send(command);
    const reply = await this.reply();
    if (reply.type !== "answers") throw new ScaleBenchError(`unexpected ${reply.type}`);
    this.uncaught = reply.uncaught;
    return reply.answers;
  }

  /** Closes the nodes (their Leases go) and waits for the process; kills it if it hangs. */
  async [Symbol.asyncDispose](): Promise<void> {
    try {
      await this.send({ cmd: "close" });
      await this.#stdin.close();
    } catch { /* it ended already */ }
    const timer = setTimeout(() => this.#child.kill("SIGKILL"), 60_000);
    await this.#child.status;
    clearTimeout(timer);
    // Drain what is left so that the stream is closed.
    for await (const _ of this.#replies) { /* nothing */ }
  }
}

/** The world of one run: the server, a kubeconfig, the probe, an admin client. */
interface World {
  readonly cluster: KubeTestCluster;
  readonly kubeconfig: string;
  readonly probe: ApiProbe;
  readonly client: KubeClient;
  readonly cilium: CiliumCrdNode | undefined;
  /** Where the side's labels files go. */
  readonly dir: string;
}

/** The figures as they are measured: name → figure. */
class Figures {
  readonly #byName = new Map<string, Figure & { values: Map<number, number> }>();

  /** Records `value` at `size` for the figure `name` (created with `shape` the first time). */
  add(name: string, size: number, value: number, shape: Omit<Figure, "name" | "values">): void {
    let f = this.#byName.get(name);
    if (!f) this.#byName.set(name, f = { name, values: new Map(), ...shape });
    f.values.set(size, value);
  }

  /** Sets the note of `name`. */
  note(name: string, note: string): void {
    const f = this.#byName.get(name);
    if (f) this.#byName.set(name, { ...f, note });
    else this.#byName.set(name, { name, values: new Map(), format: round, note });
  }

  /** Every figure, in the order first recorded. */
  all(): Figure[] {
    return [...this.#byName.values()];
  }
}

const perNode = { predictAt: PREDICT_NODES, per: "node" } as const;
const perIdentity = { predictAt: PREDICT_IDENTITIES, per: "identity" } as const;
const count = (x: number) => round(x);
const perSecond = (x: number) => `${round(x)}/s`;

/** Spreads `n` nodes over the workers and waits until every session is open and synced. */
async function openNodes(w: World, o: ScaleOptions, n: number, group: string) {
  const workers: ScaleWorker[] = [];
  const width = Math.min(o.workers, n);
  let first = 0;
  for (let i = 0; i < width; i++) {
    const count = Math.floor(n / width) + (i < n % width ? 1 : 0);
    workers.push(
      new ScaleWorker({
        kubeconfig: w.kubeconfig,
        context: "test",
        group,
        first,
        count,
        prefix: `n${n}-`,
      }),
    );
    first += count;
  }
  const t = performance.now();
  try {
    for (const worker of workers) {
      const reply = await worker.reply();
      if (reply.type !== "opened") throw new ScaleBenchError(`unexpected ${reply.type}`);
    }
  } catch (err) {
    await Promise.all(workers.map((x) => x[Symbol.asyncDispose]()));
    throw err;
  }
  return { workers, openMs: performance.now() - t };
}

/** Every worker's nodes' answers to `command`. */
async function allAnswers(workers: readonly ScaleWorker[], command: WorkerCommand) {
  return (await Promise.all(workers.map((x) => x.answers(command)))).flat();
}

/** The failed allocations the nodes of `answers` tried again. */
function retriesOf(answers: readonly NodeAnswer[]): number {
  return answers.reduce((s, a) => s + a.retries, 0);
}

/** The nodes of `answers` that gave up; the first one's reason is logged. */
function failuresOf(answers: readonly NodeAnswer[]): number {
  const failed = answers.filter((a) => a.failed);
  if (failed.length > 0) progress(`${failed.length} nodes gave up, e.g. ${failed[0].failed}`);
  return failed.length;
}

/** When a command sent now should start: after every worker has read it. */
const soon = () => Date.now() + 500;

/** The identities of `resourcePath` whose labels name `tag` (one label set's identities). */
async function identitiesOf(w: World, resourcePath: string, tag: string): Promise<number> {
  const list = JSON.parse(await w.probe.text(resourcePath)) as {
    items: { "security-labels"?: Record<string, string> }[];
  };
  return list.items.filter((o) => Object.values(o["security-labels"] ?? {}).includes(tag)).length;
}

function identitiesPath(group: string): string {
  return `/apis/${group}/v2/ciliumidentities`;
}

/** The join scenario at `n` nodes (see the module doc). */
async function joinAt(
  w: World,
  o: ScaleOptions,
  n: number,
  group: string,
  workers: readonly ScaleWorker[],
  figures: Figures,
): Promise<void> {
  const path = identitiesPath(group);
  // The shared identity exists before the others join, as a DaemonSet's does when nodes come:
  // its size with its one holder, then with all n.
  const [holder] = await allAnswers(workers, { cmd: "race", at: soon(), key: SHARED, below: 1 });
  if (holder.failed) throw new ScaleBenchError(`the first holder failed: ${holder.failed}`);
  const served = async () =>
    new TextEncoder().encode(await w.probe.text(`${path}/${holder.id}`)).byteLength;
  figures.add("join: shared identity's size, 1 holder", n, await served(), {
    format: bytes,
    ...perNode,
  });
  const watch = await w.probe.watch(path);
  const before = await w.probe.requests();
  const answers = await allAnswers(workers, { cmd: "join", at: soon(), shared: SHARED, own: OWN });
  const after = await w.probe.requests();
  // Events of the last writes may still be on their way to the watcher.
  await sleep(1_000);
  const tally = await watch.stop();
  const ids = new Set(answers.filter((a) => !a.failed).map((a) => a.id));
  if (ids.size !== 1) throw new ScaleBenchError(`the shared key got ${ids.size} IDs: ${[...ids]}`);
  const [shared] = ids;
  if (shared !== holder.id) throw new ScaleBenchError(`joined ${shared}, not ${holder.id}`);
  figures.add("join: nodes that did not hold after 5 tries", n, failuresOf(answers), {
    format: count,
  });
  const times = answers.filter((a) => !a.failed).map((a) => a.ms);
  figures.add("join: time until all hold (shared + 5 own)", n, Math.max(...times), {
    format: ms,
    ...perNode,
  });
  figures.add("join: allocations tried again after a failure", n, retriesOf(answers), {
    format: count,
  });
  figures.add("join: p50 time to hold", n, quantile(times, 0.5), { format: ms, ...perNode });
  const requests = requestDelta(before, after);
  figures.add("join: API requests per joining node", n, totalRequests(requests) / n, {
    format: count,
    ...perNode,
  });
  figures.note(
    "join: API requests per joining node",
    `at ${n}: ${topRequests(requests, n)}`,
  );
  figures.add("join: watch bytes per join, one watcher", n, tally.bytes / n, {
    format: bytes,
    ...perNode,
  });
  const sharedEvents = tally.byName.get(String(shared)) ?? { bytes: 0, events: 0 };
  figures.add("join: watch bytes per join, shared identity's events", n, sharedEvents.bytes / n, {
    format: bytes,
    ...perNode,
  });
  figures.add("join: watch bytes, one watcher, all joins", n, tally.bytes, {
    format: bytes,
    ...perNode,
  });
  figures.note(
    "join: watch bytes, one watcher, all joins",
    "every node's watch gets as much: the cluster's watch traffic is n times this" +
      (tally.reopened ? `; at ${n} the server ended the watch ${tally.reopened}×` : "") +
      (tally.expired ? `, ${tally.expired}× expired (a lower bound)` : ""),
  );
  const size = await served();
  figures.add("join: shared identity's size, all n holders", n, size, {
    format: bytes,
    ...perNode,
    limit: { value: ANNOTATION_LIMIT, what: "256 KiB of annotations" },
  });
  progress(`join at ${n}: all hold in ${ms(Math.max(...times))}, object ${bytes(size)}`);
  // Steady state: every node holds its keys and does nothing else.
  const quiet = await w.probe.requests();
  await sleep(o.windowS * 1000);
  const steady = requestDelta(quiet, await w.probe.requests());
  figures.add("steady: API requests per second", n, totalRequests(steady) / o.windowS, {
    format: perSecond,
    ...perNode,
  });
  figures.note(
    "steady: API requests per second",
    `over ${o.windowS} s; at ${n}: ${topRequests(steady, o.windowS)} per s`,
  );
}

/** The nodes below `below` race for `k8s:app=<tag>`: their answers, identities made, p99. */
async function race(
  w: World,
  group: string,
  workers: readonly ScaleWorker[],
  tag: string,
  below: number,
) {
  const key = `k8s:app=${tag};`;
  const answers = await allAnswers(workers, { cmd: "race", at: soon(), key, below });
  return {
    answers,
    created: await identitiesOf(w, identitiesPath(group), tag),
    p99: quantile(answers.filter((a) => !a.failed).map((a) => a.ms), 0.99),
  };
}

/** The race scenario at `n` nodes: every node races. */
async function raceAt(
  w: World,
  n: number,
  group: string,
  workers: readonly ScaleWorker[],
  figures: Figures,
): Promise<void> {
  const { answers, created, p99 } = await race(w, group, workers, `race-${n}`, n);
  figures.add("race: identities created (want 1)", n, created, { format: count });
  figures.add("race: p99 time to an answer", n, p99, { format: ms, ...perNode });
  figures.note(
    "race: identities created (want 1)",
    `answers naming one ID: ${new Set(answers.map((a) => a.id)).size === 1 ? "yes" : "NO"}`,
  );
  figures.add("race: allocations tried again after a failure", n, retriesOf(answers), {
    format: count,
  });
  figures.add("race: nodes without an answer after 5 tries", n, failuresOf(answers), {
    format: count,
  });
  progress(`race at ${n}: ${created} identities, p99 ${ms(p99)}`);
}

/** `m` Cilium v1.16 CRD-mode nodes race one label set: identities made, p99. */
async function ciliumRace(w: World, node: CiliumCrdNode, m: number) {
  const tag = `cilium-race-${m}`;
  const labels = join(w.dir, `${tag}.json`);
  await writeFile(labels, JSON.stringify([[`k8s:app=${tag}`]]));
  // Each process connects and lists first; the start leaves them time to (a late one starts at
  // once, and its time counts from the start all the same).
  const at = Date.now() + 5_000 + 500 * m;
  const runs = await Promise.all(Array.from({ length: m }, (_, i) =>
    runCilium(node, [
      ...["-kubeconfig", w.kubeconfig, "-node", `${tag}-${i}`, "-labels", labels],
      ...["-start-at", String(at)],
    ])));
  const lines = runs.map((r) => r[0]);
  const late = lines.filter((l) => (l.t_start_ms ?? 0) > at + 50).length;
  return {
    created: await identitiesOf(w, identitiesPath("cilium.io"), tag),
    p99: quantile(lines.map((l) => (l.t_end_ms ?? NaN) - at), 0.99),
    late,
  };
}

/** The join and race scenarios at every node count. */
async function nodeScenarios(w: World, o: ScaleOptions, figures: Figures): Promise<void> {
  let besideDone = false;
  for (const n of o.nodes) {
    const { group } = await w.cluster.installIdentityCrd();
    const { workers, openMs } = await openNodes(w, o, n, group);
    try {
      figures.add("open: every node's session open and synced", n, openMs, {
        format: ms,
        ...perNode,
      });
      progress(`${n} nodes open in ${ms(openMs)}`);
      if (o.scenarios.includes("join")) await joinAt(w, o, n, group, workers, figures);
      if (o.scenarios.includes("race")) {
        await raceAt(w, n, group, workers, figures);
        if (!besideDone && n >= o.ciliumNodes) {
          besideDone = true;
          await raceBeside(w, o, group, workers, figures);
        }
      }
      const uncaught = workers.reduce((s, x) => s + x.uncaught, 0);
      figures.add("errors nothing caught in the nodes' processes (library)", n, uncaught, {
        format: count,
      });
    } finally {
      await Promise.all(workers.map((x) => x[Symbol.asyncDispose]()));
    }
    printSize(o, figures, n, "nodes");
  }
}

async function raceBeside(
  w: World,
  o: ScaleOptions,
  group: string,
  workers: readonly ScaleWorker[],
  figures: Figures,
): Promise<void> {
  const m = o.ciliumNodes;
  const name = `race beside Cilium v1.16 CRD mode, ${m} nodes each`;
  const ours = await race(w, group, workers, `beside-${m}`, m);
  if (!w.cilium) {
    figures.note(
      name,
      `idalloc ${ours.created} identities, p99 ${ms(ours.p99)} | Cilium: not built`,
    );
    return;
  }
  const theirs = await ciliumRace(w, w.cilium, m);
  figures.note(
    name,
    `identities created: idalloc ${ours.created}, Cilium ${theirs.created} | p99 time to an ` +
      `answer: idalloc ${ms(ours.p99)}, Cilium ${ms(theirs.p99)}` +
      (theirs.late ? ` (${theirs.late} Cilium nodes started late)` : ""),
  );
  progress(`beside Cilium: idalloc ${ours.created}, Cilium ${theirs.created} identities`);
}

/** Creates `objects` through the admin client, `FILL_WIDTH` at a time. */
async function createAll(
  w: World,
  resource: Parameters<KubeClient["create"]>[0],
  objects: readonly KubeObject[],
): Promise<void> {
  let next = 0;
  await Promise.all(Array.from({ length: FILL_WIDTH }, async () => {
    while (next < objects.length) await w.client.create(resource, objects[next++]);
  }));
}

/** Cilium's identity `id` as its agents create it (name = ID, labels = the set). */
function gcIdentity(id: number): KubeObject {
  return {
    apiVersion: "cilium.io/v2",
    kind: "CiliumIdentity",
    metadata: { name: String(id), labels: { app: `gc-${id}` } },
    "security-labels": { "k8s:app": `gc-${id}` },
  };
}

/** Cilium's `CiliumEndpoint`s: namespaced, beside its identities. */
const ENDPOINTS = {
  ...identityResource("cilium.io"),
  plural: "ciliumendpoints",
  namespaced: true,
  kind: "CiliumEndpoint",
};

/** A `CiliumEndpoint` naming identity `id`, as Cilium's agent writes its status. */
function gcEndpoint(id: number): KubeObject {
  return {
    apiVersion: "cilium.io/v2",
    kind: "CiliumEndpoint",
    metadata: { name: `gc-ep-${id}`, namespace: "default" },
    status: { id, identity: { id, labels: [`k8s:app=gc-${id}`] } },
  };
}

/**
 * idalloc's GC on the filled store: three passes — mark, delete, then one with nothing to collect
 * (endpoints read from the informers the first pass started) — each timed and counted.
 */
async function oursGc(w: World) {
  await using backend = await K8sBackend.connect({
    node: "gc-idalloc",
    kubeconfig: w.kubeconfig,
    context: "test",
    gcGraceMs: 0,
  });
  // No rate limit: the pass itself is measured (Cilium's rule below has none either).
  await using alloc = await Allocator.open(backend, {
    min: 256,
    max: 65535,
    gcGraceMs: 0,
    gcRateLimit: { burst: 1_000_000_000 },
  });
  await alloc.waitForInitialSync();
  const passes: { ms: number; requests: RequestCounts; marked: number; deleted: number }[] = [];
  for (let i = 0; i < 3; i++) {
    const before = await w.probe.requests();
    const t = performance.now();
    const stats = await alloc.runGc();
    const took = performance.now() - t;
    passes.push({
      ms: took,
      requests: requestDelta(before, await w.probe.requests()),
      marked: stats.marked,
      deleted: stats.deleted,
    });
  }
  return passes;
}

/** The GC scenario at `c` identities, half named by endpoints. */
async function gcAt(w: World, c: number, figures: Figures): Promise<void> {
  const identities = identityResource("cilium.io");
  // Only this scenario's identities: the Cilium race's stay in `cilium.io` otherwise.
  await w.probe.deleteAll(identitiesPath("cilium.io"));
  const used = Math.floor(c / 2);
  const ids = Array.from({ length: c }, (_, i) => GC_FIRST_ID + i);
  await createAll(w, identities, ids.map(gcIdentity));
  await createAll(w, ENDPOINTS, ids.slice(0, used).map(gcEndpoint));
  const ours = await oursGc(w);
  const ourMs = ours[0].ms + ours[1].ms;
  const ourRequests = totalRequests(ours[0].requests) + totalRequests(ours[1].requests);
  figures.add("gc: idalloc, mark pass + delete pass", c, ourMs, { format: ms, ...perIdentity });
  figures.add("gc: idalloc, API requests (both passes)", c, ourRequests, {
    format: count,
    ...perIdentity,
  });
  figures.note(
    "gc: idalloc, mark pass + delete pass",
    `at ${c}: marked ${ours[0].marked} (${ms(ours[0].ms)}), deleted ${ours[1].deleted} ` +
      `(${ms(ours[1].ms)}); ${topRequests(ours[0].requests)} | ${topRequests(ours[1].requests)}`,
  );
  const later = ours[2];
  figures.add("gc: idalloc, a later pass (nothing to collect)", c, later.ms, {
    format: ms,
    ...perIdentity,
  });
  figures.add("gc: idalloc, API requests of that pass", c, totalRequests(later.requests), {
    format: count,
    ...perIdentity,
  });
  figures.note(
    "gc: idalloc, API requests of that pass",
    `at ${c}: ${topRequests(later.requests, 1, 6)}`,
  );
  progress(`gc at ${c}: idalloc ${ms(ourMs)}, deleted ${ours[1].deleted}; later ${ms(later.ms)}`);
  if (w.cilium) {
    // The same store again: the unused half back (the endpoints and the used half stayed).
    const gone = new Set(
      (JSON.parse(await w.probe.text(identitiesPath("cilium.io"))) as {
        items: { metadata: { name: string } }[];
      }).items.map((o) => Number(o.metadata.name)),
    );
    await createAll(w, identities, ids.filter((id) => !gone.has(id)).map(gcIdentity));
    const before = await w.probe.requests();
    const t = performance.now();
    const [line] = await runCilium(w.cilium, [
      // Three rounds: the first only sees the identities (the rule's clock starts at a change
      // seen), the second marks, the third deletes — as the operator does a timeout apart.
      ...["-kubeconfig", w.kubeconfig, "-node", "gc-cilium", "-gc", "3"],
      ...["-gc-interval", "1ms", "-heartbeat-timeout", "1ns"],
    ]);
    // The process's time less its start and connect: the two rounds.
    const theirMs = performance.now() - t - Number(line.connect_ms ?? 0);
    const requests = requestDelta(before, await w.probe.requests());
    figures.add("gc: Cilium operator rule, 3 rounds (see, mark, delete)", c, theirMs, {
      format: ms,
      ...perIdentity,
    });
    figures.add("gc: Cilium operator rule, API requests", c, totalRequests(requests), {
      format: count,
      ...perIdentity,
    });
    const rounds = line.gc ?? [];
    const sum = (field: "marked" | "deleted") => rounds.reduce((s, r) => s + r[field], 0);
    figures.note(
      "gc: Cilium operator rule, 3 rounds (see, mark, delete)",
      `at ${c}: marked ${sum("marked")}, deleted ${sum("deleted")}; ${topRequests(requests)}`,
    );
    progress(`gc at ${c}: Cilium ${ms(theirMs)}, deleted ${sum("deleted")}`);
  }
  await w.probe.deleteAll(identitiesPath("cilium.io"));
  await w.probe.deleteAll("/apis/cilium.io/v2/namespaces/default/ciliumendpoints");
}

/** Why the bench cannot run here, or `undefined`. */
function unavailable(): string | undefined {
  return findKubeApiserver() === undefined
    ? "kube-apiserver is not built ($KUBE_APISERVER, or bash .ci/kube-apiserver.sh)"
    : undefined;
}

/**
 * The API server, with Cilium's own CRDs where its node is built (else the harness's copies):
 * given more time to start than the tests give it, as the machine is often loaded.
 */
async function startServer(cilium: CiliumCrdNode | undefined): Promise<KubeTestCluster> {
  const cluster = await startKubeApiServer({
    ciliumCrds: cilium === undefined,
    attempts: 2,
    readyTimeoutMs: 180_000,
  });
  try {
    for (const crd of cilium ? await ciliumCrds(cilium) : []) await cluster.installCrd(crd);
  } catch (err) {
    await cluster.close();
    throw err;
  }
  return cluster;
}

/** The `k8s-scale` group's rows (see the module doc); `options` from `parseScaleArgs`. */
export async function benchK8sScale(o: ScaleOptions): Promise<BenchRow[]> {
  const why = unavailable();
  if (why) return [{ name: "k8s-scale", value: `skipped: ${why}` }];
  const built = ciliumCrdNode();
  const cilium = "bin" in built ? built : undefined;
  await using cluster = await startServer(cilium);
  using probe = await ApiProbe.of(cluster);
  await using client = await cluster.client("admin");
  const w: World = {
    cluster,
    kubeconfig: await cluster.kubeconfig("admin", { context: "test", namespace: "default" }),
    probe,
    client,
    cilium,
    dir: cluster.dir,
  };
  const nodes = new Figures();
  const gc = new Figures();
  if (o.scenarios.includes("join") || o.scenarios.includes("race")) {
    await nodeScenarios(w, o, nodes);
  }
  if (o.scenarios.includes("gc")) {
    for (const c of o.gcIdentities) {
      await gcAt(w, c, gc);
      printSize(o, gc, c, "identities");
    }
  }
  const setup = {
    name: "k8s-scale setup",
    value: `one kube-apiserver + etcd on this machine; ${o.workers} worker processes; ` +
      `nodes: ${o.nodes.join(", ")}; Cilium v1.16 node: ${cilium ? "built" : "not built here"}; ` +
      `predictions: power law fitted in log–log space`,
  };
  if (o.markdown) {
    // A scenario not run has no table (an empty one would print its header alone).
    for (const f of [nodes, gc]) {
      if (f.all().length > 0) console.error(`\n${scaleMarkdown(f.all())}\n`);
    }
  }
  return [...scaleRows(nodes.all()), ...scaleRows(gc.all()), setup];
}
