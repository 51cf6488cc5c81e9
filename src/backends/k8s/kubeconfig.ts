/**
 * Where the Kubernetes API server is and how to log in to it, as users configure it: kubeconfig
 * files (their current context or a named one) or the in-cluster service account. Both resolve to
 * one {@linkcode KubeConnection}: the server URL, the TLS material as PEM text, the credentials
 * (a token, a token file, a client certificate or an `exec` credential plugin), the proxy and the
 * default namespace. A kubeconfig is read with a YAML parser (`npm:yaml`), never by hand.
 *
 * Files are found and merged as `kubectl` does: an explicit path must exist; without one,
 * `$KUBECONFIG` (a `:`-separated list; missing files are skipped) else `~/.kube/config`. In a list,
 * the first file to name a cluster, user or context wins, `current-context` comes from the first
 * file that sets it, and each file's relative paths (certificates, token files, an exec plugin's
 * command) are relative to that file's folder.
 *
 * The namespace default follows `kubectl` and client-go: the in-cluster namespace file, else the
 * kubeconfig context's `namespace`, else `default`.
 *
 * @example Reading a kubeconfig's current context
 * ```ts
 * import assert from "node:assert/strict";
 * import { parseKubeconfig } from "./kubeconfig.ts";
 *
 * const text = `
 * apiVersion: v1
 * kind: Config
 * clusters:
 * - name: local
 *   cluster: {server: "https://127.0.0.1:6443", insecure-skip-tls-verify: true}
 * users:
 * - name: admin
 *   user: {token: secret}
 * contexts:
 * - name: dev
 *   context: {cluster: local, user: admin, namespace: team-a}
 * current-context: dev
 * `;
 * const conn = await parseKubeconfig(text, "/home/me/.kube/config");
 * assert.equal(conn.server, "https://127.0.0.1:6443");
 * assert.equal(conn.namespace, "team-a");
 * assert.equal(conn.token, "secret");
 * assert.equal(conn.insecureSkipTlsVerify, true);
 * ```
 *
 * @module
 */
import { readFile } from "node:fs/promises";
import { homedir } from "node:os";
import { dirname, isAbsolute, resolve } from "node:path";
import process from "node:process";
import { parse as parseYaml } from "../../deps/yaml.ts";
import { z } from "../../deps/zod.ts";
import { errorMessage, InvalidOptionsError } from "../../errors.ts";
import { authProviderToken } from "./kubeconfig_auth_provider.ts";

/** A resolved connection to one Kubernetes API server: what the client needs, nothing more. */
export interface KubeConnection {
  /** The API server's URL, `https://host:port` (no trailing slash). */
  readonly server: string;
  /** The namespace of namespaced resources when a call names none. */
  readonly namespace: string;
  /**
   * The CA certificate(s) that sign the server's certificate, PEM. When set, only these are
   * trusted (as client-go does); when absent, the system's roots.
   */
  readonly ca?: string;
  /** The client certificate (mutual TLS), PEM. */
  readonly cert?: string;
  /** The client certificate's private key, PEM. */
  readonly key?: string;
  /** A bearer token. */
  readonly token?: string;
  /** A file holding the bearer token, re-read while the client runs (a rotated service-account token). */
  readonly tokenFile?: string;
  /** An `exec` credential plugin that prints the token or client certificate (EKS, GKE, AKS). */
  readonly exec?: ExecPlugin;
  /** Skip the verification of the server's certificate (kubeconfig `insecure-skip-tls-verify`). */
  readonly insecureSkipTlsVerify?: boolean;
  /** The name to verify the server's certificate against, when not the URL's host. */
  readonly tlsServerName?: string;
  /** A proxy to reach the server through: `http://`, `https://` (CONNECT) or `socks5://`. */
  readonly proxyUrl?: string;
  /** Where this came from, for messages: `kubeconfig /path (context dev, user admin)`, `in-cluster`. */
  readonly source: string;
}

