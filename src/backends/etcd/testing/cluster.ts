/**
 * Private etcd processes for tests, the nemesis suite and benchmarks: free loopback ports, a temporary data dir,
 * short raft timings, stopped by PID.
 *
 * etcd is launched through a tiny shell wrapper that returns at once (so no child-process resource
 * stays open across tests and Deno's sanitizers stay quiet) and leaves a watchdog behind that kills
 * etcd and removes the data dir if this process dies without cleaning up. Only `node:` APIs: the
 * conformance suite runs on Deno, Node.js and Bun.
 *
 * @example
 * ```ts ignore
 * // ignored: starts three etcd processes; tests/backends/etcd/cluster.test.ts runs this for real.
 * await using etcd = await startEtcd({ members: 3 });
 * console.log(etcd.endpoints, await etcd.leader());
 * ```
 * @module
 */

import { execFile } from "node:child_process";
import { readFileSync, rmSync } from "node:fs";
import { mkdtemp, readFile, rm } from "node:fs/promises";
import { createServer } from "node:net";
import { join } from "node:path";
import process from "node:process";
import { connect as connectTls, type ConnectionOptions } from "node:tls";
import { isFile, onPath } from "../../../testing/runtime.ts";
import { alive } from "../../../testing/process_alive.ts";
import { serverDataRoot } from "../../../testing/server_data.ts";
import { acquireSlot, type Slot } from "../../../testing/slots.ts";

/** Where Debian's `etcd-server` puts the binary (used when `etcd` is not on PATH). */
export const DEBIAN_ETCD = "/usr/bin/etcd";

/** The etcd binary: the first `etcd` on PATH, else Debian's path; `undefined` if neither. */
export function findEtcd(): string | undefined {
  return onPath("etcd") ?? (isFile(DEBIAN_ETCD) ? DEBIAN_ETCD : undefined);
}

let warned = false;

/**
 * Why the etcd tests cannot run here, or `undefined` when they can. Without etcd the tests are
 * skipped with a loud message, unless env `CI` is set: then this returns `undefined`, the tests
 * run, and they fail in {@linkcode startEtcd} saying etcd is missing.
 */
export function etcdUnavailable(): string | undefined {
  if (findEtcd() !== undefined) return undefined;
  if (process.env.CI) return undefined;
  const why =
    "etcd is not installed (no `etcd` on PATH, no /usr/bin/etcd; apt-get install etcd-server)";
  if (!warned) {
    warned = true;
    console.error(
      `\n${
        "!".repeat(100)
      }\n!!! SKIPPING THE etcd TESTS: ${why}\n!!! With CI set they fail instead.\n${
        "!".repeat(100)
      }\n`,
    );
  }
  return why;
}

/** Options of {@linkcode startEtcd}. */
export interface StartEtcdOptions {
  /** Cluster size. @default {1} */
  readonly members?: 1 | 3;
  /** Raft heartbeat in ms. @default {50} */
  readonly heartbeatMs?: number;
  /** Raft election timeout in ms. @default {500} */
  readonly electionMs?: number;
  /**
   * Serve clients over TLS with these PEM files (peers stay plain on loopback). With `client`,
   * etcd demands client certificates signed by `ca`, and the health probe presents this one.
   */
  readonly tls?: {
    readonly ca: string;
    readonly cert: string;
    readonly key: string;
    readonly client?: { readonly cert: string; readonly key: string };
  };
  /**
   * Take one of the test run's etcd slots (see `src/testing/slots.ts`: under the test launcher at
   * most {@linkcode ETCD_SLOTS} private clusters run at once; a start waits for a free slot).
   * `false` for an etcd that another capped server owns (a test kube-apiserver's).
   * @default {true}
   */
  readonly slot?: boolean;
}

/** At most this many private etcd clusters at once in a launcher's run (`startEtcd`'s `slot`). */
export const ETCD_SLOTS = 4;

/** The environment variable naming the test run's shared etcd (its client URLs, comma-separated). */
export const ETCD_TEST_SERVER_ENV = "IDALLOC_ETCD_TEST_SERVER";

/** The shared etcd named in the environment is unusable (a bad URL list). */
export class EtcdTestServerError extends Error {
  override readonly name = "EtcdTestServerError";
  constructor(message: string, options?: ErrorOptions) {
    super(message, options);
  }
}

