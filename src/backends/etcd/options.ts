/**
 * Options of the etcd backend: public types, and their validation (zod, internal). Each option
 * is declared once, in the schema; the documented {@linkcode EtcdBackendOptions} is checked against
 * it at compile time (see `src/option_shape.ts`).
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { resolveEtcdOptions } from "./options.ts";
 * const settings = resolveEtcdOptions({ endpoints: ["http://127.0.0.1:2379"], node: "10.0.0.1" });
 * assert.equal(settings.prefix, "cilium/state/identities/v1");
 * ```
 *
 * @module
 */
import { z } from "../../deps/zod.ts";
import { parseOptions } from "../../validate.ts";
import type { SameShape, SettingsOf } from "../../option_shape.ts";

/** Cilium's identity base path (`kvstore.BaseKeyPrefix` + `state/identities/v1`). */
export const CILIUM_IDENTITIES_PREFIX = "cilium/state/identities/v1";

/** TLS material for `https://` endpoints, as PEM strings. */
export interface EtcdTlsOptions {
  /** CA certificate(s) that sign the server certificates. */
  readonly ca: string;
  /** Client certificate chain, for mutual TLS. */
  readonly cert?: string;
  /** Client private key, for mutual TLS. */
  readonly key?: string;
  /**
   * The name to verify the servers' certificates against (and send as SNI), instead of the
   * endpoint's host. Needed for IP-address endpoints under Deno, whose TLS refuses an IP as SNI:
   * give a DNS name from the certificate's subjectAltName.
   */
  readonly serverName?: string;
}

/** Options of {@linkcode EtcdBackend.connect}. */
export interface EtcdBackendOptions {
  /**
   * Client URLs of the etcd members, e.g. `http://127.0.0.1:2379`, all `http` or all `https`; or
   * etcdctl's `host:port` (`127.0.0.1:2379`, `[::1]:2379`), which is `https` when `tls` is given
   * and `http` otherwise, as etcdctl reads it.
   */
  readonly endpoints: readonly string[];
  /** Base path of the layout (Cilium's `basePath`). @default {"cilium/state/identities/v1"} */
  readonly prefix?: string;
  /** This node's name, the last segment of its reference keys (Cilium: the node IP). No `/`. */
  readonly node: string;
  /** TLS material; required for `https://` endpoints signed by a private CA. */
  readonly tls?: EtcdTlsOptions;
  /** etcd user name (password authentication). */
  readonly user?: string;
  /** etcd password, with `user`. */
  readonly password?: string;
  /**
   * Requests per second to etcd (token bucket, burst = qps) over every request of this backend,
   * watch (re)creation included. Unlimited when unset. Cilium uses 20.
   */
  readonly qps?: number;
  /**
   * Whether every write also requires that no Cilium node holds its etcd mutex on the key or the
   * ID (`<prefix>/locks/<key>/…` while Cilium allocates the key, `<prefix>/locks/id/<ID>/…` while
   * its GC judges the ID). Cilium writes a master and its reference in two steps under that mutex;
   * a writer that ignored it could land between them and give the key a second ID. Turn it off
   * only where no Cilium node can ever write to this prefix: it saves two compares per write and
   * the waits behind Cilium's mutexes.
   * @default {true}
   */
  readonly honorCiliumLocks?: boolean;
  /**
   * Group commit: acquisitions and releases that arrive while a request is in flight share the
   * next one (each in its own nested transaction, with its own guards). Off: one request each.
   * @default {true}
   */
  readonly groupCommit?: boolean;
  /**
   * Time `connect` waits for etcd to answer. Failures that are certain (a host name that does
   * not resolve, a refused connection, TLS that does not fit, a server that is not etcd) reject
   * after about a second instead, each with its own error class (see `errors.ts`). @default {5000}
   */
  readonly dialTimeoutMs?: number;
  /**
   * Upper bound of one request, retries across members included; the caller's signal may end it
   * earlier. @default {5000}
   */
  readonly requestTimeoutMs?: number;
}

const endpoint = z.string().refine((s) => {
  try {
    const url = new URL(s);
    return (url.protocol === "http:" || url.protocol === "https:") && url.host !== "" &&
      (url.pathname === "/" || url.pathname === "");
  } catch {
    return false;
  }
}, "must be an http:// or https:// URL without a path, or host:port");

