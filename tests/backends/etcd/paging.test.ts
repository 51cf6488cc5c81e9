/**
 * Paged range reads: large pages of small masters, byte-sized pages of large ones, pages refused
 * by the receive limit asked again smaller, every page at the first page's revision, and
 * compaction of that revision between two pages.
 */
import assert from "node:assert/strict";
import type { IKeyValue } from "etcd3";
import { EtcdClient } from "../../../src/backends/etcd/client.ts";
import { resolveEtcdOptions } from "../../../src/backends/etcd/options.ts";
import { MAX_PAGE_KEYS, rangePages, RevisionCompacted } from "../../../src/backends/etcd/paging.ts";
import { RequestLimiter } from "../../../src/backends/etcd/request_limiter.ts";
import { prefixRange, text } from "../../../src/backends/etcd/txn.ts";
import { startEtcd } from "../../../src/backends/etcd/testing/cluster.ts";
import { deadline, etcdTest, type Namespace, namespace, openSession } from "./_helpers.ts";

/**
 * Writes masters `id → value(id)` raw, up to 100 (and 1 MB, under etcd's request limit) per
 * transaction, a few transactions at a time.
 */
async function writeMasters(
  ns: Namespace,
  ids: readonly number[],
  value: (id: number) => string,
): Promise<void> {
  const batches: number[][] = [[]];
  let bytes = 0;
  for (const id of ids) {
    const size = value(id).length;
    if (batches.at(-1)!.length >= 100 || bytes + size > 1_000_000) {
      batches.push([]);
      bytes = 0;
    }
    batches.at(-1)!.push(id);
    bytes += size;
  }
  for (let i = 0; i < batches.length; i += 8) {
    await Promise.all(
      batches.slice(i, i + 8).map((batch) =>
        ns.raw.if(`${ns.prefix}/never-written`, "Version", "==", 0)
          .then(...batch.map((id) => ns.raw.put(ns.layout.masterKey(id)).value(value(id))))
          .commit()
      ),
    );
  }
}

function range(from: number, count: number): number[] {
  return Array.from({ length: count }, (_, i) => from + i);
}

/** A client of its own on `ns`, accepting responses up to `maxResponseBytes`. */
function smallClient(ns: Namespace, maxResponseBytes: number): EtcdClient {
  const settings = resolveEtcdOptions({ endpoints: [...ns.endpoints], node: "pager" });
  return new EtcdClient(settings, new RequestLimiter(undefined), { maxResponseBytes });
}

/** Lists the masters through a read-only session's watch; returns them and the list requests. */
async function listThroughWatch(
  ns: Namespace,
): Promise<{ listed: Map<number, string>; requests: number }> {
  const backend = await ns.backend("lister");
  await using session = await openSession(backend, { readOnly: true });
  const before = backend.requestStats().operations["list masters"] ?? 0;
  const listed = new Map<number, string>();
  for await (const ev of session.watch(deadline(30_000))) {
    if (ev.type === "synced") break;
    assert.equal(ev.type, "upsert");
    if (ev.type !== "upsert") continue;
    assert.ok(!listed.has(ev.id), `master ${ev.id} listed twice`);
    listed.set(ev.id, ev.key);
  }
  return { listed, requests: (backend.requestStats().operations["list masters"] ?? 0) - before };
}

etcdTest("many small masters: listed exactly once each, in large pages", async () => {
  await using ns = await namespace();
  const total = 2 * MAX_PAGE_KEYS + 17;
  const ids = range(256, total);
  await writeMasters(ns, ids, (id) => `k8s:app=web-${id};`);

  const { listed, requests } = await listThroughWatch(ns);
  assert.equal(listed.size, total);
  for (const id of ids) assert.equal(listed.get(id), `k8s:app=web-${id};`);
  // A small first page (sized for the largest values), then pages of MAX_PAGE_KEYS.
  assert.ok(requests >= 3, `${requests} list requests`);
  assert.ok(requests <= Math.ceil(total / MAX_PAGE_KEYS) + 1, `${requests} list requests`);

  // GC walks the same pages and sees every master, none in use.
  const backend = await ns.backend("gc");
  await using session = await openSession(backend, { readOnly: true });
  let candidates = 0;
  for await (const c of session.gcList({ min: 0, max: 1 << 30 }, deadline(30_000))) {
    assert.equal(c.key, `k8s:app=web-${c.id};`);
    assert.equal(c.inUse, false);
    candidates++;
  }
  assert.equal(candidates, total);
});