/** A running private etcd cluster. */
export interface EtcdCluster extends AsyncDisposable {
  /** Client URLs, one per member (`http://127.0.0.1:<port>`). */
  readonly endpoints: readonly string[];
  /** Member names, in the order of `endpoints`. */
  readonly names: readonly string[];
  /** SIGKILLs member `index` and waits until it is gone. */
  kill(index: number): Promise<void>;
  /** Starts a killed member again on the same ports and data dir and waits until it is healthy. */
  restart(index: number): Promise<void>;
  /** Index of the current leader (waits for one), as every live member reports it. Plain-text clusters only. */
  leader(): Promise<number>;
  /** Whether member `index` is running. */
  running(index: number): boolean;
  /** Compacts the store up to `revision` (0: the current revision); plain-text clusters only. */
  compact(revision?: number): Promise<number>;
  /** Stops every member (SIGKILL: test data needs no graceful stop) and removes the data dirs. */
  close(): Promise<void>;
  /** SIGKILLs every member and removes the data dirs, synchronously (for `unload`). */
  stopSync(): void;
}

/** One member of a cluster being started or running. */
interface Member {
  readonly name: string;
  readonly clientPort: number;
  readonly peerPort: number;
  readonly dataDir: string;
  pid?: number;
}

/**
 * The kernel's ephemeral range: ports it hands to outgoing connections. A port picked inside it
 * can be taken by some client's socket between our check and etcd's bind ("address already in
 * use", seen once in a nemesis run), so ports are picked below it.
 */
function ephemeralRange(): [number, number] {
  try {
    const [lo, hi] = readFileSync("/proc/sys/net/ipv4/ip_local_port_range", "utf8").trim()
      .split(/\s+/).map(Number);
    if (Number.isSafeInteger(lo) && Number.isSafeInteger(hi)) return [lo, hi];
  } catch {
    // not Linux, or /proc unreadable: fall back to the kernel's choice below
  }
  return [0, 0];
}

function bindable(port: number): Promise<number | undefined> {
  return new Promise((resolve) => {
    const server = createServer();
    server.once("error", () => resolve(undefined));
    server.listen({ host: "127.0.0.1", port, exclusive: true }, () => {
      const address = server.address();
      const bound = typeof address === "object" && address !== null ? address.port : undefined;
      server.close(() => resolve(bound));
    });
  });
}

/**
 * A free loopback TCP port, picked at random below the ephemeral range (so no outgoing
 * connection takes it before the server binds it), else the kernel's choice.
 */
export async function freePort(): Promise<number> {
  const [lo] = ephemeralRange();
  const floor = 10_000;
  if (lo - floor >= 1000) {
    for (let i = 0; i < 50; i++) {
      const port = await bindable(floor + Math.floor(Math.random() * (lo - floor)));
      if (port !== undefined) return port;
    }
  }
  const port = await bindable(0);
  if (port === undefined) throw new Error("no free loopback port");
  return port;
}

