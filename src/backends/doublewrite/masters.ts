/**
 * One side's identities as its watch lists them (apart from `./drift.ts`, which needs the backend
 * class, so that the doctor can read both sides without an import circle).
 *
 * @module
 */
import type { Backend, BackendSession } from "../../allocator/backend.ts";

/** Every master a session's watch lists before `synced`, as ID → key. */
export async function listMasters(
  session: BackendSession,
  signal: AbortSignal,
): Promise<Map<number, string>> {
  const out = new Map<number, string>();
  for await (const ev of session.watch(signal)) {
    if (ev.type === "synced") break;
    if (ev.type === "upsert") out.set(ev.id, ev.key);
    else out.delete(ev.id);
  }
  return out;
}

const READER = { leaseTtlMs: 60_000, readOnly: true, onLeaseReplaced: () => {} } as const;

/** Runs `fn` with a read-only session on each side, closing both after it. */
export async function withReaders<T>(
  sides: { readonly kvstore: Backend; readonly crd: Backend },
  signal: AbortSignal,
  fn: (kvstore: BackendSession, crd: BackendSession) => Promise<T>,
): Promise<T> {
  const kv = await sides.kvstore.openSession({ ...READER, signal });
  try {
    const crd = await sides.crd.openSession({ ...READER, signal });
    try {
      return await fn(kv, crd);
    } finally {
      await crd.close();
    }
  } finally {
    await kv.close();
  }
}