/** An `exec` credential plugin of a kubeconfig user (client-go's `ExecConfig`), resolved. */
export interface ExecPlugin {
  /** The program: a name looked up on `PATH`, or a path (relative ones resolved against the kubeconfig's folder). */
  readonly command: string;
  /** Its arguments. */
  readonly args: readonly string[];
  /** Variables added to its environment. */
  readonly env: Readonly<Record<string, string>>;
  /** The ExecCredential version it speaks: `client.authentication.k8s.io/v1` or `/v1beta1`. */
  readonly apiVersion: ExecApiVersion;
  /** Shown when the program is not found (how to install it). */
  readonly installHint?: string;
  /** Whether it needs standard input (`Always` fails here: the client never has a terminal to give). */
  readonly interactiveMode: "Never" | "IfAvailable" | "Always";
  /** The cluster, passed as `spec.cluster` in `KUBERNETES_EXEC_INFO` (`provideClusterInfo: true`). */
  readonly cluster?: ExecClusterInfo;
}

/** The ExecCredential versions client-go still speaks. */
export type ExecApiVersion =
  | "client.authentication.k8s.io/v1"
  | "client.authentication.k8s.io/v1beta1";

/** `spec.cluster` of an ExecCredential (client-go's `clientauthentication.Cluster`). */
export interface ExecClusterInfo {
  /** The server URL. */
  readonly server: string;
  /** `tls-server-name`. */
  readonly "tls-server-name"?: string;
  /** `insecure-skip-tls-verify`. */
  readonly "insecure-skip-tls-verify"?: boolean;
  /** The CA, base64 of the PEM. */
  readonly "certificate-authority-data"?: string;
  /** `proxy-url`. */
  readonly "proxy-url"?: string;
  /** The cluster's `extensions` entry `client.authentication.k8s.io/exec`. */
  readonly config?: unknown;
}

/** The standard in-cluster files and variables; tests point them elsewhere. */
export interface InClusterPaths {
  /** The service-account token. @default {"/var/run/secrets/kubernetes.io/serviceaccount/token"} */
  readonly tokenFile?: string;
  /** The cluster CA. @default {"/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"} */
  readonly caFile?: string;
  /** The pod's namespace. @default {"/var/run/secrets/kubernetes.io/serviceaccount/namespace"} */
  readonly namespaceFile?: string;
  /** The environment to read `KUBERNETES_SERVICE_HOST`/`_PORT` from. @default {process.env} */
  readonly env?: Readonly<Record<string, string | undefined>>;
}

/** The service-account folder every pod gets (client-go's `rest.InClusterConfig`). */
export const SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount";

// Kubeconfig files carry many fields this client has no use for (preferences):
// the schemas name only what it reads and let the rest pass.
const clusterSchema = z.looseObject({
  server: z.string().min(1),
  "certificate-authority": z.string().optional(),
  "certificate-authority-data": z.string().optional(),
  "insecure-skip-tls-verify": z.boolean().optional(),
  "tls-server-name": z.string().optional(),
  "proxy-url": z.string().optional(),
  extensions: z.array(z.looseObject({ name: z.string(), extension: z.unknown() })).nullish(),
});

const execSchema = z.looseObject({
  command: z.string().min(1),
  args: z.array(z.string()).nullish(),
  env: z.array(z.object({ name: z.string().min(1), value: z.string() })).nullish(),
  apiVersion: z.string().min(1),
  installHint: z.string().nullish(),
  provideClusterInfo: z.boolean().nullish(),
  interactiveMode: z.enum(["Never", "IfAvailable", "Always"]).nullish(),
});

const userSchema = z.looseObject({
  token: z.string().optional(),
  tokenFile: z.string().optional(),
  "client-certificate": z.string().optional(),
  "client-certificate-data": z.string().optional(),
  "client-key": z.string().optional(),
  "client-key-data": z.string().optional(),
  username: z.string().optional(),
  password: z.string().optional(),
  exec: execSchema.nullish(),
  "auth-provider": z.looseObject({
    name: z.string(),
    config: z.record(z.string(), z.string()).nullish(),
  }).nullish(),
});