etcdTest("masters with ~90 KB values (a few MiB) span several byte-sized pages", async () => {
  await using ns = await namespace();
  const ids = range(1, 60);
  // Distinct large keys of different sizes: 60 × 60-90 KB ≈ 4.5 MB in all.
  const value = (id: number) => `k8s:big=${id};`.padEnd(60_000 + 500 * id, String(id % 10));
  await writeMasters(ns, ids, value);

  const { listed, requests } = await listThroughWatch(ns);
  assert.equal(listed.size, ids.length);
  for (const id of ids) assert.equal(listed.get(id), value(id));
  assert.ok(requests >= 3, `${requests} list requests for ~4.5 MB`);
});

etcdTest(
  "a page over the receive limit is asked again smaller; every page is at the first revision",
  async () => {
    await using ns = await namespace();
    // A run of small values, then a run of 60 KB ones: the small ones' average would size a page
    // far over a 256 KiB receive limit.
    const small = range(1000, 30);
    const big = range(2000, 30);
    await writeMasters(ns, small, (id) => `small-${id};`);
    await writeMasters(ns, big, (id) => `big-${id};`.padEnd(60_000, "x"));
    const client = smallClient(ns, 256 * 1024);
    try {
      const pages = rangePages(
        client,
        "page",
        prefixRange(ns.layout.masterRange),
        deadline(30_000),
      );
      const kvs: IKeyValue[] = [];
      const revisions = new Set<string>();
      let count = 0;
      for await (const page of pages) {
        if (count++ === 0) {
          // Changes after the first page are invisible to the rest of the list.
          await ns.raw.delete().key(ns.layout.masterKey(2029));
          await ns.raw.put(ns.layout.masterKey(2015)).value("rewritten;");
          await ns.raw.put(ns.layout.masterKey(3000)).value("later;");
        }
        revisions.add(page.revision);
        kvs.push(...page.kvs);
      }
      assert.equal(revisions.size, 1, `pages at revisions ${[...revisions]}`);
      const ids = kvs.map((kv) => Number(text(kv.key).slice(ns.layout.masterRange.length)));
      assert.deepEqual(ids, [...small, ...big]);
      assert.equal(
        text(kvs.find((kv) => text(kv.key) === ns.layout.masterKey(2015))!.value),
        "big-2015;".padEnd(60_000, "x"),
      );
      // Some pages were refused and asked again, without a retry storm (a refusal is not a
      // member failure: it must not make the client skip the member or retry the same page).
      const requests = client.operations()["page"];
      assert.ok(requests > count, `${requests} requests for ${count} pages: nothing refused`);
      assert.ok(requests <= count + 6, `${requests} requests for ${count} pages`);
    } finally {
      await client.close();
    }
  },
);

etcdTest("compaction of the pinned revision between two pages: throw, or resume", async () => {
  await using etcd = await startEtcd();
  await using ns = await namespace(etcd);
  const ids = range(100, 60);
  await writeMasters(ns, ids, (id) => `k${id};`.padEnd(50_000, "v"));
  const backend = await ns.backend("a");
  await using session = await openSession(backend, { readOnly: true });
  const client = smallClient(ns, 64 * 1024 * 1024);
  try {
    for (const mode of ["throw", "resume"] as const) {
      const pages = rangePages(client, "page", prefixRange(ns.layout.masterRange), deadline(), {
        onCompacted: mode,
      });
      const seen: number[] = [];
      const revisions = new Set<string>();
      let first = true;
      const run = async () => {
        for await (const page of pages) {
          revisions.add(page.revision);
          for (const kv of page.kvs) {
            seen.push(Number(text(kv.key).slice(ns.layout.masterRange.length)));
          }
          if (first) {
            first = false;
            assert.ok(page.kvs.length < ids.length, "more than one page");
            await ns.raw.put(ns.layout.masterKey(159)).value("rewritten;");
            await etcd.compact();
          }
        }
      };
      if (mode === "throw") {
        await assert.rejects(run(), RevisionCompacted);
      } else {
        await run();
        assert.deepEqual(seen, ids, "each master once, in order");
        assert.equal(revisions.size, 2, "the rest of the list at a newer revision");
      }
    }
    // GC resumes: a compaction during its list does not fail the pass.
    let candidates = 0;
    for await (const c of session.gcList({ min: 0, max: 1000 }, deadline())) {
      if (candidates++ === 0) {
        await ns.raw.put(`${ns.prefix}/unrelated`).value("x");
        await etcd.compact();
      }
      assert.equal(c.inUse, false);
    }
    assert.equal(candidates, ids.length);
  } finally {
    await client.close();
  }
});