/** etcdctl's endpoint form: a host name, IPv4 address or bracketed IPv6 address, and a port. */
const HOST_PORT = /^(?:[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?|\[[0-9A-Fa-f:.]+\]):\d{1,5}$/;

/**
 * `options` with etcdctl's `host:port` endpoints given their scheme (https with `tls`, as etcdctl
 * does with `--cacert`), so that users can pass what etcdctl and `ETCDCTL_ENDPOINTS` take; every
 * other value is left for the schema to judge.
 */
function withSchemes(options: EtcdBackendOptions): EtcdBackendOptions {
  if (typeof options !== "object" || options === null || !Array.isArray(options.endpoints)) {
    return options;
  }
  const scheme = options.tls === undefined ? "http" : "https";
  const endpoints = options.endpoints.map((e) =>
    typeof e === "string" && HOST_PORT.test(e) ? `${scheme}://${e}` : e
  );
  return { ...options, endpoints };
}

const timeoutMs = z.number().int().min(1).max(600_000);

/**
 * The options a store description carries too (`store_description.ts`), each with its one set of
 * bounds: the options schema and the description's are both made of these (optional ones and
 * defaults are each schema's own).
 */
export const etcdFields = {
  endpoints: z.array(endpoint).min(1, "at least one endpoint is required"),
  prefix: z.string().min(1).refine((p) => !p.includes("\0"), "must not contain NUL"),
  tls: z.object({
    ca: z.string().min(1),
    cert: z.string().min(1).optional(),
    key: z.string().min(1).optional(),
    serverName: z.string().min(1).optional(),
  }).strict().refine((t) => (t.cert === undefined) === (t.key === undefined), {
    message: "cert and key go together",
  }),
  user: z.string().min(1),
  password: z.string(),
  dialTimeoutMs: timeoutMs,
  requestTimeoutMs: timeoutMs,
};

/** What the fields of {@linkcode etcdFields} must satisfy together. */
interface Together {
  readonly endpoints: readonly string[];
  readonly user?: string;
  readonly password?: string;
}

/**
 * `schema` with the checks across {@linkcode etcdFields}: user and password go together, and the
 * endpoints are all `http://` or all `https://`.
 */
export function withEtcdChecks<S extends z.ZodType<Together>>(schema: S): S {
  return schema
    .refine((o) => (o.user === undefined) === (o.password === undefined), {
      message: "user and password go together",
      path: ["password"],
    })
    .refine((o) => {
      const secure = o.endpoints.filter((e) => e.startsWith("https:")).length;
      return secure === 0 || secure === o.endpoints.length;
    }, { message: "endpoints must be all http:// or all https://", path: ["endpoints"] }) as S;
}

const schema = withEtcdChecks(
  z.object({
    endpoints: etcdFields.endpoints,
    prefix: etcdFields.prefix.default(CILIUM_IDENTITIES_PREFIX),
    node: z.string().min(1).max(1024)
      .refine((n) => !n.includes("/"), "must not contain '/'")
      .refine((n) => n !== "." && n !== "..", "must not be '.' or '..'")
      .refine((n) => !n.includes("\0"), "must not contain NUL")
      .refine((n) => n.isWellFormed(), "must be well-formed Unicode"),
    tls: etcdFields.tls.optional(),
    user: etcdFields.user.optional(),
    password: etcdFields.password.optional(),
    qps: z.number().positive().finite().optional(),
    honorCiliumLocks: z.boolean().default(true),
    groupCommit: z.boolean().default(true),
    dialTimeoutMs: etcdFields.dialTimeoutMs.default(5_000),
    requestTimeoutMs: etcdFields.requestTimeoutMs.default(5_000),
  }).strict(),
);

/**
 * Options after validation, with defaults: the schema's output, so declared once. Every endpoint
 * carries its scheme (etcdctl's `host:port` got one from {@linkcode resolveEtcdOptions}).
 */
export type EtcdSettings = SettingsOf<typeof schema>;

// Does not compile when the documented options and the schema drift apart.
const _documentedAsValidated: SameShape<EtcdBackendOptions, z.input<typeof schema>> = true;

/** Validates `options`; throws {@linkcode InvalidOptionsError} naming every problem. */
export function resolveEtcdOptions(options: EtcdBackendOptions): EtcdSettings {
  return parseOptions(schema, withSchemes(options), "etcd backend options");
}