const contextSchema = z.looseObject({
  cluster: z.string(),
  user: z.string().optional(),
  namespace: z.string().optional(),
});

/** A kubeconfig list (`clusters`, `users`, `contexts`); `null` or absent is empty. */
function namedList<T extends z.ZodType>(entry: T) {
  return z.array(entry).nullish().transform((list) => list ?? []);
}

const kubeconfigSchema = z.looseObject({
  clusters: namedList(z.looseObject({ name: z.string(), cluster: clusterSchema })),
  users: namedList(z.looseObject({ name: z.string(), user: userSchema.nullish() })),
  contexts: namedList(z.looseObject({ name: z.string(), context: contextSchema })),
  "current-context": z.string().nullish(),
});

type ClusterEntry = z.infer<typeof clusterSchema>;
type UserEntry = z.infer<typeof userSchema>;
type ContextEntry = z.infer<typeof contextSchema>;

/** An entry with the file it came from (its relative paths are relative to that file's folder). */
interface Sourced<T> {
  readonly entry: T;
  readonly file: string;
}

/** Kubeconfig files merged by kubectl's rules. */
interface MergedKubeconfig {
  readonly clusters: Map<string, Sourced<ClusterEntry>>;
  readonly users: Map<string, Sourced<UserEntry>>;
  readonly contexts: Map<string, Sourced<ContextEntry>>;
  readonly currentContext?: string;
  /** The files read, for messages. */
  readonly files: readonly string[];
}

/**
 * The kubeconfig files `kubectl` would read when given none: `$KUBECONFIG`'s entries (split on
 * `:`, empty and repeated entries dropped), else `~/.kube/config`.
 */
export function defaultKubeconfigPaths(
  env: Readonly<Record<string, string | undefined>> = process.env,
): string[] {
  const listed = [...new Set((env.KUBECONFIG ?? "").split(":").filter((p) => p !== ""))];
  return listed.length > 0 ? listed : [resolve(homedir(), ".kube", "config")];
}

/** The first of {@linkcode defaultKubeconfigPaths}: where `kubectl config set` would write. */
export function defaultKubeconfigPath(
  env: Readonly<Record<string, string | undefined>> = process.env,
): string {
  return defaultKubeconfigPaths(env)[0];
}

async function readText(path: string, what: string, where: string): Promise<string> {
  try {
    return await readFile(path, "utf8");
  } catch (err) {
    throw new InvalidOptionsError(`${where}: cannot read ${what} ${path} (${errorMessage(err)})`, {
      cause: err,
    });
  }
}

function fromBase64(data: string, what: string, where: string): string {
  try {
    return new TextDecoder().decode(
      Uint8Array.from(atob(data.replace(/\s+/g, "")), (c) => c.charCodeAt(0)),
    );
  } catch (err) {
    throw new InvalidOptionsError(`${where}: ${what} is not base64`, { cause: err });
  }
}

/** `path` made absolute against the folder of the kubeconfig `file` that names it. */
function relativeTo(file: string, path: string): string {
  return isAbsolute(path) ? path : resolve(dirname(resolve(file)), path);
}

/**
 * PEM text from a kubeconfig's `<field>-data` (base64) or `<field>` (a file path, relative to
 * the kubeconfig's folder), or `undefined` when neither is set.
 */
async function pemOf(
  source: Sourced<Record<string, unknown>>,
  field: string,
  where: string,
): Promise<string | undefined> {
  const data = source.entry[`${field}-data`];
  if (typeof data === "string" && data !== "") return fromBase64(data, `${field}-data`, where);
  const file = source.entry[field];
  if (typeof file === "string" && file !== "") {
    return await readText(relativeTo(source.file, file), field, where);
  }
  return undefined;
}

