/**
 * The Kubernetes side of a nemesis run beside Cilium nodes in CRD mode (`--cilium N` on `k8s`):
 *
 * - **The store's record** ({@linkcode recordK8sChanges}): four list-and-watch loops — the
 *   identities (each a master), the nodes' reference objects (each entry `<id>=<epoch>` of their
 *   `idalloc.io/held` a reference on the lease named by its epoch, as are the earlier layouts'
 *   `held.idalloc.io/<id>` there and `ref.idalloc.io/<node>` on an identity), the run's `CiliumEndpoint`s (each a Cilium node's reference,
 *   lease `cep`), and the node Leases (epoch and expiry) — written as `store_changes.ts` records as
 *   they arrive, each watch in the store's order (resource versions are etcd revisions, one order
 *   for all four; the attribution sorts by them). A deleted
 *   identity is also recorded with its last state (`deleted`: its references and mark), which
 *   the nemesis judges against the Leases and endpoints at that revision. A watch that ends is
 *   resumed; one that expires (`410`) or fails re-lists, records a `gap`, and infers what vanished
 *   meanwhile from the difference. Each change carries `early`, the instant its own watch last
 *   delivered before it (after a failure: the instant that watch was last current), since the
 *   four watches deliver with delays of their own: a lower revision may arrive seconds after a
 *   higher one of another watch, and a re-list brings what happened while its watch was blind.
 * - **The endpoints** ({@linkcode EndpointWriter}): the `CiliumEndpoint` a real agent writes for a
 *   pod using an identity, one per Cilium node and key (`status.identity.id`), written and deleted
 *   in the background in the order asked, retried through API-server outages.
 *
 * @module
 */
import { sleep } from "../../../abort.ts";
import type { StoreChange } from "../../../testing/store_changes.ts";
import type { KubeClient, KubeObject, KubeResourceDescriptor } from "../client.ts";
import { isStatus } from "../kube.ts";
import {
  NODE_SELECTOR,
  nodeLeaseName,
  readIdentity,
  readNodeLease,
  readNodeRefs,
  REFS_SELECTOR,
  refsName,
} from "../layout.ts";
import { LEASES } from "../options.ts";
import { listAll } from "../paging.ts";

/** The label of a nemesis endpoint naming the Cilium node it stands for. */
export const ENDPOINT_NODE_LABEL = "nemesis.idalloc.io/node";
/** The annotation of a nemesis endpoint naming the key its pod uses. */
export const ENDPOINT_KEY_ANNOTATION = "nemesis.idalloc.io/key";
/** The lease name endpoint references carry in the record. */
export const ENDPOINT_LEASE = "cep";

/** The `CiliumEndpoint` resource beside `identities`. */
export function endpointResource(identities: KubeResourceDescriptor): KubeResourceDescriptor {
  return { ...identities, plural: "ciliumendpoints", namespaced: true, kind: "CiliumEndpoint" };
}

/** The endpoint of node `node`'s use of `key`: a DNS name, stable per pair. */
export function endpointName(node: string, key: string): string {
  let h = 0x811c9dc5;
  for (let i = 0; i < key.length; i++) {
    h ^= key.charCodeAt(i);
    h = Math.imul(h, 0x01000193) >>> 0;
  }
  return `${node.toLowerCase().replace(/[^a-z0-9-]/g, "-")}-${h.toString(16).padStart(8, "0")}`;
}

/** What {@linkcode recordK8sChanges} watches. */
export interface RecordTarget {
  /** An admin client of the run's API server. */
  readonly client: KubeClient;
  /** The identity resource. */
  readonly identities: KubeResourceDescriptor;
  /** The namespace of the node Leases and of the endpoints. */
  readonly namespace: string;
}

function rev(obj: KubeObject): number {
  return Number(obj.metadata?.resourceVersion ?? NaN);
}

