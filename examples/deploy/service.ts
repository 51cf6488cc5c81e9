/**
 * The identity service behind the Deploy example: one {@linkcode IdentityService} per isolate.
 *
 * What is a node on Deno Deploy? Isolates start and stop on their own, several run at once (one
 * or more per region), and any of them can be evicted without warning. So every isolate is a
 * node of its own (`deploy-<region>-<deployment>-<random>`) with a short lease (15 s by default,
 * renewed every 5 s while it lives): an evicted isolate's references lapse within seconds.
 *
 * The service, not an isolate, owns the identities it hands out. `POST` writes a durable claim
 * (`[...prefix, "claims", <labels>]`) next to allocating; every isolate reconciles the claims
 * when it starts and then every `reconcileMs`: it takes a reference to every claimed identity
 * and releases those no longer claimed. As long as one isolate runs, every claimed identity is
 * referenced; when none runs, nothing runs GC either, and the next isolate re-creates the
 * references before its first GC pass. `DELETE` removes the claim; the identity is collected
 * once every isolate has released it (two GC passes later).
 *
 * @module
 */
import { z } from "zod";
import { DenoKvBackend } from "@idalloc/idalloc";
import {
  type Identity,
  IdentityAllocator,
  type IdentityChange,
  Labels,
  requiresGlobalIdentity,
} from "@idalloc/idalloc/identity";

/** Options of {@linkcode IdentityService.open}. */
export interface IdentityServiceOptions {
  /** This isolate's node name (unique per isolate). */
  readonly node: string;
  /** Namespace in the KV store. @default {["deploy"]} */
  readonly prefix?: readonly string[];
  /** This cluster's ID. @default {0} */
  readonly clusterId?: number;
  /** This cluster's name. @default {"default"} */
  readonly clusterName?: string;
  /** The isolate's lease; short, because isolates vanish without notice. @default {15000} */
  readonly leaseTtlMs?: number;
  /** How often the claims are reconciled. @default {10000} */
  readonly reconcileMs?: number;
  /** GC pass interval; `0` turns GC off in this isolate. @default {60000} */
  readonly gcIntervalMs?: number;
  /** Deno KV change poll interval (other isolates' writes reach the cache through it). @default {1000} */
  readonly pollIntervalMs?: number;
  /** Largest clock difference between isolates. @default {2000} */
  readonly maxClockSkewMs?: number;
}

/** The result of {@linkcode IdentityService.create}. */
export interface CreateResult {
  /** The identity. */
  readonly identity: Identity;
  /** Whether this call created it in the store. */
  readonly isNew: boolean;
}

/** What {@linkcode IdentityService.status} reports. */
export interface ServiceStatus {
  /** This isolate's node name. */
  readonly node: string;
  /** Claimed identities this isolate references. */
  readonly held: number;
  /** Whether the first reconcile finished. */
  readonly reconciled: boolean;
}

const claimSchema = z.object({
  id: z.number().int().positive(),
  labels: z.array(z.string()),
  createdAt: z.number(),
});
type Claim = z.infer<typeof claimSchema>;

/** A label set that only one isolate could ever know (CIDR, FQDN): not served. */
export class NodeLocalLabelsError extends Error {
  /** @param labels the label set */
  constructor(labels: Labels) {
    super(`${labels} maps to a node-local identity, which exists inside one isolate only`);
    this.name = "NodeLocalLabelsError";
  }
}

/** One isolate's view of the identity service. */
export class IdentityService implements AsyncDisposable {
  /** This isolate's node name. */
  readonly node: string;
  /** The identity allocator of this isolate. */
  readonly identities: IdentityAllocator;
  readonly #kv: Deno.Kv;
  readonly #claims: readonly string[];
  readonly #held = new Map<string, Identity>();
  readonly #locks = new Map<string, Promise<unknown>>();
  readonly #closing = new AbortController();
  readonly #background: Promise<void>;
  #reconciled = false;

