/**
 * A private Kubernetes API server for tests, the nemesis suite and benchmarks: a private etcd
 * (`startEtcd`) and `kube-apiserver` v1.20 behind it, on free loopback ports, in a temporary dir,
 * with token auth (an admin, a user with no rights, a user who may only read
 * `ciliumidentities.cilium.io`), RBAC, service-account keys, a client CA (to mint client
 * certificates), and the API server's own self-signed TLS. Both processes are started detached
 * through etcd's wrapper (a watchdog kills them if the test process dies) and stopped by PID.
 *
 * The binary is `$KUBE_APISERVER`, else `~/.cache/idalloc-kube-apiserver/bin/kube-apiserver` (what
 * `bash .ci/kube-apiserver.sh` builds). Without it the tests skip loudly
 * ({@linkcode kubeApiserverUnavailable}), unless `CI` is set: then they fail.
 *
 * One server per test run: {@linkcode sharedKubeApiServer} attaches to the test launcher's server
 * (`./launcher.ts`, named by `IDALLOC_KUBE_TEST_SERVER`: `deno task test` sets it) and starts a
 * private one only when run alone. Servers a test starts itself ({@linkcode startKubeApiServer}:
 * to kill, restart or pause them, or with other flags) wait for one of the run's
 * {@linkcode KUBE_APISERVER_SLOTS} slots.
 *
 * Isolation: {@linkcode KubeTestCluster.installIdentityCrd} installs a copy of Cilium's
 * `CiliumIdentity` CRD under a fresh random group, so that fixtures sharing one server do not see
 * each other's identities.
 *
 * @example
 * ```ts ignore
 * // ignored: starts etcd and kube-apiserver; tests/backends/k8s/client.test.ts runs this for real.
 * await using cluster = await startKubeApiServer();
 * const identities = await cluster.installIdentityCrd();
 * await using client = await cluster.client("admin");
 * await client.create(identities, { metadata: { name: "7" }, "security-labels": { "k8s:a": "b" } });
 * ```
 * @module
 */