/** One watched resource: how an object's state is keyed and what it records. */
export interface Kind {
  readonly res: KubeResourceDescriptor;
  readonly namespace?: string;
  readonly labelSelector?: string;
  /** The changes from `before` to `after` (either absent: created, deleted) at `rev`, `at`. */
  diff(
    before: KubeObject | undefined,
    after: KubeObject | undefined,
    rev: number,
    at: number,
    inferred: boolean,
  ): StoreChange[];
}

/**
 * The identities' kind. The record has one reference per key and node (`StoreHistory` keeps one
 * span per pair, as etcd's layout has one reference key per node and key), but here a node may
 * reference two identities of a key for a moment: an idalloc node whose create raced a Cilium
 * agent's joins the older identity, then removes its reference from its own duplicate. Recorded
 * per identity, that removal read as the node letting go of the key while it still held the older
 * one (seed 1 of the first mixed runs: `k8s:app=k71;` judged "unreferenced" for 6.6 s and charged
 * to idalloc). So the pair's reference is recorded as the most recently added identity it names,
 * and a removal is recorded only when no identity of the key carries the node's reference any more
 * (or as a move to the one it still carries).
 */
function pairBook() {
  /** Per `key \0 node`: the IDs its references name now (ID → epoch), oldest addition first. */
  const held = new Map<string, Map<number, string>>();
  /** Per `key \0 node`: what the record says now (`id epoch`), to skip a change that is none. */
  const recorded = new Map<string, string>();
  const pairRef = (r: number, at: number, key: string, node: string): StoreChange[] => {
    const pair = `${key}\u0000${node}`;
    const ids = held.get(pair);
    const current = ids === undefined ? undefined : [...ids].at(-1);
    const now = current === undefined ? "" : `${current[0]} ${current[1]}`;
    if ((recorded.get(pair) ?? "") === now) return [];
    if (now === "") recorded.delete(pair);
    else recorded.set(pair, now);
    return [
      current === undefined
        ? { t: "ref", rev: r, at, key, node, id: null }
        : { t: "ref", rev: r, at, key, node, id: current[0], lease: current[1] },
    ];
  };
  const drop = (key: string, node: string, id: number) => {
    const pair = `${key}\u0000${node}`;
    const ids = held.get(pair);
    ids?.delete(id);
    if (ids?.size === 0) held.delete(pair);
  };
  const add = (key: string, node: string, id: number, epoch: string) => {
    const pair = `${key}\u0000${node}`;
    const ids = held.get(pair) ?? new Map<number, string>();
    ids.delete(id); // a new epoch is a new addition
    ids.set(id, epoch);
    held.set(pair, ids);
  };
  return { pairRef, drop, add };
}

/**
 * What the two kinds that carry idalloc's references share: the references of the nodes'
 * reference objects by identity (ID → node → epoch) and the key each stored identity has, so that
 * a reference is recorded under its key whichever of the two watches shows it first.
 */
interface RefsView {
  readonly book: ReturnType<typeof pairBook>;
  readonly byId: Map<number, Map<string, string>>;
  readonly keys: Map<number, string>;
}

/** An identity's references: its annotations (the older layout) and the objects naming it. */
function refsOf(view: RefsView, record: { id: number; refs: ReadonlyMap<string, string> }) {
  return new Map([...record.refs, ...view.byId.get(record.id) ?? []]);
}

