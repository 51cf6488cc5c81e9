/**
 * The end-of-run probe: two fresh nodes (a plain allocator and an identity allocator) allocate
 * every key of both families once and release it again. A key that cannot be allocated any more
 * (a planted key index, counter or reference that wedges it) is a violation: garbage must never
 * cost valid data. The probe's answers join the history like any worker's.
 *
 * @module
 */
import { Allocator } from "../src/allocator/allocator.ts";
import { IdentityAllocator, Labels } from "../src/identity/mod.ts";
import type { Violation } from "./checks/violation.ts";
import { openBackend, startWhenReachable } from "./process_support.ts";
import type { NemesisStoreSpec, NemesisTimings } from "../src/testing/nemesis.ts";
import { failedCall, type LineLog } from "./records.ts";

/** Check name of the probe. */
export const PROBE_CHECK = "every key still allocatable (nothing lost to garbage)";

/** Calls in flight at once per probe node. */
const WIDTH = 8;

interface ProbeClient {
  /**
   * The ID, and whether this call created it: a join that lost its identity to a GC delete and
   * created it again from the key's claim answers it as new (`refs.ts`, case 2), one that
   * answered before the delete did not (case 3); the deletion check's evidence tells them apart.
   */
  allocate(key: string, signal: AbortSignal): Promise<{ id: number; isNew: boolean }>;
  release(key: string, signal: AbortSignal): Promise<boolean>;
}

/** Allocates and releases every key of `plain` and `identity`; returns the keys that failed. */
export async function probeKeys(
  spec: NemesisStoreSpec,
  families: { plain: readonly string[]; identity: readonly string[] },
  range: { min: number; max: number },
  timings: NemesisTimings,
  log: LineLog,
): Promise<Violation[]> {
  const violations: Violation[] = [];
  const options = { leaseTtlMs: timings.leaseTtlMs, syncIntervalMs: timings.syncIntervalMs };
  {
    // Opened as workers are: a connect that times out on a loaded machine is tried again.
    await using opened = await startWhenReachable(() => openBackend(spec, "probe"));
    await using alloc = await startWhenReachable(() =>
      Allocator.open(opened.backend, { ...range, ...options })
    );
    await probe("probe", families.plain, timings, log, violations, {
      allocate: async (key, signal) => {
        const { id, isNew } = await alloc.allocate(key, { signal });
        return { id, isNew };
      },
      release: async (key, signal) => (await alloc.release(key, { signal })).lastUse,
    });
  }
  {
    await using opened = await startWhenReachable(() => openBackend(spec, "probe-identity"));
    await using identities = await startWhenReachable(() =>
      IdentityAllocator.open(opened.backend, options)
    );
    const held = new Map<string, Awaited<ReturnType<IdentityAllocator["allocate"]>>>();
    await probe("probe-identity", families.identity, timings, log, violations, {
      allocate: async (key, signal) => {
        const r = await identities.allocate(Labels.fromKvstoreString(key), { signal });
        held.set(key, r);
        return { id: r.identity.id, isNew: r.isNew };
      },
      release: (key, signal) => identities.release(held.get(key)!.identity, { signal }),
    });
  }
  return violations;
}

async function probe(
  node: string,
  keys: readonly string[],
  timings: NemesisTimings,
  log: LineLog,
  violations: Violation[],
  client: ProbeClient,
): Promise<void> {
  const inc = `${node}@probe`;
  const allocated: string[] = [];
  const call = async (op: "allocate" | "release", key: string) => {
    const start = Date.now();
    const signal = AbortSignal.timeout(timings.callTimeoutMs);
    const base = { t: "call", node, inc, op, key, start, held: op === "release" } as const;
    try {
      if (op === "allocate") {
        const { id, isNew } = await client.allocate(key, signal);
        allocated.push(key);
        log.write({ ...base, end: Date.now(), ok: true, id, isNew });
      } else {
        const lastUse = await client.release(key, signal);
        log.write({ ...base, end: Date.now(), ok: true, lastUse });
      }
    } catch (err) {
      const record = failedCall(base, err, signal);
      log.write(record);
      if (op === "allocate") {
        violations.push({
          check: PROBE_CHECK,
          message: `${node} could not allocate ${key}: ${record.error}: ${record.message}`,
          evidence: { record, cause: String((err as { cause?: unknown }).cause ?? "") },
        });
      }
    }
  };
  await each(keys, (key) => call("allocate", key));
  await each(allocated, (key) => call("release", key));
}

async function each(items: readonly string[], fn: (item: string) => Promise<void>): Promise<void> {
  let next = 0;
  await Promise.all(Array.from({ length: WIDTH }, async () => {
    while (next < items.length) await fn(items[next++]);
  }));
}
