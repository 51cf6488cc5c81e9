/**
 * Group commit on a real etcd: concurrent transactions share requests, each keeps its own
 * compares, a transaction whose caller aborted while queued is never sent, two writes of one key
 * never share a request, and a request refused for one transaction's lease is retried one by one.
 */
import assert from "node:assert/strict";
import { TxnBatcher, type TxnRequest } from "../../../src/backends/etcd/batch.ts";
import { EtcdClient, LeaseNotFound } from "../../../src/backends/etcd/client.ts";
import { resolveEtcdOptions } from "../../../src/backends/etcd/options.ts";
import { RequestLimiter } from "../../../src/backends/etcd/request_limiter.ts";
import { absent, put, read } from "../../../src/backends/etcd/txn.ts";
import { deadline, etcdTest, type Namespace, namespace } from "./_helpers.ts";

function connect(ns: Namespace): EtcdClient {
  const settings = resolveEtcdOptions({ endpoints: [...ns.endpoints], node: "batch" });
  return new EtcdClient(settings, new RequestLimiter(undefined));
}

/** Create `key` = `value` if absent; on failure read it. */
function createIfAbsent(key: string, value: string, lease?: string): TxnRequest {
  return { compare: [absent(key)], success: [put(key, value, lease)], failure: [read(key)] };
}

etcdTest("concurrent transactions share requests; each keeps its own compare", async () => {
  await using ns = await namespace();
  const client = connect(ns);
  try {
    const batcher = new TxnBatcher(client, new AbortController().signal);
    const signal = deadline();
    await ns.raw.put(`${ns.prefix}/k7`).value("taken");
    const results = await Promise.all(
      Array.from(
        { length: 40 },
        (_, i) => batcher.run("test", createIfAbsent(`${ns.prefix}/k${i}`, "mine"), signal),
      ),
    );
    assert.ok(batcher.stats.requests < 40, `${batcher.stats.requests} requests for 40`);
    assert.equal(batcher.stats.transactions, 40);
    // Only k7's compare failed; its failure branch read the value that was there.
    results.forEach((r, i) => assert.equal(r.succeeded, i !== 7, `k${i}`));
    assert.equal(results[7].responses[0].response_range?.kvs[0].value.toString(), "taken");
    assert.equal(await ns.raw.get(`${ns.prefix}/k8`).string(), "mine");
  } finally {
    await client.close();
  }
});

etcdTest("a queued transaction whose caller aborts is never sent", async () => {
  await using ns = await namespace();
  const client = connect(ns);
  try {
    const batcher = new TxnBatcher(client, new AbortController().signal);
    const first = batcher.run("test", createIfAbsent(`${ns.prefix}/a`, "1"), deadline());
    const controller = new AbortController();
    const second = batcher.run("test", createIfAbsent(`${ns.prefix}/b`, "1"), controller.signal);
    controller.abort(new Error("gone"));
    await assert.rejects(second, { message: "gone" });
    await first;
    assert.equal(await ns.raw.get(`${ns.prefix}/b`).string(), null);
    assert.equal(batcher.stats.transactions, 1);
  } finally {
    await client.close();
  }
});

etcdTest("two writes of one key never share a request", async () => {
  await using ns = await namespace();
  const client = connect(ns);
  try {
    const batcher = new TxnBatcher(client, new AbortController().signal);
    const signal = deadline();
    const key = `${ns.prefix}/same`;
    // Three at once: the first goes alone, the other two clash and take separate requests.
    const results = await Promise.all([
      batcher.run("test", createIfAbsent(`${ns.prefix}/other`, "x"), signal),
      batcher.run("test", createIfAbsent(key, "first"), signal),
      batcher.run("test", createIfAbsent(key, "second"), signal),
    ]);
    assert.deepEqual(results.map((r) => r.succeeded), [true, true, false]);
    assert.equal(await ns.raw.get(key).string(), "first");
    assert.equal(batcher.stats.requests, 3);
  } finally {
    await client.close();
  }
});

etcdTest("a request refused for one transaction's lease is retried one by one", async () => {
  await using ns = await namespace();
  const client = connect(ns);
  try {
    const batcher = new TxnBatcher(client, new AbortController().signal);
    const signal = deadline();
    const live = String((await ns.raw.leaseClient.leaseGrant({ TTL: 30 })).ID);
    const dead = String((await ns.raw.leaseClient.leaseGrant({ TTL: 30 })).ID);
    await ns.raw.leaseClient.leaseRevoke({ ID: dead });
    const [warm, good, bad] = await Promise.allSettled([
      batcher.run("test", createIfAbsent(`${ns.prefix}/w`, "1"), signal),
      batcher.run("test", createIfAbsent(`${ns.prefix}/g`, "1", live), signal),
      batcher.run("test", createIfAbsent(`${ns.prefix}/d`, "1", dead), signal),
    ]);
    assert.equal(warm.status, "fulfilled");
    assert.equal(good.status === "fulfilled" && good.value.succeeded, true);
    assert.ok(bad.status === "rejected" && bad.reason instanceof LeaseNotFound);
    assert.equal(await ns.raw.get(`${ns.prefix}/g`).string(), "1");
    await ns.raw.leaseClient.leaseRevoke({ ID: live });
  } finally {
    await client.close();
  }
});