function delay(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

async function gateway<T>(port: number, path: string, body: unknown, timeoutMs = 1000): Promise<T> {
  const res = await fetch(`http://127.0.0.1:${port}${path}`, {
    method: "POST",
    body: JSON.stringify(body),
    signal: AbortSignal.timeout(timeoutMs),
  });
  const text = await res.text();
  if (!res.ok) throw new Error(`etcd ${path}: HTTP ${res.status} ${text}`);
  return JSON.parse(text) as T;
}

async function healthy(port: number, tls?: StartEtcdOptions["tls"]): Promise<boolean> {
  if (tls) return await healthyOverTls(port, tls);
  try {
    const res = await fetch(`http://127.0.0.1:${port}/health`, {
      signal: AbortSignal.timeout(1000),
    });
    return res.ok && (await res.text()).includes('"true"');
  } catch {
    return false;
  }
}

/**
 * `/health` over TLS, on a raw TLS socket (the runtimes' `fetch` differ in how they take a CA).
 * With client-certificate auth the plain probe cannot get in; the member's readiness is then
 * judged by the TLS handshake alone.
 */
async function healthyOverTls(
  port: number,
  tls: NonNullable<StartEtcdOptions["tls"]>,
): Promise<boolean> {
  const options: ConnectionOptions = {
    host: "127.0.0.1",
    port,
    ca: await readFile(tls.ca, "utf8"),
    ...(tls.client && {
      cert: await readFile(tls.client.cert, "utf8"),
      key: await readFile(tls.client.key, "utf8"),
    }),
  };
  return await new Promise<boolean>((resolve) => {
    let answer = "";
    const socket = connectTls(options, () => {
      if (tls.client) {
        socket.destroy();
        resolve(true);
        return;
      }
      socket.end("GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
    });
    socket.setTimeout(1000, () => socket.destroy());
    socket.setEncoding("utf8");
    socket.on("data", (chunk: string) => (answer += chunk));
    socket.on("error", () => resolve(false));
    socket.on("close", () => resolve(/^HTTP\/1\.1 200/.test(answer) && answer.includes('"true"')));
  });
}

/**
 * `sh -c` script that starts a server (etcd, the Kubernetes API server) detached:
 * `sh -c WRAPPER name PARENT_PID BASE_DIR LOG_FILE binary args…`. It prints the server's PID and
 * exits; the watchdog subshell outlives it, detached from our pipes, and kills the server and
 * removes BASE_DIR if the test process (PARENT) disappears first.
 */
export const WRAPPER = `
parent="$1"; base="$2"; log="$3"; shift 3
"$@" >>"$log" 2>&1 </dev/null &
pid=$!
echo "$pid"
(
  while kill -0 "$parent" 2>/dev/null; do
    if ! kill -0 "$pid" 2>/dev/null; then exit 0; fi
    sleep 0.5
  done
  kill -9 "$pid" 2>/dev/null
  rm -rf "$base"
) >/dev/null 2>&1 </dev/null &
`;

/** What every member of one cluster shares: the binary, the data dir, the flags. */
interface Plan {
  readonly binary: string;
  readonly options: StartEtcdOptions;
  readonly scheme: "http" | "https";
  /** The temporary dir holding every member's data dir and log. */
  readonly base: string;
  readonly token: string;
  readonly members: Member[];
}

/** The binary, a fresh data dir and free ports for every member; nothing started yet. */
async function planCluster(options: StartEtcdOptions): Promise<Plan> {
  const binary = findEtcd();
  if (binary === undefined) {
    throw new Error(
      "etcd is not installed (no `etcd` on PATH, no /usr/bin/etcd): apt-get install etcd-server",
    );
  }
  const base = await mkdtemp(join(serverDataRoot(), "idalloc-etcd-"));
  const members: Member[] = [];
  for (let i = 0; i < (options.members ?? 1); i++) {
    members.push({
      name: `m${i}`,
      clientPort: await freePort(),
      peerPort: await freePort(),
      dataDir: `${base}/m${i}`,
    });
  }
  return {
    binary,
    options,
    scheme: options.tls ? "https" : "http",
    base,
    token: `idalloc-${crypto.randomUUID()}`,
    members,
  };
}

/** etcd's command line for member `m` of `plan`. */
function memberArgs(plan: Plan, m: Member): string[] {
  const { options } = plan;
  const client = `${plan.scheme}://127.0.0.1:${m.clientPort}`;
  const peer = `http://127.0.0.1:${m.peerPort}`;
  const initialCluster = plan.members.map((p) => `${p.name}=http://127.0.0.1:${p.peerPort}`)
    .join(",");
  const args = [
    ...["--name", m.name, "--data-dir", m.dataDir],
    ...["--listen-client-urls", client, "--advertise-client-urls", client],
    ...["--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer],
    ...["--initial-cluster", initialCluster, "--initial-cluster-state", "new"],
    ...["--initial-cluster-token", plan.token],
    ...["--heartbeat-interval", String(options.heartbeatMs ?? 50)],
    ...["--election-timeout", String(options.electionMs ?? 500)],
    ...["--logger", "zap", "--log-outputs", "stderr", "--log-level", "warn"],
  ];
  if (options.tls) {
    args.push("--cert-file", options.tls.cert, "--key-file", options.tls.key);
    if (options.tls.client) args.push("--client-cert-auth", "--trusted-ca-file", options.tls.ca);
  }
  return args;
}

/** Starts member `m` through the wrapper and records its PID. */
async function spawnMember(plan: Plan, m: Member): Promise<void> {
  const args = [
    ...["-c", WRAPPER, "idalloc-etcd", String(process.pid), plan.base],
    ...[`${plan.base}/${m.name}.log`, plan.binary, ...memberArgs(plan, m)],
  ];
  const stdout = await new Promise<string>((resolve, reject) => {
    execFile("/bin/sh", args, (err, out) => (err ? reject(err) : resolve(out)));
  }).catch((err) => {
    throw new Error(`could not start etcd member ${m.name}`, { cause: err });
  });
  const pid = Number(stdout.trim());
  if (!Number.isSafeInteger(pid) || pid <= 0) {
    throw new Error(`could not start etcd member ${m.name}: wrapper printed '${stdout.trim()}'`);
  }
  m.pid = pid;
}

/** Waits until every member of `list` answers healthy; throws with its log if one exits. */
async function waitHealthy(plan: Plan, list: readonly Member[], timeoutMs = 20_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (const m of list) {
    while (!(await healthy(m.clientPort, plan.options.tls))) {
      if (m.pid === undefined || !alive(m.pid)) {
        const log = await readFile(`${plan.base}/${m.name}.log`, "utf8").catch(() => "");
        throw new Error(`etcd member ${m.name} exited:\n${log.slice(-2000)}`);
      }
      if (Date.now() > deadline) throw new Error(`etcd member ${m.name} not healthy in time`);
      await delay(25);
    }
  }
}

/** Signals member `m` and waits until it is gone (SIGKILL after 5 s). */
async function stopMember(m: Member, signal: StopSignal): Promise<void> {
  const pid = m.pid;
  if (pid === undefined) return;
  killQuietly(pid, signal);
  const deadline = Date.now() + 5000;
  while (alive(pid)) {
    if (Date.now() > deadline) killQuietly(pid, "SIGKILL");
    await delay(10);
  }
  m.pid = undefined;
}

/** The signals this module sends. */
type StopSignal = "SIGKILL" | "SIGTERM";

function killQuietly(pid: number, signal: StopSignal): void {
  try {
    process.kill(pid, signal);
  } catch {
    // already gone
  }
}

/** Starts killed member `m` again on its ports and data dir. */
async function restartMember(plan: Plan, m: Member): Promise<void> {
  if (m.pid !== undefined) throw new Error(`member ${m.name} is running`);
  // Its ports are fixed (clients and peers know them); if another process holds one for a
  // moment, wait and try again rather than fail the run.
  for (let attempt = 1;; attempt++) {
    await spawnMember(plan, m);
    try {
      await waitHealthy(plan, [m]);
      return;
    } catch (err) {
      if (attempt >= 5 || !String(err).includes("address already in use")) throw err;
      m.pid = undefined;
      await delay(500 * attempt);
    }
  }
}

/** Index of the leader every live member agrees on, once it answers healthy; waits up to 20 s. */
async function findLeader(plan: Plan): Promise<number> {
  const deadline = Date.now() + 20_000;
  while (Date.now() < deadline) {
    const ids = new Map<string, number>();
    let leader: string | undefined;
    for (const [i, m] of plan.members.entries()) {
      if (m.pid === undefined) continue;
      try {
        const s = await gateway<{ header: { member_id: string }; leader?: string }>(
          m.clientPort,
          "/v3/maintenance/status",
          {},
        );
        ids.set(s.header.member_id, i);
        if (s.leader && s.leader !== "0") leader ??= s.leader;
      } catch {
        // member not answering; ask the others
      }
    }
    if (
      leader !== undefined && ids.has(leader) &&
      (await healthy(plan.members[ids.get(leader)!].clientPort, plan.options.tls))
    ) {
      return ids.get(leader)!;
    }
    await delay(50);
  }
  throw new Error("no etcd leader");
}

/** Compacts up to `revision` (0: the current one) through the member at `port`. */
async function compactStore(port: number, revision: number): Promise<number> {
  let rev = revision;
  if (rev === 0) {
    const r = await gateway<{ header: { revision: string } }>(port, "/v3/kv/range", {
      key: btoa("\0"),
      count_only: true,
    });
    rev = Number(r.header.revision);
  }
  await gateway(port, "/v3/kv/compaction", { revision: String(rev), physical: true }, 5000);
  return rev;
}

/** The handle of a started cluster; closing it gives `slot` back. */
function clusterHandle(plan: Plan, slot: Slot): EtcdCluster {
  const { members } = plan;
  let closed = false;
  const close = async (): Promise<void> => {
    if (closed) return;
    closed = true;
    await Promise.all(members.map((m) => stopMember(m, "SIGKILL")));
    slot.release();
    await rm(plan.base, { recursive: true, force: true }).catch(() => {});
  };
  return {
    endpoints: members.map((m) => `${plan.scheme}://127.0.0.1:${m.clientPort}`),
    names: members.map((m) => m.name),
    kill: (index) => stopMember(members[index], "SIGKILL"),
    restart: (index) => restartMember(plan, members[index]),
    running(index: number): boolean {
      const pid = members[index].pid;
      return pid !== undefined && alive(pid);
    },
    leader: () => findLeader(plan),
    compact: (revision = 0) =>
      compactStore(members.filter((m) => m.pid !== undefined)[0].clientPort, revision),
    close,
    stopSync(): void {
      if (closed) return;
      closed = true;
      for (const m of members) if (m.pid !== undefined) killQuietly(m.pid, "SIGKILL");
      slot.release();
      try {
        rmSync(plan.base, { recursive: true, force: true });
      } catch {
        // etcd may still hold files for a moment; the watchdog removes the dir
      }
    },
    [Symbol.asyncDispose]: close,
  };
}

/**
 * Starts a private etcd cluster on loopback and waits until every member is healthy. Under the
 * test launcher it first waits for one of the run's etcd slots (see the `slot` option).
 */
export async function startEtcd(
  options: StartEtcdOptions = {},
  attempt = 1,
): Promise<EtcdCluster> {
  const slot = options.slot === false
    ? { release() {}, [Symbol.dispose]() {} }
    : await acquireSlot("etcd", { limit: ETCD_SLOTS });
  let plan: Plan;
  try {
    plan = await planCluster(options);
  } catch (err) {
    slot.release();
    throw err;
  }
  const cluster = clusterHandle(plan, slot);
  try {
    await Promise.all(plan.members.map((m) => spawnMember(plan, m)));
    await waitHealthy(plan, plan.members);
  } catch (err) {
    await cluster.close();
    // Another test process may still bind a picked port first: pick fresh ports and start again.
    if (attempt < 3 && String(err).includes("address already in use")) {
      return startEtcd(options, attempt + 1);
    }
    throw err;
  }
  return cluster;
}

function refused(what: string): Promise<never> {
  return Promise.reject(
    new Error(
      `${what} on the test run's shared etcd: every test process uses it; ` +
        "start a private one with startEtcd()",
    ),
  );
}

/**
 * A handle on a running single-member etcd that someone else owns (the test launcher's, or a
 * shared kube-apiserver's): `compact` works, `close` only lets go of it, and `kill`/`restart`
 * reject (start a private etcd for those).
 */
export function attachEtcd(endpoint: string): EtcdCluster {
  const url = new URL(endpoint);
  if (url.protocol !== "http:" || !url.port) {
    throw new EtcdTestServerError(`not a plain-text etcd client URL with a port: '${endpoint}'`);
  }
  const port = Number(url.port);
  return {
    endpoints: [`http://${url.host}`],
    names: ["m0"],
    kill: () => refused("kill()"),
    restart: () => refused("restart()"),
    leader: () => Promise.resolve(0),
    running: () => true,
    compact: (revision = 0) => compactStore(port, revision),
    close: () => Promise.resolve(),
    stopSync() {},
    [Symbol.asyncDispose]: () => Promise.resolve(),
  };
}

/**
 * The test run's shared etcd named by {@linkcode ETCD_TEST_SERVER_ENV} (set by the test
 * launcher), or `undefined` when the variable is unset. Throws {@linkcode EtcdTestServerError}
 * when it names no usable URL.
 */
export function envEtcd(): EtcdCluster | undefined {
  const value = process.env[ETCD_TEST_SERVER_ENV];
  if (!value) return undefined;
  try {
    return attachEtcd(value);
  } catch (err) {
    if (err instanceof EtcdTestServerError) throw err;
    throw new EtcdTestServerError(`${ETCD_TEST_SERVER_ENV}='${value}' is no URL`, { cause: err });
  }
}
