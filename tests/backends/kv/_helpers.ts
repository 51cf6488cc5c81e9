/**
 * Helpers for the Deno KV backend's own tests: sessions opened directly on a fixture's KV file
 * (no allocator), an injectable clock, a simple candidate picker.
 *
 * @module
 */
import type {
  AcquireRequest,
  BackendSession,
  GcCandidate,
  HeldKey,
} from "../../../src/allocator/backend.ts";
import { DenoKvBackend, type DenoKvBackendOptions } from "../../../src/backends/kv/mod.ts";
import type { DenoKvSession } from "../../../src/backends/kv/session.ts";
import { KV_FIXTURE_PREFIX, KvStoreFixture } from "../../../src/backends/kv/testing/fixture.ts";

export { KV_FIXTURE_PREFIX };

/** A settable clock, starting at a fixed epoch. */
export class Clock {
  /** The current time in ms. */
  ms: number;
  /** @param start the initial time in ms */
  constructor(start = 1_700_000_000_000) {
    this.ms = start;
  }
  /** The clock function to inject as `now`. */
  readonly now = (): number => this.ms;
  /** Moves the clock forward. */
  advance(ms: number): void {
    this.ms += ms;
  }
}

/** Options of {@linkcode TestStore.session}. */
export interface SessionSetup extends Partial<DenoKvBackendOptions> {
  /** Lease TTL. @default {60000} */
  readonly leaseTtlMs?: number;
  /** Open without a lease. @default {false} */
  readonly readOnly?: boolean;
  /** Lease replacement callback. */
  readonly onLeaseReplaced?: () => void;
}

/** A fixture plus sessions on their own KV handles, all closed on dispose. */
export class TestStore implements AsyncDisposable {
  /** The underlying KV-file fixture. */
  readonly fixture: KvStoreFixture;
  readonly #handles: Deno.Kv[] = [];
  readonly #sessions: DenoKvSession[] = [];

  private constructor(fixture: KvStoreFixture) {
    this.fixture = fixture;
  }

  /** A fresh KV file. */
  static async create(): Promise<TestStore> {
    return new TestStore(await KvStoreFixture.create());
  }

  /** The fixture's own handle. */
  get kv(): Deno.Kv {
    return this.fixture.kv;
  }

  /** A new handle on the KV file (as another node would have). */
  async handle(): Promise<Deno.Kv> {
    const kv = await Deno.openKv(this.fixture.path);
    this.#handles.push(kv);
    return kv;
  }

  /** A backend for `node` on a new handle. */
  async backend(node: string, options: Partial<DenoKvBackendOptions> = {}): Promise<DenoKvBackend> {
    return new DenoKvBackend(await this.handle(), {
      prefix: KV_FIXTURE_PREFIX,
      node,
      pollIntervalMs: 20,
      maxClockSkewMs: 50,
      ...options,
    });
  }

  /** A session for `node` (lease TTL 60 s unless given). */
  async session(node: string, setup: SessionSetup = {}): Promise<DenoKvSession> {
    const { leaseTtlMs = 60_000, readOnly = false, onLeaseReplaced = () => {}, ...options } = setup;
    const backend = await this.backend(node, options);
    const session = await backend.openSession({ leaseTtlMs, readOnly, onLeaseReplaced });
    this.#sessions.push(session as DenoKvSession);
    return session as DenoKvSession;
  }

  /**
   * A session for `node` whose handle runs `hook.before` ahead of its next commit (see
   * {@linkcode hooked}). The backend gets `options` as given, without the fast timings of
   * {@linkcode TestStore.backend}; lease TTL 60 s unless given.
   */
  async hookedSession(
    node: string,
    setup: SessionSetup = {},
  ): Promise<{ session: DenoKvSession; hook: CommitHook }> {
    const { leaseTtlMs = 60_000, readOnly = false, onLeaseReplaced = () => {}, ...options } = setup;
    const { kv, hook } = hooked(await this.handle());
    const backend = new DenoKvBackend(kv, { prefix: KV_FIXTURE_PREFIX, node, ...options });
    const session = await backend.openSession({ leaseTtlMs, readOnly, onLeaseReplaced });
    this.#sessions.push(session as DenoKvSession);
    return { session: session as DenoKvSession, hook };
  }

