/**
 * The Kubernetes store's own nemesis faults, on the run's private API server and its etcd:
 *
 * - `apiserver-restart`: SIGKILL kube-apiserver, wait 0.5–3 s (half the time compacting etcd
 *   meanwhile), start it again on the same port. Every request fails while it is down; every
 *   watch resumes into a new watch cache, which answers a version from before it with `410`.
 * - `etcd-restart`: SIGKILL the etcd under the API server, wait 1–4 s, start it again on the same
 *   data. Requests fail meanwhile; the API server's watch cache resumes its etcd watch, so the
 *   clients' watches go on.
 * - `watch-expiry`: every client's watch of the identities forced into `410 Expired` (the watch
 *   cache serves watches, so compacting etcd alone expires none): the API server is stopped
 *   (SIGSTOP) while its etcd restarts and is compacted past what its watch cache has seen, then
 *   continued. The cache's etcd watch resumes into the compaction, the cache re-lists and ends
 *   every client's watch, and a resume from any version before gets `410`. The fault checks from
 *   outside that a watch from a version read before it now gets `410`.
 *
 * @module
 */
import { sleep } from "../../../abort.ts";
import type { StoreFaultOutcome } from "../../../testing/nemesis.ts";
import { between } from "../../../testing/prng.ts";
import type { KubeClient, KubeResourceDescriptor } from "../client.ts";
import { isStatus } from "../kube.ts";
import type { KubeTestCluster } from "./cluster.ts";
import { API_SERVER_READY_MS, HARNESS_RETRY_MS } from "./nemesis_retry.ts";
import { alive } from "../../../testing/process_alive.ts";

/** The store's faults, each with the report's label. */
export const K8S_STORE_FAULTS = {
  "apiserver-restart": "API-server restart",
  "etcd-restart": "etcd restart under the API server",
  "watch-expiry": "forced watch expiry (410)",
} as const;

/** One fault of the run's API server. */
export type K8sStoreFault = keyof typeof K8S_STORE_FAULTS;

/** What a fault acts on: the server, and an admin client that reads the identities. */
export interface FaultTarget {
  /** The run's API server and its etcd. */
  readonly cluster: KubeTestCluster;
  /** An admin client of it. */
  readonly client: KubeClient;
  /** The identity resource. */
  readonly identities: KubeResourceDescriptor;
}

/** How long the fault waits for a watch from before it to be refused with `410`. */
const EXPIRY_BOUND_MS = 20_000;

/** Injects fault `kind` and resolves once the API server serves again. */
export async function injectK8sFault(
  target: FaultTarget,
  kind: string,
  random: () => number,
): Promise<StoreFaultOutcome> {
  const { cluster } = target;
  switch (kind as K8sStoreFault) {
    case "apiserver-restart": {
      const down = between(random, 500, 3_000);
      const compact = random() < 0.5;
      await cluster.kill();
      let compaction = "";
      const restarting = { at: 0, attempts: 0 };
      try {
        await sleep(down);
        // Best effort: a compaction that times out (5 s, at load 30–40) leaves the API server down
        // no longer (seeds 1 and 3 lost it for the rest of the run, and the harness failed).
        if (compact) {
          compaction = await cluster.compact().then(
            (revision) => `, etcd compacted at revision ${revision} meanwhile`,
            (err) => `, etcd's compaction failed meanwhile (${err})`,
          );
        }
      } finally {
        restarting.at = Date.now();
        await again("restart kube-apiserver", restarting, () => cluster.restart());
      }
      return {
        detail: `SIGKILL kube-apiserver, down ${down} ms${compaction}, ready ` +
          `${Date.now() - restarting.at} ms after its restart` + retries(restarting.attempts),
        backAt: Date.now(),
      };
    }
    case "etcd-restart": {
      const down = between(random, 1_000, 4_000);
      await cluster.etcd.kill(0);
      const restarting = { at: 0, attempts: 0 };
      try {
        await sleep(down);
      } finally {
        restarting.at = Date.now();
        await again("restart etcd", restarting, () => restartEtcd(cluster));
      }
      await again(
        "wait for kube-apiserver",
        { attempts: 0 },
        () => cluster.ready(API_SERVER_READY_MS),
      );
      return {
        detail: `SIGKILL etcd under the API server, down ${down} ms` +
          retries(restarting.attempts),
        backAt: Date.now(),
      };
    }
    case "watch-expiry":
      return { detail: await expireWatches(target) };
    default:
      throw new Error(`no store fault '${kind}' on k8s`);
  }
}

/**
 * How long a fault tries to bring back what it stopped: the harness's bound
 * (`./nemesis_retry.ts`); each start of the API server waits up to `API_SERVER_READY_MS` for it
 * to be ready (the run's API server is started with that bound).
 */
const RESTART_BOUND_MS = HARNESS_RETRY_MS;