function pick<T>(
  map: ReadonlyMap<string, Sourced<T>>,
  name: string,
  what: string,
  where: string,
): Sourced<T> {
  const found = map.get(name);
  if (found !== undefined) return found;
  const known = [...map.keys()];
  throw new InvalidOptionsError(
    `${where}: no ${what} named '${name}'` +
      (known.length > 0 ? ` (it has ${known.map((n) => `'${n}'`).join(", ")})` : ""),
  );
}

/** One kubeconfig file's text, parsed and checked. */
function parseFile(text: string, path: string): z.infer<typeof kubeconfigSchema> {
  const where = `kubeconfig ${path}`;
  let raw: unknown;
  try {
    raw = parseYaml(text);
  } catch (err) {
    throw new InvalidOptionsError(`${where} is not valid YAML (${errorMessage(err)})`, {
      cause: err,
    });
  }
  const parsed = kubeconfigSchema.safeParse(raw ?? {});
  if (!parsed.success) {
    const issue = parsed.error.issues[0];
    throw new InvalidOptionsError(
      `${where} is not a kubeconfig: '${issue.path.join(".")}' ${issue.message}`,
      { cause: parsed.error },
    );
  }
  return parsed.data;
}

/** Merges parsed files, earliest first, by kubectl's rules (see the module doc). */
function merge(files: readonly { path: string; config: z.infer<typeof kubeconfigSchema> }[]) {
  const clusters = new Map<string, Sourced<ClusterEntry>>();
  const users = new Map<string, Sourced<UserEntry>>();
  const contexts = new Map<string, Sourced<ContextEntry>>();
  let currentContext: string | undefined;
  for (const { path, config } of files) {
    for (const c of config.clusters) {
      if (!clusters.has(c.name)) clusters.set(c.name, { entry: c.cluster, file: path });
    }
    for (const u of config.users) {
      if (!users.has(u.name)) users.set(u.name, { entry: u.user ?? {}, file: path });
    }
    for (const c of config.contexts) {
      if (!contexts.has(c.name)) contexts.set(c.name, { entry: c.context, file: path });
    }
    const current = config["current-context"];
    if (currentContext === undefined && current) currentContext = current;
  }
  return {
    clusters,
    users,
    contexts,
    ...(currentContext !== undefined && { currentContext }),
    files: files.map((f) => f.path),
  } satisfies MergedKubeconfig;
}

/**
 * Resolves kubeconfig `text` (read from `path`, which anchors relative file names) to a
 * connection: the context named `context`, else the file's `current-context`. Throws
 * {@linkcode InvalidOptionsError} saying what is missing or unsupported.
 */
export async function parseKubeconfig(
  text: string,
  path: string,
  context?: string,
): Promise<KubeConnection> {
  return await resolveContext(merge([{ path, config: parseFile(text, path) }]), context);
}

/**
 * Reads and resolves kubeconfig files (see {@linkcode parseKubeconfig}): the file at `path`, which
 * must exist; without one, kubectl's default: `$KUBECONFIG`'s files merged (missing ones skipped),
 * else `~/.kube/config`.
 */
export async function loadKubeconfig(path?: string, context?: string): Promise<KubeConnection> {
  if (path !== undefined) {
    const text = await readText(path, "the file", `kubeconfig ${path}`);
    return await parseKubeconfig(text, path, context);
  }
  const paths = defaultKubeconfigPaths();
  const files = [];
  for (const file of paths) {
    let text: string;
    try {
      text = await readFile(file, "utf8");
    } catch (err) {
      // kubectl skips a listed file that does not exist; any other failure is the user's to fix.
      if ((err as { code?: string }).code === "ENOENT") continue;
      throw new InvalidOptionsError(
        `kubeconfig ${file}: cannot read the file (${errorMessage(err)})`,
        { cause: err },
      );
    }
    files.push({ path: file, config: parseFile(text, file) });
  }
  if (files.length === 0) {
    throw new InvalidOptionsError(
      `no kubeconfig: ${paths.join(", ")} ${paths.length === 1 ? "does" : "do"} not exist ` +
        "(set KUBECONFIG, or name a kubeconfig file)",
    );
  }
  return await resolveContext(merge(files), context);
}