function identityKind(res: KubeResourceDescriptor, view: RefsView): Kind {
  const { pairRef, drop, add } = view.book;
  return {
    res,
    diff(before, after, r, at, inferred) {
      const b = before ? readIdentity(before) : undefined;
      const a = after ? readIdentity(after) : undefined;
      const was = b?.ok ? b.record : undefined;
      const now = a?.ok ? a.record : undefined;
      const out: StoreChange[] = [];
      if (was && (!now || now.key !== was.key)) {
        view.keys.delete(was.id);
        const wasRefs = refsOf(view, was);
        out.push({ t: "master", rev: r, at, id: was.id, key: null });
        for (const node of wasRefs.keys()) {
          drop(was.key, node, was.id);
          out.push(...pairRef(r, at, was.key, node));
        }
        if (!now) {
          out.push({
            t: "deleted",
            rev: r,
            at,
            id: was.id,
            key: was.key,
            refs: Object.fromEntries(wasRefs),
            marked: was.mark !== undefined,
            ...(inferred ? { inferred } : {}),
          });
        }
      }
      if (!now) return out;
      view.keys.set(now.id, now.key);
      const fresh = !was || now.key !== was.key;
      if (fresh) {
        out.push({
          t: "master",
          rev: r,
          at,
          id: now.id,
          key: now.key,
          ...(now.created > 0 ? { created: now.created } : {}),
        });
      }
      // A new identity takes the references its nodes' objects already name (written beside
      // the create); later, its own events change only its annotations.
      const old = fresh ? new Map<string, string>() : was!.refs;
      for (const [node, epoch] of fresh ? refsOf(view, now) : now.refs) {
        if (old.get(node) !== epoch) {
          add(now.key, node, now.id, epoch);
          out.push(...pairRef(r, at, now.key, node));
        }
      }
      for (const node of old.keys()) {
        if (now.refs.has(node)) continue;
        drop(now.key, node, now.id);
        out.push(...pairRef(r, at, now.key, node));
      }
      return out;
    },
  };
}

/** A nemesis endpoint's node, key and ID (`undefined` for endpoints of no Cilium node). */
function readEndpoint(obj: KubeObject): { node: string; key: string; id?: number } | undefined {
  const node = obj.metadata?.labels?.[ENDPOINT_NODE_LABEL];
  const key = obj.metadata?.annotations?.[ENDPOINT_KEY_ANNOTATION];
  if (node === undefined || key === undefined) return undefined;
  const id = (obj.status as { identity?: { id?: unknown } } | undefined)?.identity?.id;
  return { node, key, id: typeof id === "number" ? id : undefined };
}

function endpointKind(res: KubeResourceDescriptor, namespace: string): Kind {
  return {
    res,
    namespace,
    diff(before, after, r, at) {
      const b = before ? readEndpoint(before) : undefined;
      const a = after ? readEndpoint(after) : undefined;
      const out: StoreChange[] = [];
      if (b?.id !== undefined && (a?.id !== b.id || a.key !== b.key)) {
        out.push({ t: "ref", rev: r, at, key: b.key, node: b.node, id: null });
      }
      if (a?.id !== undefined && (b?.id !== a.id || b.key !== a.key)) {
        out.push({
          t: "ref",
          rev: r,
          at,
          key: a.key,
          node: a.node,
          id: a.id,
          lease: ENDPOINT_LEASE,
        });
      }
      return out;
    },
  };
}

/**
 * The nodes' reference objects (`idalloc-refs-<node>`, one per node, written only by it): each
 * ID added or removed is a reference of that node to the identity's key, recorded once the
 * identity is known (else when it appears, by {@linkcode identityKind}).
 */
function refsKind(namespace: string, view: RefsView): Kind {
  const { pairRef, drop, add } = view.book;
  const read = (obj: KubeObject | undefined) => {
    const r = obj ? readNodeRefs(obj) : undefined;
    // An object named for another node does not speak for its holder (as the judges read it).
    return r !== undefined && r.name === refsName(r.node) ? r : undefined;
  };
  return {
    res: LEASES,
    namespace,
    labelSelector: REFS_SELECTOR,
    diff(before, after, r, at) {
      const b = read(before);
      const a = read(after);
      const node = a?.node ?? b?.node;
      if (node === undefined) return [];
      const out: StoreChange[] = [];
      for (const [id, epoch] of a?.refs ?? []) {
        if (b?.refs.get(id) === epoch) continue;
        let nodes = view.byId.get(id);
        if (nodes === undefined) view.byId.set(id, nodes = new Map());
        nodes.set(node, epoch);
        const key = view.keys.get(id);
        if (key === undefined) continue;
        add(key, node, id, epoch);
        out.push(...pairRef(r, at, key, node));
      }
      for (const id of b?.refs.keys() ?? []) {
        if (a?.refs.has(id)) continue;
        const nodes = view.byId.get(id);
        nodes?.delete(node);
        if (nodes?.size === 0) view.byId.delete(id);
        const key = view.keys.get(id);
        if (key === undefined) continue;
        drop(key, node, id);
        out.push(...pairRef(r, at, key, node));
      }
      return out;
    },
  };
}

