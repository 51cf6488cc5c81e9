/**
 * A node in its own process, for the cross-process change-feed test. Uses the session directly.
 *
 * deno run -A tests/backends/kv/_child_node.ts '<spec json>' <node> acquire <firstId> <key>...
 * deno run -A tests/backends/kv/_child_node.ts '<spec json>' <node> collect
 *
 * Prints one JSON line: `{key: id}` for acquire, `[deleted ids]` for collect.
 */
import type { BackendSession, GcCandidate } from "../../../src/allocator/backend.ts";
import type { StoreSpec } from "../../../src/testing/fixture.ts";
import { openBackendFromSpec } from "../../_support/open_backend.ts";

const [specJson, node, mode, ...rest] = Deno.args;
await using opened = await openBackendFromSpec(JSON.parse(specJson) as StoreSpec, node, {
  fast: true,
});
await using session: BackendSession = await opened.backend.openSession({
  leaseTtlMs: 2_000,
  readOnly: false,
  // `collect` is the acquiring node started again: it takes over its live lease record.
  restart: mode === "collect",
  onLeaseReplaced: () => {},
});
const signal = new AbortController().signal;

if (mode === "acquire") {
  const [first, ...keys] = rest;
  const ids: Record<string, number> = {};
  let next = Number(first);
  for (const key of keys) {
    const res = await session.acquire({
      key,
      signal,
      pickCandidate: (exclude) => {
        while (exclude.has(next)) next++;
        return next;
      },
    });
    ids[key] = res.id;
    next = res.id + 1;
  }
  console.log(JSON.stringify(ids));
} else {
  // This node's earlier references are dead: opening the session replaced its lease.
  const pass = async () => {
    const out: GcCandidate[] = [];
    for await (const c of session.gcList({ min: 0, max: 1_000_000 }, signal)) out.push(c);
    return out;
  };
  const first = new Map((await pass()).map((c) => [c.id, c]));
  const deleted: number[] = [];
  for (const c of await pass()) {
    if (!c.inUse && first.get(c.id)?.version === c.version && await session.gcDelete(c, signal)) {
      deleted.push(c.id);
    }
  }
  console.log(JSON.stringify(deleted));
}