  private constructor(
    kv: Deno.Kv,
    identities: IdentityAllocator,
    prefix: readonly string[],
    node: string,
    reconcileMs: number,
    gcIntervalMs: number,
  ) {
    this.#kv = kv;
    this.identities = identities;
    this.#claims = [...prefix, "claims"];
    this.node = node;
    this.#background = this.#run(reconcileMs, gcIntervalMs);
  }

  /**
   * Opens this isolate's node on `kv` and starts reconciling. The caller owns `kv` and closes it
   * after the service.
   */
  static async open(kv: Deno.Kv, options: IdentityServiceOptions): Promise<IdentityService> {
    const prefix = options.prefix ?? ["deploy"];
    const backend = new DenoKvBackend(kv, {
      prefix: [...prefix, "identities"],
      node: options.node,
      pollIntervalMs: options.pollIntervalMs ?? 1_000,
      maxClockSkewMs: options.maxClockSkewMs ?? 2_000,
    });
    const identities = await IdentityAllocator.open(backend, {
      clusterId: options.clusterId ?? 0,
      clusterName: options.clusterName ?? "default",
      leaseTtlMs: options.leaseTtlMs ?? 15_000,
    });
    return new IdentityService(
      kv,
      identities,
      prefix,
      options.node,
      options.reconcileMs ?? 10_000,
      options.gcIntervalMs ?? 60_000,
    );
  }