/**
 * The node Leases (`idalloc-node-<node>`): a node's epoch and expiry. A Lease named for another
 * node than its holder is none of the holder's (the `forged-lease` garbage: a live node's Lease
 * copied under another name for an hour), as the judges read it (`liveness.ts`): recorded as the
 * holder's, it overwrote the node's real Lease in the record with an expiry an hour away (seeds 5
 * and 7 of the mixed Kubernetes runs: w0's and w3's, until their next renewal), so a reference of
 * the node, dead meanwhile, would have been judged live at a deletion.
 */
export function leaseKind(namespace: string): Kind {
  const read = (obj: KubeObject | undefined) => {
    const lease = obj ? readNodeLease(obj) : undefined;
    return lease !== undefined && lease.name === nodeLeaseName(lease.node) ? lease : undefined;
  };
  return {
    res: LEASES,
    namespace,
    labelSelector: NODE_SELECTOR,
    diff(before, after, r, at) {
      const b = read(before);
      const a = read(after);
      const node = a?.node ?? b?.node;
      if (node === undefined) return [];
      if (a && b && a.epoch === b.epoch && a.expiresAt === b.expiresAt) return [];
      return [{
        t: "lease",
        rev: r,
        at,
        node,
        epoch: a?.epoch ?? null,
        expiresAt: a?.expiresAt ?? null,
      }];
    },
  };
}

/**
 * One watch's place in the record. The record merges four watches, each with its own delay: what
 * a watch delivers happened after its own previous batch arrived — or, after a failure, after the
 * instant it was last current (`blindSince`), however late the re-list brings it.
 */
class FollowState {
  readonly known = new Map<string, KubeObject>();
  version: string | undefined;
  batchAt: number | undefined;
  previousBatchAt: number | undefined;
  blindSince: number | undefined;

  /** A batch (events with one arrival time) arrived at `at`. */
  arrived(at: number): void {
    if (at !== this.batchAt) {
      this.previousBatchAt = this.batchAt;
      this.batchAt = at;
    }
  }
}

/** What one list-and-watch loop works with. */
interface FollowRun {
  readonly client: KubeClient;
  readonly kind: Kind;
  readonly state: FollowState;
  readonly record: (change: StoreChange) => void;
  readonly signal: AbortSignal;
}

/** `c` with the earliest instant it can have happened (`early`), where it has one. */
function marked(c: StoreChange, early: number | undefined): StoreChange {
  return c.t === "gap" || c.t === "lock" || early === undefined
    ? c
    : { ...c, early: Math.min(early, c.at) };
}

function objectKey(o: KubeObject): string {
  return `${o.metadata?.namespace ?? ""}/${o.metadata?.name ?? ""}`;
}

/** Lists `kind` in full and records what changed since the watch's last known state. */
async function relist(
  { client, kind, state, record, signal }: FollowRun,
): Promise<void> {
  const list = await listAll(client, kind.res, {
    namespace: kind.namespace,
    labelSelector: kind.labelSelector,
    signal: AbortSignal.any([signal, AbortSignal.timeout(30_000)]),
  });
  const at = Date.now();
  const early = state.blindSince ?? state.batchAt;
  const r = Number(list.resourceVersion);
  const seen = new Set<string>();
  for (const obj of list.items) {
    seen.add(objectKey(obj));
    const before = state.known.get(objectKey(obj));
    if (before?.metadata?.resourceVersion === obj.metadata?.resourceVersion) continue;
    for (const c of kind.diff(before, obj, rev(obj), at, false)) record(marked(c, early));
    state.known.set(objectKey(obj), obj);
  }
  for (const [n, before] of state.known) {
    if (seen.has(n)) continue;
    // Gone while the record was blind: deleted at some revision up to the list's.
    for (const c of kind.diff(before, undefined, r, at, true)) record(marked(c, early));
    state.known.delete(n);
  }
  state.version = list.resourceVersion;
  state.blindSince = undefined;
  state.batchAt = state.previousBatchAt = at;
}