/** The connection of `context` (else the current one) in merged kubeconfig files. */
async function resolveContext(
  config: MergedKubeconfig,
  context: string | undefined,
): Promise<KubeConnection> {
  const where = `kubeconfig ${config.files.join(":")}`;
  const contextName = context ?? config.currentContext;
  if (contextName === undefined || contextName === "") {
    throw new InvalidOptionsError(`${where} has no current-context: name a context`);
  }
  const ctx = pick(config.contexts, contextName, "context", where).entry;
  const cluster = pick(config.clusters, ctx.cluster, "cluster", where);
  const user: Sourced<UserEntry> = ctx.user === undefined || ctx.user === ""
    ? { entry: {}, file: config.files[0] }
    : pick(config.users, ctx.user, "user", where);
  const whereCtx = `${where} (context ${contextName}${ctx.user ? `, user ${ctx.user}` : ""})`;
  const u = user.entry;
  if (u.username !== undefined || u.password !== undefined) {
    throw new InvalidOptionsError(
      `${whereCtx}: basic auth (username/password) is not supported (Kubernetes removed it in ` +
        "1.19); give a token, tokenFile, client certificate or exec plugin",
    );
  }
  const c = cluster.entry;
  const ca = await pemOf(cluster, "certificate-authority", whereCtx);
  const cert = await pemOf(user, "client-certificate", whereCtx);
  const key = await pemOf(user, "client-key", whereCtx);
  if ((cert === undefined) !== (key === undefined)) {
    throw new InvalidOptionsError(
      `${whereCtx}: a client certificate needs its key and the key its certificate`,
    );
  }
  const server = serverUrl(c.server, whereCtx);
  const proxyUrl = c["proxy-url"] ? proxyOf(c["proxy-url"], whereCtx) : undefined;
  const tokenFile = u.tokenFile ? relativeTo(user.file, u.tokenFile) : undefined;
  const providerToken = u["auth-provider"]
    ? authProviderToken(u["auth-provider"], whereCtx)
    : undefined;
  const token = u.token || providerToken;
  const exec = u.exec
    ? execPlugin(u.exec, user.file, whereCtx, { server, ca, cluster: c })
    : undefined;
  return {
    server,
    namespace: ctx.namespace || "default",
    ...(ca !== undefined && { ca }),
    ...(cert !== undefined && { cert, key }),
    ...(token ? { token } : tokenFile ? { tokenFile } : {}),
    ...(exec !== undefined && { exec }),
    ...(c["insecure-skip-tls-verify"] === true && { insecureSkipTlsVerify: true }),
    ...(c["tls-server-name"] && { tlsServerName: c["tls-server-name"] }),
    ...(proxyUrl !== undefined && { proxyUrl }),
    source: whereCtx,
  };
}

const EXEC_VERSIONS: readonly string[] = [
  "client.authentication.k8s.io/v1",
  "client.authentication.k8s.io/v1beta1",
];