/**
 * Runs `start` (a restart of a process the fault stopped) until it succeeds, for up to
 * {@linkcode RESTART_BOUND_MS}, counting attempts in `tally`: a start that fails (not ready in
 * time on a loaded machine, a port not yet free) must not leave the run's store down for good.
 * After the bound, {@linkcode FaultRecoveryError}.
 */
async function again(
  what: string,
  tally: { attempts: number },
  start: () => Promise<void>,
): Promise<void> {
  const deadline = Date.now() + RESTART_BOUND_MS;
  for (;;) {
    tally.attempts++;
    try {
      return await start();
    } catch (err) {
      if (Date.now() > deadline) throw new FaultRecoveryError(what, tally.attempts, err);
      await sleep(1_000);
    }
  }
}

/**
 * Starts the API server's etcd again. A start that did not turn healthy in time leaves its process
 * running (slow, not dead): a later attempt then waits for the API server to be ready on it
 * instead of starting a second one.
 */
async function restartEtcd(cluster: KubeTestCluster): Promise<void> {
  if (cluster.etcd.running(0)) await cluster.ready(API_SERVER_READY_MS);
  else await cluster.etcd.restart(0);
}

/**
 * Starts the run's API server again if its process is gone (killed by someone, crashed): what a
 * kubelet does for a static pod. `true` when it did. Not while a fault holds it down on purpose:
 * the caller knows.
 */
export async function reviveApiServer(cluster: KubeTestCluster): Promise<boolean> {
  const pid = cluster.pid;
  if (pid !== undefined && alive(pid)) return false;
  // Dead under a PID the handle still holds: forget it (a kill of no process), then start anew.
  if (pid !== undefined) await cluster.kill();
  await cluster.restart();
  return true;
}

/** The detail's note of a restart that took more than one attempt. */
function retries(attempts: number): string {
  return attempts > 1 ? ` (${attempts} attempts to start it)` : "";
}

/** A fault could not bring back what it stopped within its bound; `cause`: the last failure. */
export class FaultRecoveryError extends Error {
  override readonly name = "FaultRecoveryError";

  /**
   * @param what what was being brought back
   * @param attempts attempts made
   * @param cause the last failure
   */
  constructor(what: string, attempts: number, cause: unknown) {
    super(`${what}: failed ${attempts} times over ${RESTART_BOUND_MS} ms: ${cause}`, { cause });
  }
}

/**
 * The `watch-expiry` fault (see the module doc); what it did and the API server's answer. While
 * the API server is stopped, its watch cache cannot resume its etcd watch, and nothing else writes:
 * etcd is restarted (the cache's etcd stream breaks), written twice and compacted at its new
 * revision, past any revision the cache will resume from. Continued, the cache meets the
 * compaction, re-lists, and ends every client's watch; their resumes get `410`.
 */
async function expireWatches({ cluster, client, identities }: FaultTarget): Promise<string> {
  const { resourceVersion: before } = await client.list(identities, { limit: 1 });
  const paused = Date.now();
  cluster.pause(true);
  let revision: number;
  try {
    await cluster.etcd.kill(0);
    await again("restart etcd", { attempts: 0 }, () => restartEtcd(cluster));
    for (let i = 0; i < 2; i++) await putBehind(cluster.etcd.endpoints[0], i);
    revision = await cluster.compact();
  } finally {
    cluster.pause(false);
  }
  const stalled = Date.now() - paused;
  const answer = await expiredFrom(client, identities, before);
  return `kube-apiserver stopped ${stalled} ms while its etcd restarted and was compacted at ` +
    `revision ${revision}: a watch from version ${before} now gets 410 (${answer})`;
}

/** Writes a key of no resource straight into etcd (`endpoint`), behind the API server's back. */
async function putBehind(endpoint: string, n: number): Promise<void> {
  const response = await fetch(`${endpoint}/v3/kv/put`, {
    method: "POST",
    body: JSON.stringify({ key: btoa("/nemesis/behind"), value: btoa(String(n)) }),
    signal: AbortSignal.timeout(5_000),
  });
  await response.body?.cancel();
  if (!response.ok) throw new Error(`etcd put: HTTP ${response.status}`);
}

/**
 * Watches `res` from version `rv` until the API server refuses it with `410` (the old storage may
 * serve it for a moment after the rebuild); the refusal's message.
 */
async function expiredFrom(
  client: KubeClient,
  res: KubeResourceDescriptor,
  rv: string,
): Promise<string> {
  const deadline = Date.now() + EXPIRY_BOUND_MS;
  while (Date.now() < deadline) {
    const signal = AbortSignal.timeout(1_000);
    try {
      for await (const _ of client.watch(res, { resourceVersion: rv, signal })) {
        // Served from the old watch cache still: wait for the stream to end.
      }
    } catch (err) {
      if (isStatus(err, 410)) return err.message;
      if (!signal.aborted) throw err;
    }
    await sleep(200);
  }
  throw new Error(`a watch from version ${rv} was still served ${EXPIRY_BOUND_MS} ms later`);
}