/** Watches `kind` from the state's version and records each event, until the watch ends. */
async function watchEvents(
  { client, kind, state, record, signal }: FollowRun,
): Promise<void> {
  for await (
    const ev of client.watch(kind.res, {
      namespace: kind.namespace,
      labelSelector: kind.labelSelector,
      resourceVersion: state.version!,
      timeoutSeconds: 60,
      signal,
    })
  ) {
    const obj = ev.object;
    state.version = obj.metadata?.resourceVersion ?? state.version;
    const at = Date.now();
    state.arrived(at);
    if (ev.type === "BOOKMARK") continue;
    const early = state.previousBatchAt;
    if (ev.type === "DELETED") {
      // The event carries the object's last state, at the deletion's revision.
      for (const c of kind.diff(obj, undefined, rev(obj), at, false)) record(marked(c, early));
      state.known.delete(objectKey(obj));
    } else {
      for (const c of kind.diff(state.known.get(objectKey(obj)), obj, rev(obj), at, false)) {
        record(marked(c, early));
      }
      state.known.set(objectKey(obj), obj);
    }
  }
}

/** One list-and-watch loop of `kind`, until `signal`; its first list resolves `listed`. */
async function follow(
  client: KubeClient,
  kind: Kind,
  record: (change: StoreChange) => void,
  signal: AbortSignal,
  listed: () => void,
): Promise<void> {
  const state = new FollowState();
  const run: FollowRun = { client, kind, state, record, signal };
  let first = true;
  while (!signal.aborted) {
    try {
      if (state.version === undefined) {
        await relist(run);
        if (first) listed();
        first = false;
      }
      await watchEvents(run);
    } catch (err) {
      if (signal.aborted) break;
      const at = Date.now();
      state.blindSince ??= state.batchAt ?? at;
      record({
        t: "gap",
        at,
        why: `${kind.res.plural}: ${isStatus(err, 410) ? "410 " : ""}${String(err).slice(0, 200)}`,
        since: state.blindSince,
      });
      state.version = undefined;
      await sleep(300, signal).catch(() => {});
    }
  }
}

/**
 * Records every change of the identities, the endpoints in `namespace` and the node Leases (see
 * the module doc); resolves once each has been listed, disposing stops it.
 */
export async function recordK8sChanges(
  { client, identities, namespace }: RecordTarget,
  record: (change: StoreChange) => void,
): Promise<AsyncDisposable> {
  const stop = new AbortController();
  const view: RefsView = { book: pairBook(), byId: new Map(), keys: new Map() };
  const kinds = [
    identityKind(identities, view),
    refsKind(namespace, view),
    endpointKind(endpointResource(identities), namespace),
    leaseKind(namespace),
  ];
  const listed = kinds.map(() => Promise.withResolvers<void>());
  const loops = kinds.map((k, i) =>
    follow(client, k, record, stop.signal, listed[i].resolve).catch(() => {})
  );
  const timer = new AbortController();
  try {
    await Promise.race([
      Promise.all(listed.map((l) => l.promise)),
      sleep(60_000, timer.signal).then(() => {
        throw new Error("the store's record did not list everything within 60 s");
      }),
    ]);
  } catch (err) {
    stop.abort();
    await Promise.all(loops);
    throw err;
  } finally {
    timer.abort();
  }
  return {
    async [Symbol.asyncDispose]() {
      stop.abort();
      await Promise.all(loops);
    },
  };
}

