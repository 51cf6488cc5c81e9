/**
 * The etcd driver: `--store etcd://host:port[,host:port…]` in Cilium's layout (see
 * `./store_description.ts` for how a store is named). The etcd client is loaded only when a store
 * is opened, so that tools listing the drivers (the CLI on a `kv:` store) never pay for it.
 *
 * @module
 */
import { readFile } from "node:fs/promises";
import { errorMessage, InvalidOptionsError } from "../../errors.ts";
import type { BackendDriver, DriverFailure, DriverOpenOptions, OpenedBackend } from "../driver.ts";
import {
  describeEtcdStore,
  ETCD_OPTIONS,
  etcdHosts,
  type EtcdStoreDescription,
  etcdStoreDescription,
} from "./store_description.ts";

/**
 * The PEM text of the file `--<flag>` names, or `undefined` when it names none. A certificate is
 * checked here, where the flag and the file can be named (the backend would only say "the CA
 * certificate").
 */
async function readPem(flag: string, path: string | undefined): Promise<string | undefined> {
  if (path === undefined) return undefined;
  let text: string;
  try {
    text = await readFile(path, "utf8");
  } catch (err) {
    throw new InvalidOptionsError(`cannot read ${flag} file ${path}: ${errorMessage(err)}`, {
      cause: err,
    });
  }
  if (flag !== "--key") {
    const { certificateProblem } = await import("../shared/tls.ts");
    const { StoreTlsError } = await import("./errors.ts");
    const problem = certificateProblem(text);
    if (problem !== undefined) {
      throw new StoreTlsError(
        `${flag} file ${path} is not a PEM certificate: ${problem}`,
        "not-a-certificate",
      );
    }
  }
  return text;
}

async function open(d: EtcdStoreDescription, options: DriverOpenOptions): Promise<OpenedBackend> {
  const { EtcdBackend } = await import("./mod.ts");
  const ca = await readPem("--ca", d.tls?.ca);
  const tls = ca === undefined ? undefined : {
    ca,
    cert: await readPem("--cert", d.tls?.cert),
    key: await readPem("--key", d.tls?.key),
    serverName: d.tls?.serverName,
  };
  const backend = await EtcdBackend.connect({
    endpoints: [...d.endpoints],
    prefix: d.prefix,
    node: options.node,
    tls,
    user: d.user,
    password: d.password,
    dialTimeoutMs: d.dialTimeoutMs,
    requestTimeoutMs: d.requestTimeoutMs,
  }, { signal: options.interrupt ?? options.signal });
  return { backend, where: `etcd ${d.endpoints.join(",")}`, close: () => backend.close() };
}

/** Damage only an etcd store can hold: empty masters and references outside every lease. */
export const ETCD_DAMAGE_KINDS: Readonly<Record<string, string>> = {
  "master-empty": "a master with an empty value",
  "reference-without-lease": "a reference bound to no lease (it would never expire)",
};

/** What to do about a TLS setup mistake, by `StoreTlsError.problem`. */
function tlsHint(err: unknown): string {
  switch ((err as { problem?: string }).problem) {
    case "ip-server-name":
      return "give --tls-server-name with a DNS name from the server certificate";
    case "name-mismatch":
      return "check the host in --store, or give --tls-server-name with a name the " +
        "certificate holds";
    case "untrusted":
      return "check --ca: it must be the CA that signed the server certificate";
    case "client-certificate":
      return "give --cert and --key with a client certificate the server trusts";
    case "not-tls":
      return "drop --ca (and --cert, --key) for a plain-text etcd";
    case "tls-required":
      return "give --ca (and --tls-server-name for an IP address)";
    case "not-a-certificate":
      return ""; // the message names the flag and the file already
    default:
      return "check --ca, --cert, --key and --tls-server-name";
  }
}

/**
 * The etcd error classes (`./errors.ts`), by name: what the library's message leaves out is what
 * to do about it in the CLI's flags.
 */
export const ETCD_FAILURES: Readonly<Record<string, DriverFailure>> = {
  StoreAccessDeniedError: {
    kind: "usage",
    hint: () =>
      "check --user and --password, or IDALLOC_ETCD_PASSWORD, and the user's permissions on " +
      "--prefix",
  },
  AuthNotEnabledError: {
    kind: "usage",
    hint: () =>
      "drop --user and --password (and IDALLOC_ETCD_PASSWORD), or enable authentication in etcd",
  },
  StoreTlsError: { kind: "usage", hint: tlsHint },
  NotEtcdServerError: {
    kind: "usage",
    hint: () => "check the host and port in --store: etcd's client port is usually 2379",
  },
  StoreHostNotFoundError: { kind: "unavailable" },
  StoreConnectionRefusedError: {
    kind: "unavailable",
    hint: () => "check that etcd runs there, and the port in --store",
  },
};

/** The etcd backend, as idalloc's tools know it. */
export const etcdDriver: BackendDriver<EtcdStoreDescription> = {
  kind: "etcd",
  folder: new URL("./", import.meta.url).href,
  title: "etcd",
  scheme: "etcd://",
  syntax: "etcd://host:port[,host:port…]",
  exampleStore: "etcd://127.0.0.1:2379,10.0.0.2:2379",
  prefixSyntax: 'a key prefix (default "cilium/state/identities/v1")',
  options: ETCD_OPTIONS,
  description: etcdStoreDescription,
  damageKinds: ETCD_DAMAGE_KINDS,
  failures: ETCD_FAILURES,
  accepts: (rest) => etcdHosts(rest) !== undefined,
  describe: describeEtcdStore,
  open,
};