/** A user's `exec` entry, checked as client-go checks it, with the command's path resolved. */
function execPlugin(
  exec: z.infer<typeof execSchema>,
  file: string,
  where: string,
  cluster: { server: string; ca: string | undefined; cluster: ClusterEntry },
): ExecPlugin {
  if (!EXEC_VERSIONS.includes(exec.apiVersion)) {
    throw new InvalidOptionsError(
      `${where}: the exec plugin's apiVersion '${exec.apiVersion}' is not supported ` +
        `(use ${EXEC_VERSIONS.join(" or ")}; v1alpha1 was removed in Kubernetes 1.24)`,
    );
  }
  // client-go: a command with a path separator is a path relative to the kubeconfig's folder;
  // a bare name is looked up on PATH.
  const command = exec.command.includes("/") ? relativeTo(file, exec.command) : exec.command;
  const c = cluster.cluster;
  const config = c.extensions?.find((e) => e.name === "client.authentication.k8s.io/exec")
    ?.extension;
  return {
    command,
    args: exec.args ?? [],
    env: Object.fromEntries((exec.env ?? []).map((e) => [e.name, e.value])),
    apiVersion: exec.apiVersion as ExecApiVersion,
    ...(exec.installHint && { installHint: exec.installHint }),
    interactiveMode: exec.interactiveMode ?? "IfAvailable",
    ...(exec.provideClusterInfo === true && {
      cluster: {
        server: cluster.server,
        ...(c["tls-server-name"] && { "tls-server-name": c["tls-server-name"] }),
        ...(c["insecure-skip-tls-verify"] && { "insecure-skip-tls-verify": true }),
        ...(cluster.ca !== undefined && {
          "certificate-authority-data": btoa(
            String.fromCharCode(...new TextEncoder().encode(cluster.ca)),
          ),
        }),
        ...(c["proxy-url"] && { "proxy-url": c["proxy-url"] }),
        ...(config !== undefined && { config }),
      },
    }),
  };
}

/** A cluster's `proxy-url`: `http://`, `https://` or `socks5://` (as client-go takes). */
function proxyOf(proxy: string, where: string): string {
  let url: URL;
  try {
    url = new URL(proxy);
  } catch (err) {
    throw new InvalidOptionsError(`${where}: proxy-url '${proxy}' is not a URL`, { cause: err });
  }
  if (!["http:", "https:", "socks5:"].includes(url.protocol)) {
    throw new InvalidOptionsError(
      `${where}: proxy-url '${proxy}' is not an http://, https:// or socks5:// URL`,
    );
  }
  return proxy;
}

/** The server URL without a trailing slash; only `https://` and `http://` URLs are taken. */
function serverUrl(server: string, where: string): string {
  let url: URL;
  try {
    url = new URL(server);
  } catch (err) {
    throw new InvalidOptionsError(`${where}: server '${server}' is not a URL`, { cause: err });
  }
  if (url.protocol !== "https:" && url.protocol !== "http:") {
    throw new InvalidOptionsError(`${where}: server '${server}' is not an http(s) URL`);
  }
  return server.replace(/\/+$/, "");
}

/**
 * The in-cluster connection (client-go's `rest.InClusterConfig`): `https://$KUBERNETES_SERVICE_HOST:
 * $KUBERNETES_SERVICE_PORT`, the service-account token (as a file: re-read when the kubelet rotates
 * it), its CA and its namespace. Throws {@linkcode InvalidOptionsError} outside a pod.
 */
export async function inClusterConnection(paths: InClusterPaths = {}): Promise<KubeConnection> {
  const env = paths.env ?? process.env;
  const tokenFile = paths.tokenFile ?? `${SERVICE_ACCOUNT_DIR}/token`;
  const caFile = paths.caFile ?? `${SERVICE_ACCOUNT_DIR}/ca.crt`;
  const namespaceFile = paths.namespaceFile ?? `${SERVICE_ACCOUNT_DIR}/namespace`;
  const host = env.KUBERNETES_SERVICE_HOST;
  const port = env.KUBERNETES_SERVICE_PORT;
  const where = "in-cluster config";
  if (!host || !port) {
    throw new InvalidOptionsError(
      `${where}: KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are not set: not running ` +
        "in a Kubernetes pod (give a kubeconfig instead)",
    );
  }
  // Fail now, in words, if the token is missing; the client reads it again as it rotates.
  await readText(tokenFile, "the service-account token", where);
  const ca = await readText(caFile, "the service-account CA", where);
  const namespace = (await readFile(namespaceFile, "utf8").catch(() => "")).trim();
  // An IPv6 service host needs brackets in a URL.
  const hostPart = host.includes(":") ? `[${host}]` : host;
  return {
    server: `https://${hostPart}:${port}`,
    namespace: namespace || "default",
    ca,
    tokenFile,
    source: where,
  };
}