/** One endpoint's pending work: the last state asked (`undefined`: deleted). */
interface Pending {
  node: string;
  key: string;
  id: number | undefined;
}

/**
 * Writes the nemesis's `CiliumEndpoint`s in the background (see the module doc): per endpoint,
 * only the last state asked is written, one write at a time, retried every 300 ms until it
 * lands or the writer closes.
 */
export class EndpointWriter implements AsyncDisposable {
  readonly #client: KubeClient;
  readonly #res: KubeResourceDescriptor;
  readonly #namespace: string;
  readonly #pending = new Map<string, Pending>();
  readonly #running = new Map<string, Promise<void>>();
  readonly #closing = new AbortController();
  /** Writes that landed. */
  written = 0;
  /** Failed attempts (each retried). */
  failures = 0;

  /** Writes the endpoints of `identities`' group in `namespace` through `client`. */
  constructor(client: KubeClient, identities: KubeResourceDescriptor, namespace: string) {
    this.#client = client;
    this.#res = endpointResource(identities);
    this.#namespace = namespace;
  }

  /** Asks for node `node`'s endpoint of `key` to name `id` (`undefined`: to be gone). */
  set(node: string, key: string, id: number | undefined): void {
    if (this.#closing.signal.aborted) return;
    const name = endpointName(node, key);
    this.#pending.set(name, { node, key, id });
    if (!this.#running.has(name)) {
      const run = this.#drain(name).finally(() => this.#running.delete(name));
      this.#running.set(name, run);
    }
  }

  async #drain(name: string): Promise<void> {
    for (;;) {
      const want = this.#pending.get(name);
      if (!want || this.#closing.signal.aborted) return;
      this.#pending.delete(name);
      for (;;) {
        if (this.#closing.signal.aborted) return;
        // A newer state asked meanwhile replaces this one.
        if (this.#pending.has(name)) break;
        try {
          await this.#write(name, want);
          this.written++;
          break;
        } catch {
          this.failures++;
          await sleep(300, this.#closing.signal).catch(() => {});
        }
      }
    }
  }

  async #write(name: string, want: Pending): Promise<void> {
    const scope = { namespace: this.#namespace, signal: AbortSignal.timeout(5_000) };
    if (want.id === undefined) {
      await this.#client.delete(this.#res, name, scope);
      return;
    }
    const object: KubeObject = {
      apiVersion: `${this.#res.group}/${this.#res.version}`,
      kind: "CiliumEndpoint",
      metadata: {
        name,
        namespace: this.#namespace,
        // Cilium's node names (`c0`, `c1-g2`) are valid label values as they are.
        labels: { [ENDPOINT_NODE_LABEL]: want.node },
        annotations: { [ENDPOINT_KEY_ANNOTATION]: want.key },
      },
      status: { state: "ready", identity: { id: want.id } },
    };
    try {
      await this.#client.create(this.#res, object, scope);
    } catch (err) {
      if (!isStatus(err, 409)) throw err;
      const current = await this.#client.get(this.#res, name, scope);
      if (!current) throw err;
      await this.#client.update(this.#res, {
        ...object,
        metadata: { ...object.metadata, resourceVersion: current.metadata?.resourceVersion },
      }, scope);
    }
  }

  /** Resolves once every write asked so far landed, or after `timeoutMs`. */
  async flush(timeoutMs: number): Promise<void> {
    const deadline = Date.now() + timeoutMs;
    while (this.#running.size > 0 && Date.now() < deadline) {
      const timer = new AbortController();
      await Promise.race([
        Promise.all(this.#running.values()),
        sleep(200, timer.signal).catch(() => {}),
      ]);
      timer.abort();
    }
  }

  /** Stops writing (pending writes are dropped). */
  async [Symbol.asyncDispose](): Promise<void> {
    this.#closing.abort();
    await Promise.all(this.#running.values());
  }
}