  async #run(reconcileMs: number, gcIntervalMs: number): Promise<void> {
    const signal = this.#closing.signal;
    let nextGc = Date.now() + gcIntervalMs;
    while (!signal.aborted) {
      try {
        await this.reconcile(signal);
        // GC only after this isolate holds every claim: a cold start after a long idle time must
        // re-reference the claimed identities before anything here may collect them.
        if (gcIntervalMs > 0 && Date.now() >= nextGc) {
          nextGc = Date.now() + gcIntervalMs;
          await this.identities.runGc({ signal });
        }
      } catch (err) {
        if (!signal.aborted) console.error(`[${this.node}] reconcile failed: ${err}`);
      }
      // An abort during the pass has fired already: waiting for it would take the whole interval.
      if (signal.aborted) break;
      await new Promise<void>((resolve) => {
        const timer = setTimeout(done, reconcileMs);
        signal.addEventListener("abort", done, { once: true });
        function done() {
          clearTimeout(timer);
          signal.removeEventListener("abort", done);
          resolve();
        }
      });
    }
  }

  /** Runs `fn` after every earlier call for `key` in this isolate (create, remove, reconcile). */
  async #exclusive<T>(key: string, fn: () => Promise<T>): Promise<T> {
    const previous = this.#locks.get(key) ?? Promise.resolve();
    const run = previous.catch(() => {}).then(fn);
    this.#locks.set(key, run);
    try {
      return await run;
    } finally {
      if (this.#locks.get(key) === run) this.#locks.delete(key);
    }
  }

  /**
   * The identity of `labels`, created if needed, claimed by the service and referenced by this
   * isolate. Reserved label sets return their fixed identity (nothing is claimed).
   */
  async create(labels: Labels, signal: AbortSignal): Promise<CreateResult> {
    const reserved = this.identities.reserved.lookupByLabels(labels);
    if (reserved) return { identity: reserved, isNew: false };
    if (!requiresGlobalIdentity(labels)) throw new NodeLocalLabelsError(labels);
    const key = labels.toKvstoreString();
    return await this.#exclusive(key, async () => {
      const held = this.#held.get(key);
      if (held) {
        await this.#claim(key, held);
        return { identity: held, isNew: false };
      }
      const { identity, isNew } = await this.identities.allocate(labels, { signal });
      this.#held.set(key, identity);
      await this.#claim(key, identity);
      return { identity, isNew };
    });
  }

  async #claim(key: string, identity: Identity): Promise<void> {
    const entry = await this.#kv.get<unknown>([...this.#claims, key]);
    const claim = claimSchema.safeParse(entry.value);
    if (claim.success && claim.data.id === identity.id) return;
    const value: Claim = {
      id: identity.id,
      labels: identity.labels.toJSON(),
      createdAt: claim.success ? claim.data.createdAt : Date.now(),
    };
    await this.#kv.set([...this.#claims, key], value);
  }

  /** The identity `id`: this isolate's cache, else the store. */
  async get(id: number, signal: AbortSignal): Promise<Identity | undefined> {
    return await this.identities.resolveById(id, { signal });
  }

  /**
   * Removes the service's claim on identity `id` and this isolate's reference; other isolates
   * release theirs at their next reconcile. Returns the identity, or `undefined` if the service
   * did not claim it.
   */
  async remove(id: number, signal: AbortSignal): Promise<Identity | undefined> {
    const identity = await this.get(id, signal);
    if (!identity || this.identities.reserved.isReserved(id)) return undefined;
    const key = identity.labels.toKvstoreString();
    return await this.#exclusive(key, async () => {
      const entry = await this.#kv.get([...this.#claims, key]);
      if (entry.versionstamp === null) return undefined;
      const res = await this.#kv.atomic().check(entry).delete(entry.key).commit();
      if (!res.ok) return undefined;
      const held = this.#held.get(key);
      if (held) {
        this.#held.delete(key);
        await this.identities.release(held, { signal });
      }
      return identity;
    });
  }

  /** The identities the service claims, as stored. */
  async list(): Promise<Identity[]> {
    const out: Identity[] = [];
    for await (const entry of this.#kv.list<unknown>({ prefix: this.#claims })) {
      const claim = claimSchema.safeParse(entry.value);
      if (claim.success) out.push({ id: claim.data.id, labels: Labels.parse(claim.data.labels) });
    }
    return out.sort((a, b) => a.id - b.id);
  }

  /**
   * References every claimed identity from this isolate and releases what is no longer claimed.
   * Runs at start and every `reconcileMs`; call it to force one.
   */
  async reconcile(signal: AbortSignal = this.#closing.signal): Promise<void> {
    const claimed = new Map<string, Labels>();
    for await (const entry of this.#kv.list<unknown>({ prefix: this.#claims })) {
      const key = entry.key[entry.key.length - 1];
      const claim = claimSchema.safeParse(entry.value);
      if (typeof key !== "string" || !claim.success) continue;
      claimed.set(key, Labels.fromKvstoreString(key));
    }
    for (const [key, labels] of claimed) {
      if (this.#held.has(key)) continue;
      await this.#exclusive(key, async () => {
        if (this.#held.has(key)) return;
        const { identity } = await this.identities.allocate(labels, { signal });
        this.#held.set(key, identity);
        // The ID changes only if the identity was collected while no isolate ran.
        await this.#claim(key, identity);
      });
    }
    for (const [key, identity] of [...this.#held]) {
      if (claimed.has(key)) continue;
      await this.#exclusive(key, async () => {
        if (this.#held.get(key) !== identity) return;
        const entry = await this.#kv.get([...this.#claims, key]);
        if (entry.versionstamp !== null) return;
        this.#held.delete(key);
        await this.identities.release(identity, { signal });
      });
    }
    this.#reconciled = true;
  }

  /** Batched changes of the identities this isolate knows (see `IdentityAllocator.changes`). */
  changes(signal: AbortSignal): AsyncIterable<IdentityChange> {
    return this.identities.changes({ signal, replay: false });
  }

  /** Every non-reserved identity this isolate knows right now. */
  snapshot(): Identity[] {
    return [...this.identities.entries()].filter((i) => !this.identities.reserved.isReserved(i.id));
  }

  /** This isolate's bookkeeping. */
  status(): ServiceStatus {
    return { node: this.node, held: this.#held.size, reconciled: this.#reconciled };
  }

  /** Stops reconciling and closes the allocator. References lapse with the lease. */
  async close(): Promise<void> {
    this.#closing.abort();
    await this.#background;
    await this.identities.close();
  }

  /** Same as {@linkcode IdentityService.close}. */
  [Symbol.asyncDispose](): Promise<void> {
    return this.close();
  }
}
