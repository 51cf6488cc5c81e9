/**
 * Where the Kubernetes API server is and how to log in to it, as users configure it: a kubeconfig
 * file (its current context or a named one) or the in-cluster service account. Both resolve to one
 * {@linkcode KubeConnection}: the server URL, the TLS material as PEM text, the credentials and the
 * default namespace. A kubeconfig is read with a YAML parser (`npm:yaml`), never by hand; its
 * relative file paths are relative to the file, as `kubectl` reads them.
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

/** A resolved connection to one Kubernetes API server: what the client needs, nothing more. */
export interface KubeConnection {
  /** The API server's URL, `https://host:port` (no trailing slash). */
  readonly server: string;
  /** The namespace of namespaced resources when a call names none. */
  readonly namespace: string;
  /** The CA certificate(s) that sign the server's certificate, PEM; the system's roots when absent. */
  readonly ca?: string;
  /** The client certificate (mutual TLS), PEM. */
  readonly cert?: string;
  /** The client certificate's private key, PEM. */
  readonly key?: string;
  /** A bearer token. */
  readonly token?: string;
  /** A file holding the bearer token, re-read while the client runs (a rotated service-account token). */
  readonly tokenFile?: string;
  /** Skip the verification of the server's certificate (kubeconfig `insecure-skip-tls-verify`). */
  readonly insecureSkipTlsVerify?: boolean;
  /** The name to verify the server's certificate against, when not the URL's host. */
  readonly tlsServerName?: string;
  /** Where this came from, for messages: `kubeconfig /path (context dev, user admin)`, `in-cluster`. */
  readonly source: string;
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

// Kubeconfig files carry many fields this client has no use for (extensions, preferences):
// the schemas name only what it reads and let the rest pass.
const clusterSchema = z.looseObject({
  server: z.string().min(1),
  "certificate-authority": z.string().optional(),
  "certificate-authority-data": z.string().optional(),
  "insecure-skip-tls-verify": z.boolean().optional(),
  "tls-server-name": z.string().optional(),
  "proxy-url": z.string().optional(),
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
  exec: z.unknown().optional(),
  "auth-provider": z.unknown().optional(),
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

/** The kubeconfig path `kubectl` would use: the first of `$KUBECONFIG`, else `~/.kube/config`. */
export function defaultKubeconfigPath(
  env: Readonly<Record<string, string | undefined>> = process.env,
): string {
  const first = (env.KUBECONFIG ?? "").split(":").find((p) => p !== "");
  return first ?? resolve(homedir(), ".kube", "config");
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

/**
 * PEM text from a kubeconfig's `<field>-data` (base64) or `<field>` (a file path, relative to
 * the kubeconfig's folder), or `undefined` when neither is set.
 */
async function pemOf(
  entry: Record<string, unknown>,
  field: string,
  base: string,
  where: string,
): Promise<string | undefined> {
  const data = entry[`${field}-data`];
  if (typeof data === "string" && data !== "") return fromBase64(data, `${field}-data`, where);
  const file = entry[field];
  if (typeof file === "string" && file !== "") {
    return await readText(isAbsolute(file) ? file : resolve(base, file), field, where);
  }
  return undefined;
}

function pick<T extends { name: string }>(
  list: readonly T[],
  name: string,
  what: string,
  where: string,
): T {
  const found = list.find((e) => e.name === name);
  if (found !== undefined) return found;
  const known = list.map((e) => e.name);
  throw new InvalidOptionsError(
    `${where}: no ${what} named '${name}'` +
      (known.length > 0 ? ` (it has ${known.map((n) => `'${n}'`).join(", ")})` : ""),
  );
}

/**
 * Resolves kubeconfig `text` (read from `path`, which anchors relative file names) to a
 * connection: the context named `context`, else the file's `current-context`. Throws
 * {@linkcode InvalidOptionsError} saying what is missing or unsupported (exec and auth-provider
 * credential plugins, basic auth, proxies).
 */
export async function parseKubeconfig(
  text: string,
  path: string,
  context?: string,
): Promise<KubeConnection> {
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
  const config = parsed.data;
  const contextName = context ?? config["current-context"] ?? undefined;
  if (contextName === undefined || contextName === "") {
    throw new InvalidOptionsError(`${where} has no current-context: name a context`);
  }
  const ctx = pick(config.contexts, contextName, "context", where).context;
  const cluster = pick(config.clusters, ctx.cluster, "cluster", where).cluster;
  const user = ctx.user === undefined || ctx.user === ""
    ? {}
    : pick(config.users, ctx.user, "user", where).user ?? {};
  const whereCtx = `${where} (context ${contextName}${ctx.user ? `, user ${ctx.user}` : ""})`;
  if (user.exec !== undefined || user["auth-provider"] !== undefined) {
    throw new InvalidOptionsError(
      `${whereCtx}: credential plugins (exec, auth-provider) are not supported; ` +
        "give a token, tokenFile or client certificate",
    );
  }
  if (user.username !== undefined || user.password !== undefined) {
    throw new InvalidOptionsError(
      `${whereCtx}: basic auth (username/password) is not supported (Kubernetes removed it in ` +
        "1.19); give a token, tokenFile or client certificate",
    );
  }
  if (cluster["proxy-url"] !== undefined) {
    throw new InvalidOptionsError(`${whereCtx}: proxy-url is not supported`);
  }
  const base = dirname(resolve(path));
  const ca = await pemOf(cluster, "certificate-authority", base, whereCtx);
  const cert = await pemOf(user, "client-certificate", base, whereCtx);
  const key = await pemOf(user, "client-key", base, whereCtx);
  if ((cert === undefined) !== (key === undefined)) {
    throw new InvalidOptionsError(
      `${whereCtx}: a client certificate needs its key and the key its certificate`,
    );
  }
  const tokenFile = user.tokenFile && !isAbsolute(user.tokenFile)
    ? resolve(base, user.tokenFile)
    : user.tokenFile;
  return {
    server: serverUrl(cluster.server, whereCtx),
    namespace: ctx.namespace || "default",
    ...(ca !== undefined && { ca }),
    ...(cert !== undefined && { cert, key }),
    ...(user.token ? { token: user.token } : tokenFile ? { tokenFile } : {}),
    ...(cluster["insecure-skip-tls-verify"] === true && { insecureSkipTlsVerify: true }),
    ...(cluster["tls-server-name"] && { tlsServerName: cluster["tls-server-name"] }),
    source: whereCtx,
  };
}

/** Reads and resolves the kubeconfig file at `path` (see {@linkcode parseKubeconfig}). */
export async function loadKubeconfig(path: string, context?: string): Promise<KubeConnection> {
  const text = await readText(path, "the file", `kubeconfig ${path}`);
  return await parseKubeconfig(text, path, context);
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