  /** Every entry under the prefix, keys without the prefix. */
  async dump(): Promise<{ key: Deno.KvKey; value: unknown; versionstamp: string }[]> {
    const out = [];
    for await (const e of this.kv.list({ prefix: KV_FIXTURE_PREFIX })) {
      out.push({
        key: e.key.slice(KV_FIXTURE_PREFIX.length),
        value: e.value,
        versionstamp: e.versionstamp,
      });
    }
    return out;
  }

  async [Symbol.asyncDispose](): Promise<void> {
    for (const s of this.#sessions.splice(0)) await s.close();
    for (const kv of this.#handles.splice(0)) kv.close();
    await this.fixture[Symbol.asyncDispose]();
  }
}

/** An acquire request whose candidates count up from `first`, recording what was excluded. */
export function request(
  key: string,
  options: {
    first?: number;
    max?: number;
    hint?: AcquireRequest["hint"];
    signal?: AbortSignal;
    seen?: ReadonlySet<number>[];
  } = {},
): AcquireRequest {
  const { first = 1, max = 1_000_000, hint, signal = new AbortController().signal, seen } = options;
  return {
    key,
    hint,
    signal,
    pickCandidate: (exclude) => {
      seen?.push(new Set(exclude));
      for (let id = first; id <= max; id++) if (!exclude.has(id)) return id;
      return undefined;
    },
  };
}

/** A never-aborted signal. */
export const never: AbortSignal = new AbortController().signal;

/** One full `gcList` of `session` over `[min, max]`. */
export async function gcPass(
  session: BackendSession,
  min = 1,
  max = 1_000,
): Promise<GcCandidate[]> {
  const out: GcCandidate[] = [];
  for await (const c of session.gcList({ min, max }, never)) out.push(c);
  return out;
}

/** Collects events from an async iterator until `until` returns true. */
export async function collectUntil<T>(
  iter: AsyncIterator<T>,
  until: (seen: T[]) => boolean,
): Promise<T[]> {
  const seen: T[] = [];
  while (!until(seen)) {
    const next = await iter.next();
    if (next.done) break;
    seen.push(next.value);
  }
  return seen;
}

/** Shorthand for held keys. */
export function held(key: string, id: number): HeldKey {
  return { key, id };
}

/** What {@linkcode hooked} runs around the next commit. */
export interface CommitHook {
  /** Runs before the next commit is sent. */
  before?: () => Promise<void>;
  /** Runs after the next commit landed, with its answer; what it throws is what the caller gets. */
  after?: (res: Deno.KvCommitResult | Deno.KvCommitError) => void;
}

/**
 * A real Kv whose next commit first runs `hook.before` (fault injection at the commit point: another
 * node writes just before the commit is sent; the store itself is real), and then `hook.after`
 * (an answer lost after the commit landed). Each hook is cleared before it runs, so it may set the
 * hook for the commit after.
 */
export function hooked(kv: Deno.Kv): { kv: Deno.Kv; hook: CommitHook } {
  const hook: CommitHook = {};
  const proxy = new Proxy(kv, {
    get(target, prop) {
      if (prop === "atomic") {
        return () => {
          const op = target.atomic();
          const commit = op.commit.bind(op);
          op.commit = async () => {
            const before = hook.before;
            hook.before = undefined;
            await before?.();
            const res = await commit();
            const after = hook.after;
            hook.after = undefined;
            after?.(res);
            return res;
          };
          return op;
        };
      }
      const value = Reflect.get(target, prop, target);
      return typeof value === "function" ? value.bind(target) : value;
    },
  });
  return { kv: proxy, hook };
}