import { execFile } from "node:child_process";
import { generateKeyPairSync, randomBytes } from "node:crypto";
import { existsSync, readFileSync, rmSync, statSync } from "node:fs";
import { copyFile, mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { homedir, tmpdir } from "node:os";
import { join } from "node:path";
import process from "node:process";
import {
  attachEtcd,
  type EtcdCluster,
  freePort,
  startEtcd,
  WRAPPER,
} from "../../etcd/testing/cluster.ts";
import { alive } from "../../../testing/process_alive.ts";
import { acquireSlot, type Slot } from "../../../testing/slots.ts";
import { createKubeClient, type KubeClient, type KubeResourceDescriptor } from "../client.ts";
import { DEFAULT_NAMESPACE } from "../coordination.ts";
import type { KubeConnection } from "../kubeconfig.ts";
import {
  KUBE_TEST_SERVER_ENV,
  KubeTestServerError,
  type KubeTestServerInfo,
  parseKubeTestServerInfo,
} from "./attach.ts";
import {
  CRD_RESOURCE,
  type CrdManifest,
  endpointCrd,
  endpointSliceCrd,
  identityCrd,
  NAMESPACE_RESOURCE,
} from "./crds.ts";

/** The users every test server knows (token auth). */
export type KubeTestUser =
  /** In `system:masters`: may do anything. */
  | "admin"
  /** Authenticated, with no RBAC rights at all. */
  | "nobody"
  /** May `get`, `list` and `watch` `ciliumidentities.cilium.io`, nothing else. */
  | "reader";

/** The kube-apiserver binary: `$KUBE_APISERVER`, else the build script's cache path, if present. */
export function findKubeApiserver(): string | undefined {
  const candidates = [
    process.env.KUBE_APISERVER,
    join(homedir(), ".cache", "idalloc-kube-apiserver", "bin", "kube-apiserver"),
  ];
  for (const path of candidates) {
    if (path && existsSync(path) && statSync(path).isFile()) return path;
  }
  return undefined;
}

/** Cilium's generated CRDs, where a Cilium build left them (`../shared/cilium-node/`). */
export const CILIUM_CRD_DIR = join(homedir(), ".cache", "cilium-node", "crds");

let warned = false;

/**
 * Why the API server tests cannot run here, or `undefined` when they can. Without the binary the
 * tests are skipped with a loud message, unless env `CI` is set: then this returns `undefined`,
 * the tests run, and they fail in {@linkcode startKubeApiServer} saying what is missing.
 */
export function kubeApiserverUnavailable(): string | undefined {
  if (findKubeApiserver() !== undefined) return undefined;
  if (process.env.CI) return undefined;
  const why = "kube-apiserver is not built (no $KUBE_APISERVER, no " +
    "~/.cache/idalloc-kube-apiserver/bin/kube-apiserver; run `bash .ci/kube-apiserver.sh`)";
  if (!warned) {
    warned = true;
    const bar = "!".repeat(100);
    console.error(
      `\n${bar}\n!!! SKIPPING THE KUBERNETES API TESTS: ${why}\n!!! With CI set they fail instead.\n${bar}\n`,
    );
  }
  return why;
}

/** Options of {@linkcode startKubeApiServer}. */
export interface StartKubeApiServerOptions {
  /**
   * Install Cilium's `ciliumidentities`, `ciliumendpoints` and `ciliumendpointslices` CRDs (group
   * `cilium.io`). @default {true}
   */
  readonly ciliumCrds?: boolean;
  /**
   * The API server's watch cache size per resource (`--default-watch-cache-size`): a watch from
   * a version older than the last this-many events of a resource gets `410 Expired`.
   * @default the server's (100)
   */
  readonly watchCacheSize?: number;
  /**
   * Serve watches from the API server's watch cache (its default). Off, every watch reads etcd:
   * compacting etcd ({@linkcode KubeTestCluster.compact}) then makes a watch from an older
   * version fail with `410 Expired`, the way an informer meets it after a long disconnect.
   * @default {true}
   */
  readonly watchCache?: boolean;
  /** Extra `kube-apiserver` flags. */
  readonly extraArgs?: readonly string[];
  /**
   * Start attempts: on a machine loaded far beyond its cores the API server can miss its
   * readiness deadline, and a server every test of a run shares is worth a second try.
   * @default {1}
   */
  readonly attempts?: number;
  /**
   * How long a start (and a restart) may take until `/readyz` answers: the test launcher's
   * server, which a whole run waits for, gets longer on a machine loaded far beyond its cores.
   * @default {60_000}
   */
  readonly readyTimeoutMs?: number;
}

/** An RBAC policy rule. */
export interface RbacRule {
  /** API groups (`""` = core). */
  readonly apiGroups: readonly string[];
  /** Resource plurals. */
  readonly resources: readonly string[];
  /** Verbs. */
  readonly verbs: readonly string[];
}

/** Options of {@linkcode KubeTestCluster.kubeconfig}. */
export interface KubeconfigOptions {
  /** The context's name. @default {"test"} */
  readonly context?: string;
  /** The context's namespace. */
  readonly namespace?: string;
  /**
   * Make the context the kubeconfig's current one. @default {false}: the current context is
   * another one (namespace `other`), so that a reader must honour the context it is given.
   */
  readonly current?: boolean;
  /** Log in with a client certificate for this user (CN) and groups (O) instead of a token. */
  readonly clientCertificate?: { readonly user: string; readonly groups?: readonly string[] };
  /** `insecure-skip-tls-verify: true` and no CA. */
  readonly insecure?: boolean;
  /** Put the CA and client certificate inline (`-data`, base64) instead of as file paths. */
  readonly inline?: boolean;
}

/** A client certificate minted by the cluster's client CA. */
export interface ClientCertificate {
  /** The certificate file. */
  readonly certFile: string;
  /** The key file. */
  readonly keyFile: string;
  /** The certificate, PEM. */
  readonly cert: string;
  /** The key, PEM. */
  readonly key: string;
}

/** A running private API server. */
export interface KubeTestCluster extends AsyncDisposable {
  /** `https://127.0.0.1:<port>`. */
  readonly server: string;
  /** The temporary dir (certificates, kubeconfigs, logs). */
  readonly dir: string;
  /** The CA file that verifies the server's certificate. */
  readonly caFile: string;
  /** The etcd behind it. */
  readonly etcd: EtcdCluster;
  /** The API server's PID (undefined while killed). */
  readonly pid: number | undefined;
  /** How long the start took, etcd included (ms). */
  readonly startMs: number;
  /** The bearer token of `user`. */
  token(user: KubeTestUser): string;
  /** A connection for `user` (token auth, the server's CA). */
  connection(user?: KubeTestUser, namespace?: string): KubeConnection;
  /** A client for `user`; close it (`await using`). */
  client(user?: KubeTestUser, namespace?: string): Promise<KubeClient>;
  /** Writes a kubeconfig for `user` (ignored with a client certificate) and returns its path. */
  kubeconfig(user?: KubeTestUser, options?: KubeconfigOptions): Promise<string>;
  /** Mints a client certificate (CN `user`, O `groups`) signed by the server's client CA. */
  clientCertificate(user: string, groups?: readonly string[]): Promise<ClientCertificate>;
  /** Installs `crd` and waits until it is `Established`; its install time in ms. */
  installCrd(crd: CrdManifest): Promise<number>;
  /**
   * Installs a copy of Cilium's `CiliumIdentity` CRD under `group` (a fresh random one by default)
   * and returns its resource, with `kind`.
   */
  installIdentityCrd(group?: string): Promise<KubeResourceDescriptor>;
  /** Grants `user` the `rules` (a ClusterRole and binding, or a Role in `namespace`). */
  grant(user: string, rules: readonly RbacRule[], namespace?: string): Promise<void>;
  /** Compacts etcd's history up to now (see `watchCache`); the revision compacted at. */
  compact(): Promise<number>;
  /** The API server's resident set size, KiB (0 while killed). */
  rssKiB(): number;
  /** SIGKILLs the API server (etcd stays). */
  kill(): Promise<void>;
  /** Starts a killed API server again on the same port and waits until it is ready. */
  restart(): Promise<void>;
  /**
   * Waits until the running API server answers `/readyz` (after its etcd was restarted, say);
   * throws when it exits or is not ready within `timeoutMs`.
   */
  ready(timeoutMs?: number): Promise<void>;
  /**
   * SIGSTOPs the API server (`true`) or SIGCONTs it (`false`): stopped, it holds its connections
   * and answers nothing, as a stalled process does; continued, it finds what changed meanwhile.
   */
  pause(paused: boolean): void;
  /** Stops the API server and etcd, and removes the dir. */
  close(): Promise<void>;
  /** SIGKILLs the API server and etcd and removes the dir, synchronously (for `exit`). */
  stopSync(): void;
}

/** The resource of Cilium's identities in `group`. */
export function identityResource(group = "cilium.io"): KubeResourceDescriptor {
  return {
    group,
    version: "v2",
    plural: "ciliumidentities",
    namespaced: false,
    kind: "CiliumIdentity",
  };
}

function run(cmd: string, args: readonly string[], cwd: string): Promise<string> {
  return new Promise((resolve, reject) => {
    execFile(
      cmd,
      args,
      { cwd },
      (err, stdout, stderr) =>
        err ? reject(new Error(`${cmd} ${args[0]}: ${stderr || err.message}`)) : resolve(stdout),
    );
  });
}

const delay = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/** P-256 keys: generated in milliseconds, unlike RSA. */
const EC_KEY = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"];

/** Writes a client CA (`client-ca.crt`/`.key`) into `dir`. */
async function makeClientCa(dir: string): Promise<void> {
  await run("openssl", [
    "req",
    "-x509",
    ...EC_KEY,
    "-keyout",
    "client-ca.key",
    "-out",
    "client-ca.crt",
    "-days",
    "2",
    "-subj",
    "/CN=idalloc-test-client-ca",
  ], dir);
}

function rssOf(pid: number | undefined): number {
  if (pid === undefined) return 0;
  try {
    const status = readFileSync(`/proc/${pid}/status`, "utf8");
    return Number(/VmRSS:\s+(\d+)/.exec(status)?.[1] ?? 0);
  } catch {
    return 0;
  }
}

/** Everything one server needs, fixed at start (its port stays across restarts). */
interface Plan {
  readonly binary: string;
  readonly dir: string;
  readonly port: number;
  readonly etcd: EtcdCluster;
  readonly tokens: Readonly<Record<KubeTestUser, string>>;
  readonly options: StartKubeApiServerOptions;
}

function apiserverArgs(plan: Plan): string[] {
  const { dir } = plan;
  return [
    ...["--etcd-servers", plan.etcd.endpoints.join(","), "--etcd-prefix", "/registry"],
    ...["--secure-port", String(plan.port), "--bind-address", "127.0.0.1"],
    ...["--advertise-address", "127.0.0.1", "--cert-dir", join(dir, "certs")],
    ...["--token-auth-file", join(dir, "tokens.csv"), "--authorization-mode", "RBAC"],
    ...["--client-ca-file", join(dir, "client-ca.crt")],
    ...["--service-account-key-file", join(dir, "sa.pub")],
    ...["--service-account-signing-key-file", join(dir, "sa.key")],
    ...["--service-account-issuer", "https://kubernetes.default.svc"],
    ...[
      "--service-cluster-ip-range",
      "10.0.0.0/24",
      "--disable-admission-plugins",
      "ServiceAccount",
    ],
    ...(plan.options.watchCacheSize !== undefined
      ? ["--default-watch-cache-size", String(plan.options.watchCacheSize)]
      : []),
    ...(plan.options.watchCache === false ? ["--watch-cache=false"] : []),
    ...(plan.options.extraArgs ?? []),
  ];
}

/** Starts the API server through etcd's detaching wrapper; its PID. */
async function spawnApiserver(plan: Plan): Promise<number> {
  const stdout = await run("/bin/sh", [
    "-c",
    WRAPPER,
    "idalloc-kube-apiserver",
    String(process.pid),
    plan.dir,
    join(plan.dir, "kube-apiserver.log"),
    plan.binary,
    ...apiserverArgs(plan),
  ], plan.dir);
  const pid = Number(stdout.trim());
  if (!Number.isSafeInteger(pid) || pid <= 0) {
    throw new Error(`could not start kube-apiserver: the wrapper printed '${stdout.trim()}'`);
  }
  return pid;
}

/** Where the readiness probe asks, as whom, and the log to show when the server exits. */
interface Probe {
  readonly port: number;
  readonly adminToken: string;
  readonly log: string;
}

function probeOf(plan: Plan): Probe {
  return {
    port: plan.port,
    adminToken: plan.tokens.admin,
    log: join(plan.dir, "kube-apiserver.log"),
  };
}

/** Waits until `/readyz` answers `ok` (with the admin token); throws with the log if it exits. */
async function waitReady(probe: Probe, pid: number, timeoutMs = 60_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  const https = await import("node:https");
  const agent = new https.Agent({ rejectUnauthorized: false, keepAlive: false });
  try {
    for (;;) {
      const ok = await new Promise<boolean>((resolve) => {
        const req = https.request(`https://127.0.0.1:${probe.port}/readyz`, {
          agent,
          headers: { authorization: `Bearer ${probe.adminToken}` },
          timeout: 1000,
        }, (res) => {
          let body = "";
          res.setEncoding("utf8");
          res.on("data", (c: string) => (body += c));
          res.on("end", () => resolve(res.statusCode === 200 && body.trim() === "ok"));
          res.on("error", () => resolve(false));
        });
        req.on("timeout", () => req.destroy());
        req.on("error", () => resolve(false));
        req.end();
      });
      if (ok) return;
      if (!alive(pid)) {
        const log = await readFile(probe.log, "utf8").catch(() => "");
        throw new Error(`kube-apiserver exited:\n${log.slice(-3000)}`);
      }
      if (Date.now() > deadline) throw new Error(`kube-apiserver not ready in ${timeoutMs} ms`);
      await delay(100);
    }
  } finally {
    agent.destroy();
  }
}

async function stopPid(pid: number | undefined): Promise<void> {
  if (pid === undefined) return;
  try {
    process.kill(pid, "SIGKILL");
  } catch {
    return; // already gone
  }
  while (alive(pid)) await delay(10);
}

/** The temp dir with tokens, keys and the client CA; the tokens. */
async function prepareDir(): Promise<{ dir: string; tokens: Record<KubeTestUser, string> }> {
  const dir = await mkdtemp(join(tmpdir(), "idalloc-kube-"));
  const tokens: Record<KubeTestUser, string> = {
    admin: randomBytes(16).toString("hex"),
    nobody: randomBytes(16).toString("hex"),
    reader: randomBytes(16).toString("hex"),
  };
  await writeFile(
    join(dir, "tokens.csv"),
    `${tokens.admin},admin,admin,system:masters\n${tokens.nobody},nobody,nobody\n` +
      `${tokens.reader},reader,reader\n`,
  );
  const { publicKey, privateKey } = generateKeyPairSync("ec", { namedCurve: "prime256v1" });
  await writeFile(join(dir, "sa.pub"), publicKey.export({ type: "spki", format: "pem" }));
  await writeFile(join(dir, "sa.key"), privateKey.export({ type: "pkcs8", format: "pem" }));
  await makeClientCa(dir);
  return { dir, tokens };
}

function kubeconfigYaml(
  cluster: { server: string; caFile: string; ca: string },
  user: { token?: string; cert?: ClientCertificate },
  options: KubeconfigOptions,
): string {
  const b64 = (text: string) => btoa(text);
  const context = options.context ?? "test";
  const clusterFields = options.insecure
    ? `    insecure-skip-tls-verify: true\n`
    : options.inline
    ? `    certificate-authority-data: ${b64(cluster.ca)}\n`
    : `    certificate-authority: ${JSON.stringify(cluster.caFile)}\n`;
  const userFields = user.cert
    ? options.inline
      ? `    client-certificate-data: ${b64(user.cert.cert)}\n` +
        `    client-key-data: ${b64(user.cert.key)}\n`
      : `    client-certificate: ${JSON.stringify(user.cert.certFile)}\n` +
        `    client-key: ${JSON.stringify(user.cert.keyFile)}\n`
    : `    token: ${JSON.stringify(user.token)}\n`;
  return `apiVersion: v1
kind: Config
clusters:
- name: test-cluster
  cluster:
    server: ${cluster.server}
${clusterFields}users:
- name: test-user
  user:
${userFields}contexts:
- name: other
  context:
    cluster: test-cluster
    user: test-user
    namespace: other
- name: ${context}
  context:
    cluster: test-cluster
    user: test-user
${options.namespace ? `    namespace: ${options.namespace}\n` : ""}current-context: ${
    options.current ? context : "other"
  }
`;
}

/**
 * At most this many private API servers (each with its etcd) at once in a test launcher's run:
 * a start waits for a free slot (see `src/testing/slots.ts`). The run's shared server is not one.
 */
export const KUBE_APISERVER_SLOTS = 2;

/** Cilium's CRDs (group `cilium.io`) a server gets unless `ciliumCrds: false`. */
function ciliumCrds(): CrdManifest[] {
  return [identityCrd(), endpointCrd(), endpointSliceCrd()];
}

/**
 * Starts a private etcd and kube-apiserver, waits until it is ready, installs Cilium's CRDs (see
 * the options) and the `reader` user's role. Under the test launcher it first waits for one of
 * the run's {@linkcode KUBE_APISERVER_SLOTS} slots. Throws when the binary is missing.
 */
export async function startKubeApiServer(
  options: StartKubeApiServerOptions = {},
): Promise<KubeTestCluster> {
  const binary = findKubeApiserver();
  if (binary === undefined) {
    throw new Error(
      "kube-apiserver is not built: set $KUBE_APISERVER or run `bash .ci/kube-apiserver.sh`",
    );
  }
  for (let attempt = 1;; attempt++) {
    const slot = await acquireSlot("kube-apiserver", { limit: KUBE_APISERVER_SLOTS });
    try {
      return await startWithin(binary, options, slot);
    } catch (err) {
      slot.release();
      if (attempt >= (options.attempts ?? 1)) throw err;
      console.error(`kube-apiserver did not start, trying once more: ${err}`);
    }
  }
}

/** Starts the server of {@linkcode startKubeApiServer} holding `slot` (released at close). */
async function startWithin(
  binary: string,
  options: StartKubeApiServerOptions,
  slot: Slot,
): Promise<KubeTestCluster> {
  const started = performance.now();
  const etcd = await startEtcd({ slot: false });
  let prepared: Awaited<ReturnType<typeof prepareDir>> | undefined;
  try {
    prepared = await prepareDir();
    const plan: Plan = {
      binary,
      dir: prepared.dir,
      port: await freePort(),
      etcd,
      tokens: prepared.tokens,
      options,
    };
    const handle = await launch(plan, started, slot);
    try {
      if (options.ciliumCrds !== false) {
        for (const crd of ciliumCrds()) await handle.installCrd(crd);
      }
      // idalloc's default coordination namespace, as a cluster's operator creates it once (its
      // absence is `NamespaceNotFoundError`): a user trying the CLI or the library with no
      // `--namespace` finds it here as on a prepared cluster.
      await createNamespace(handle, DEFAULT_NAMESPACE);
      await handle.grant("reader", [{
        apiGroups: ["cilium.io"],
        resources: ["ciliumidentities"],
        verbs: ["get", "list", "watch"],
      }]);
    } catch (err) {
      await handle.close();
      throw err;
    }
    return handle;
  } catch (err) {
    await etcd.close();
    if (prepared) await rm(prepared.dir, { recursive: true, force: true }).catch(() => {});
    throw err;
  }
}

/** Creates namespace `name` unless it exists. */
async function createNamespace(cluster: KubeTestCluster, name: string): Promise<void> {
  await using client = await cluster.client("admin");
  try {
    await client.create(NAMESPACE_RESOURCE, { metadata: { name } });
  } catch (err) {
    if (!(err instanceof Error && "reason" in err && err.reason === "AlreadyExists")) throw err;
  }
}

/** Mints client certificate number `n` (CN `user`, O `groups`) with the client CA in `dir`. */
async function mintClientCertificate(
  dir: string,
  n: number,
  user: string,
  groups: readonly string[],
): Promise<ClientCertificate> {
  const subject = `${groups.map((g) => `/O=${g}`).join("")}/CN=${user}`;
  await run("openssl", [
    "req",
    ...EC_KEY,
    ...["-keyout", `client-${n}.key`, "-out", `client-${n}.csr`, "-subj", subject],
  ], dir);
  await writeFile(join(dir, `client-${n}.ext`), "extendedKeyUsage=clientAuth\n");
  await run("openssl", [
    ...["x509", "-req", "-in", `client-${n}.csr`, "-CA", "client-ca.crt"],
    ...["-CAkey", "client-ca.key", "-CAcreateserial", "-days", "2", "-out", `client-${n}.crt`],
    ...["-extfile", `client-${n}.ext`],
  ], dir);
  const certFile = join(dir, `client-${n}.crt`);
  const keyFile = join(dir, `client-${n}.key`);
  return {
    certFile,
    keyFile,
    cert: await readFile(certFile, "utf8"),
    key: await readFile(keyFile, "utf8"),
  };
}

/** Starts the API server of `plan` and waits until it is ready; its PID. */
async function spawnReady(plan: Plan): Promise<number> {
  const pid = await spawnApiserver(plan);
  try {
    await waitReady(probeOf(plan), pid, plan.options.readyTimeoutMs);
  } catch (err) {
    await stopPid(pid);
    throw err;
  }
  return pid;
}

/** SIGKILLs the API server (if running) and etcd, and removes the dir, synchronously. */
function stopNow(plan: Plan, pid: number | undefined): void {
  if (pid !== undefined) {
    try {
      process.kill(pid, "SIGKILL");
    } catch {
      // already gone
    }
  }
  plan.etcd.stopSync();
  try {
    rmSync(plan.dir, { recursive: true, force: true });
  } catch {
    // the watchdog removes it
  }
}

/** Runs `body` with a client of `connection`, closed after. */
async function withClient<T>(
  connection: KubeConnection,
  body: (client: KubeClient) => Promise<T>,
): Promise<T> {
  const client = await createKubeClient(connection);
  try {
    return await body(client);
  } finally {
    await client.close();
  }
}

/** `pid` of an API server that runs; throws while it is killed. */
function running(pid: number | undefined): number {
  if (pid === undefined) throw new Error("kube-apiserver is not running");
  return pid;
}

/** What every handle on a running server knows, whether it started the server or not. */
interface Endpoint {
  readonly server: string;
  readonly caFile: string;
  readonly ca: string;
  /** Where this handle writes kubeconfigs and certificates (holds the client CA's files). */
  readonly dir: string;
  readonly etcd: EtcdCluster;
  readonly tokens: Readonly<Record<KubeTestUser, string>>;
  readonly startMs: number;
}

/** What differs between a server's owner and a process attached to it. */
interface Lifecycle {
  pid(): number | undefined;
  kill(): Promise<void>;
  restart(): Promise<void>;
  ready(timeoutMs: number): Promise<void>;
  pause(paused: boolean): void;
  close(): Promise<void>;
  stopSync(): void;
}

/** A handle on the server of `endpoint`, run by `life`. */
function handleOf(endpoint: Endpoint, life: Lifecycle): KubeTestCluster {
  const { server, caFile, ca, dir, tokens } = endpoint;
  const connection = (user: KubeTestUser = "admin", namespace = "default"): KubeConnection => ({
    server,
    namespace,
    ca,
    token: tokens[user],
    source: `test API server (user ${user})`,
  });
  const admin = <T>(body: (client: KubeClient) => Promise<T>) => withClient(connection(), body);
  let certs = 0;
  const cluster: KubeTestCluster = {
    server,
    dir,
    caFile,
    etcd: endpoint.etcd,
    get pid() {
      return life.pid();
    },
    startMs: endpoint.startMs,
    token: (user) => tokens[user],
    connection,
    client: (user = "admin", namespace = "default") =>
      createKubeClient(connection(user, namespace)),
    clientCertificate: (user, groups = []) => mintClientCertificate(dir, ++certs, user, groups),
    async kubeconfig(user = "admin", options = {}) {
      const c = options.clientCertificate;
      const cert = c ? await cluster.clientCertificate(c.user, c.groups) : undefined;
      const path = join(dir, `kubeconfig-${randomBytes(4).toString("hex")}.yaml`);
      await writeFile(
        path,
        kubeconfigYaml({ server, caFile, ca }, { token: tokens[user], cert }, options),
      );
      return path;
    },
    installCrd: (crd) => admin((client) => installCrd(client, crd)),
    async installIdentityCrd(group = `t${randomBytes(6).toString("hex")}.idalloc.test`) {
      await cluster.installCrd(identityCrd(group));
      return identityResource(group);
    },
    grant: (user, rules, namespace) => admin((client) => grant(client, user, rules, namespace)),
    compact: () => endpoint.etcd.compact(),
    rssKiB: () => rssOf(life.pid()),
    kill: () => life.kill(),
    restart: () => life.restart(),
    ready: (timeoutMs = 60_000) => life.ready(timeoutMs),
    pause: (paused) => life.pause(paused),
    close: () => life.close(),
    stopSync: () => life.stopSync(),
    [Symbol.asyncDispose]: () => life.close(),
  };
  return cluster;
}

async function launch(plan: Plan, started: number, slot: Slot): Promise<KubeTestCluster> {
  let pid: number | undefined = await spawnReady(plan);
  const startMs = performance.now() - started;
  // kube-apiserver writes its self-signed certificate and the CA that signed it into one file.
  const caFile = join(plan.dir, "certs", "apiserver.crt");
  let closed = false;
  return handleOf({
    server: `https://127.0.0.1:${plan.port}`,
    caFile,
    ca: await readFile(caFile, "utf8"),
    dir: plan.dir,
    etcd: plan.etcd,
    tokens: plan.tokens,
    startMs,
  }, {
    pid: () => pid,
    async kill() {
      await stopPid(pid);
      pid = undefined;
    },
    async restart() {
      if (pid !== undefined) throw new Error("kube-apiserver is running");
      pid = await spawnReady(plan);
    },
    ready: (timeoutMs) => waitReady(probeOf(plan), running(pid), timeoutMs),
    pause: (paused) => void process.kill(running(pid), paused ? "SIGSTOP" : "SIGCONT"),
    async close() {
      if (closed) return;
      closed = true;
      await stopPid(pid);
      pid = undefined;
      await plan.etcd.close();
      slot.release();
      await rm(plan.dir, { recursive: true, force: true }).catch(() => {});
    },
    stopSync() {
      if (closed) return;
      closed = true;
      stopNow(plan, pid);
      slot.release();
    },
  });
}

/** `kill`, `restart` or `pause` asked of the test run's shared API server, which others use. */
export class SharedKubeApiServerError extends Error {
  override readonly name = "SharedKubeApiServerError";
  constructor(what: string) {
    super(
      `${what} on the test run's shared kube-apiserver: every test process uses it; a test that ` +
        "kills, restarts or pauses its server starts its own with startKubeApiServer()",
    );
  }
}

/**
 * A handle on the running server `info` describes (the test launcher's): everything but `kill`,
 * `restart` and `pause` (which throw {@linkcode SharedKubeApiServerError}); `close` removes this
 * handle's own dir (its kubeconfigs and certificates) and leaves the server running.
 */
export async function attachKubeApiServer(info: KubeTestServerInfo): Promise<KubeTestCluster> {
  let dir: string;
  let ca: string;
  try {
    ca = await readFile(info.caFile, "utf8");
    // Below the server's dir, so that it goes when the server stops, whatever becomes of us.
    dir = await mkdtemp(join(info.dir, "attached-"));
    await copyFile(info.clientCa.cert, join(dir, "client-ca.crt"));
    await copyFile(info.clientCa.key, join(dir, "client-ca.key"));
  } catch (err) {
    throw new KubeTestServerError(`the test kube-apiserver at ${info.server} is gone`, {
      cause: err,
    });
  }
  const probe = { port: Number(new URL(info.server).port), adminToken: info.tokens.admin };
  let closed = false;
  const refuse = (what: string) => Promise.reject(new SharedKubeApiServerError(what));
  return handleOf({
    server: info.server,
    caFile: info.caFile,
    ca,
    dir,
    etcd: attachEtcd(info.etcd),
    tokens: info.tokens,
    startMs: info.startMs,
  }, {
    pid: () => info.pid,
    kill: () => refuse("kill()"),
    restart: () => refuse("restart()"),
    ready: (timeoutMs) =>
      waitReady({ ...probe, log: join(info.dir, "kube-apiserver.log") }, info.pid, timeoutMs),
    pause(paused) {
      throw new SharedKubeApiServerError(`pause(${paused})`);
    },
    async close() {
      if (closed) return;
      closed = true;
      await rm(dir, { recursive: true, force: true }).catch(() => {});
    },
    stopSync() {
      if (closed) return;
      closed = true;
      try {
        rmSync(dir, { recursive: true, force: true });
      } catch {
        // the server's dir goes with it
      }
    },
  });
}

/**
 * The test run's shared server named by {@linkcode KUBE_TEST_SERVER_ENV}, or `undefined` when the
 * variable is unset; throws {@linkcode KubeTestServerError} when the file is unreadable or wrong.
 */
export async function envKubeTestServer(): Promise<KubeTestServerInfo | undefined> {
  const path = process.env[KUBE_TEST_SERVER_ENV];
  if (!path) return undefined;
  let text: string;
  try {
    text = await readFile(path, "utf8");
  } catch (err) {
    throw new KubeTestServerError(`${KUBE_TEST_SERVER_ENV}=${path}: cannot read the file`, {
      cause: err,
    });
  }
  return parseKubeTestServerInfo(text, `${KUBE_TEST_SERVER_ENV}=${path}`);
}

let shared: Promise<KubeTestCluster> | undefined;

/**
 * One API server for every test of this process (Cilium's CRDs installed). Under the test
 * launcher (`deno task test`: {@linkcode KUBE_TEST_SERVER_ENV} set) it is the run's one server,
 * attached to (see {@linkcode attachKubeApiServer}); otherwise a private one, started on first use
 * and stopped when the process exits. Tests isolate themselves on it with
 * {@linkcode KubeTestCluster.installIdentityCrd} and namespaces of their own; a test that kills,
 * restarts or pauses the server, or needs other flags, starts its own.
 */
export function sharedKubeApiServer(): Promise<KubeTestCluster> {
  shared ??= envKubeTestServer().then((info) =>
    info === undefined ? startKubeApiServer({ attempts: 2 }) : attachKubeApiServer(info)
  ).then((cluster) => {
    process.on("exit", () => cluster.stopSync());
    return cluster;
  });
  return shared;
}

/** Creates `crd` (or finds it) and waits for its `Established` condition; the time taken (ms). */
async function installCrd(client: KubeClient, crd: CrdManifest): Promise<number> {
  const started = performance.now();
  try {
    await client.create(CRD_RESOURCE, crd as unknown as Parameters<KubeClient["create"]>[1]);
  } catch (err) {
    if (!(err instanceof Error && "reason" in err && err.reason === "AlreadyExists")) throw err;
  }
  const name = crd.metadata.name;
  const deadline = Date.now() + 30_000;
  for (;;) {
    const current = await client.get(CRD_RESOURCE, name) as
      | { status?: { conditions?: { type: string; status: string }[] } }
      | undefined;
    const established = current?.status?.conditions?.some((c) =>
      c.type === "Established" && c.status === "True"
    );
    if (established) break;
    if (Date.now() > deadline) throw new Error(`CRD ${name} not Established in 30 s`);
    await delay(20);
  }
  // Established means the API server serves it; its discovery and the handler may lag a moment:
  // wait until a list answers.
  const { group, versions, names, scope } = crd.spec;
  const res = {
    group,
    version: versions[0].name,
    plural: names.plural,
    namespaced: scope === "Namespaced",
  };
  for (;;) {
    try {
      await client.list(res, { limit: 1 });
      break;
    } catch (err) {
      if (!(err instanceof Error && err.name === "ResourceNotInstalledError")) throw err;
      if (Date.now() > deadline) throw new Error(`CRD ${name} not served in 30 s`);
      await delay(20);
    }
  }
  return performance.now() - started;
}

async function grant(
  client: KubeClient,
  user: string,
  rules: readonly RbacRule[],
  namespace: string | undefined,
): Promise<void> {
  const suffix = randomBytes(4).toString("hex");
  const kind = namespace === undefined ? "ClusterRole" : "Role";
  const plural = namespace === undefined ? "clusterroles" : "roles";
  const bindings = namespace === undefined ? "clusterrolebindings" : "rolebindings";
  const rbac = (p: string) => ({
    group: "rbac.authorization.k8s.io",
    version: "v1",
    plural: p,
    namespaced: namespace !== undefined,
  });
  const name = `idalloc-test-${user.replace(/[^a-z0-9-]/gi, "-").toLowerCase()}-${suffix}`;
  const scope = namespace === undefined ? {} : { namespace };
  await client.create(rbac(plural), {
    apiVersion: "rbac.authorization.k8s.io/v1",
    kind,
    metadata: { name },
    rules: rules.map((r) => ({ ...r })),
  }, scope);
  await client.create(rbac(bindings), {
    apiVersion: "rbac.authorization.k8s.io/v1",
    kind: `${kind}Binding`,
    metadata: { name },
    roleRef: { apiGroup: "rbac.authorization.k8s.io", kind, name },
    subjects: [{ apiGroup: "rbac.authorization.k8s.io", kind: "User", name: user }],
  }, scope);
}
