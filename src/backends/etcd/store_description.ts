/**
 * An etcd store as idalloc's tools name it: `--store etcd://host:port[,host:port…]`, `--prefix`
 * as a key prefix, and the backend's own options: TLS (`--ca`, and `--cert`/`--key` for mutual
 * TLS, `--tls-server-name`), authentication (`--user`/`--password`) and `--connect-timeout`.
 * {@linkcode describeEtcdStore} turns them into an {@linkcode EtcdStoreDescription}, which
 * `./driver.ts` opens. Nothing here loads the etcd client.
 *
 * @module
 */
import { z } from "../../deps/zod.ts";
import { InvalidOptionsError } from "../../errors.ts";
import type { StoreContext, StoreOption } from "../driver.ts";
import { durationFlag, validateFlags } from "../driver_options.ts";
import { CILIUM_IDENTITIES_PREFIX, etcdFields, withEtcdChecks } from "./options.ts";

/**
 * How long connecting waits for an answer unless `--connect-timeout` says otherwise (and at most
 * `--timeout`): a reachable etcd answers in milliseconds, and a failure should be said in seconds.
 */
export const DEFAULT_CONNECT_TIMEOUT_MS = 5_000;

/** The TLS files of an {@linkcode EtcdStoreDescription} (PEM, read when the store is opened). */
export interface EtcdTlsFiles {
  /** The CA certificate that signed the server's. */
  readonly ca: string;
  /** The client certificate, for mutual TLS (with `key`). */
  readonly cert?: string;
  /** The client's private key (with `cert`). */
  readonly key?: string;
  /** The name to verify the server certificate against, instead of the endpoint's host. */
  readonly serverName?: string;
}

/** One etcd store, completely: its members, namespace, security and timeouts. */
export interface EtcdStoreDescription {
  /** The members' client endpoints, `http://host:port` (`https://` with TLS). */
  readonly endpoints: readonly string[];
  /** The key prefix every entry lives under. */
  readonly prefix: string;
  /** TLS files; plain text without. */
  readonly tls?: EtcdTlsFiles;
  /** The user to authenticate as (with `password`). */
  readonly user?: string;
  /** The user's password: a secret, so a description is never logged as is. */
  readonly password?: string;
  /** How long connecting waits for an answer, in ms. */
  readonly dialTimeoutMs: number;
  /** How long a request retries across members, in ms. */
  readonly requestTimeoutMs: number;
}

/**
 * The schema of {@linkcode EtcdStoreDescription}: the backend's options schema decides what each
 * field may be (`etcdFields`, with the same checks across them), so both refuse the same values in
 * the same words.
 */
export const etcdStoreDescription: z.ZodType<EtcdStoreDescription> = withEtcdChecks(
  z.object({
    endpoints: etcdFields.endpoints,
    prefix: etcdFields.prefix,
    tls: etcdFields.tls.optional(),
    user: etcdFields.user.optional(),
    password: etcdFields.password.optional(),
    dialTimeoutMs: etcdFields.dialTimeoutMs,
    requestTimeoutMs: etcdFields.requestTimeoutMs,
  }).strict(),
);

/** The backend's own CLI options. */
export const ETCD_OPTIONS: readonly StoreOption[] = [
  { flags: "--ca <file>", description: "CA certificate (PEM); switches to https", file: true },
  { flags: "--cert <file>", description: "client certificate (PEM), with --key", file: true },
  { flags: "--key <file>", description: "client private key (PEM), with --cert", file: true },
  {
    flags: "--tls-server-name <name>",
    description: "name to verify the server certificate against",
  },
  { flags: "--user <name>", description: "user name" },
  {
    flags: "--password <password>",
    description: "password (with --user)",
    env: "IDALLOC_ETCD_PASSWORD",
    envOnlyWith: "--user",
  },
  {
    flags: "--connect-timeout <duration>",
    description: "time to wait for an answer when connecting (default: 5s, at most --timeout), " +
      "and per request when given (default: --timeout)",
  },
];

const etcdValues = z.object({
  ca: z.string().min(1).optional(),
  cert: z.string().min(1).optional(),
  key: z.string().min(1).optional(),
  tlsServerName: z.string().min(1).optional(),
  user: z.string().min(1).optional(),
  password: z.string().optional(),
  connectTimeout: durationFlag(1).optional(),
}).refine((o) => (o.cert === undefined) === (o.key === undefined), {
  message: "and --key go together",
  path: ["cert"],
}).refine((o) => o.user === undefined || o.password !== undefined, {
  message: "needs --password (or IDALLOC_ETCD_PASSWORD)",
  path: ["user"],
}).refine((o) => o.password === undefined || o.user !== undefined, {
  message: "needs --user",
  path: ["password"],
});

/** The hosts of `host:port[,host:port…]`, or `undefined` when one is not a host and port. */
export function etcdHosts(rest: string): string[] | undefined {
  const hosts = rest.split(",").map((h) => h.trim());
  const valid = hosts.every((h) => {
    if (h === "") return false;
    try {
      const url = new URL(`http://${h}`);
      return url.host !== "" && url.port !== "" && (url.pathname === "/" || url.pathname === "");
    } catch {
      return false;
    }
  });
  return valid ? hosts : undefined;
}

/**
 * The description of `--store etcd://<rest>` with `--prefix` and the backend's options; throws
 * `InvalidOptionsError` naming the flag.
 */
export function describeEtcdStore(
  rest: string,
  values: Readonly<Record<string, unknown>>,
  context: StoreContext,
): EtcdStoreDescription {
  const o = validateFlags(etcdValues, values);
  if (o.ca === undefined && (o.cert !== undefined || o.tlsServerName !== undefined)) {
    throw new InvalidOptionsError("invalid option: --cert/--key/--tls-server-name need --ca");
  }
  const hosts = etcdHosts(rest);
  if (hosts === undefined) {
    throw new InvalidOptionsError(
      `invalid option: --store etcd://${rest} must be etcd://host:port[,host:port…]`,
    );
  }
  const scheme = o.ca !== undefined ? "https" : "http";
  return {
    endpoints: hosts.map((h) => `${scheme}://${h}`),
    prefix: context.prefix ?? CILIUM_IDENTITIES_PREFIX,
    tls: o.ca === undefined
      ? undefined
      : { ca: o.ca, cert: o.cert, key: o.key, serverName: o.tlsServerName },
    user: o.user,
    password: o.password,
    // Connecting waits --connect-timeout (5s by default), at most --timeout. A request retries
    // across members for --connect-timeout when it is given, else for --timeout.
    dialTimeoutMs: Math.min(o.connectTimeout ?? DEFAULT_CONNECT_TIMEOUT_MS, context.timeoutMs),
    requestTimeoutMs: Math.min(o.connectTimeout ?? context.timeoutMs, context.timeoutMs),
  };
}
