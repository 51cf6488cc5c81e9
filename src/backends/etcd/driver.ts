/**
 * The etcd driver: `--store etcd://host:port[,host:port…]` in Cilium's layout (see
 * `./store_description.ts` for how a store is named). The etcd client is loaded only when a store
 * is opened, so that tools listing the drivers (the CLI on a `kv:` store) never pay for it.
 *
 * @module
 */
import { InvalidOptionsError } from "../../errors.ts";
import type { BackendDriver, DriverOpenOptions, OpenedBackend } from "../driver.ts";
import {
  describeEtcdStore,
  ETCD_OPTIONS,
  etcdHosts,
  type EtcdStoreDescription,
  etcdStoreDescription,
} from "./store_description.ts";

function errorText(err: unknown): string {
  return err instanceof Error ? err.message : String(err);
}

/**
 * The PEM text of the file `--<flag>` names, or `undefined` when it names none. A certificate is
 * checked here, where the flag and the file can be named (the backend would only say "the CA
 * certificate").
 */
async function readPem(flag: string, path: string | undefined): Promise<string | undefined> {
  if (path === undefined) return undefined;
  let text: string;
  try {
    text = await Deno.readTextFile(path);
  } catch (err) {
    throw new InvalidOptionsError(`cannot read ${flag} file ${path}: ${errorText(err)}`, {
      cause: err,
    });
  }
  if (flag !== "--key") {
    const { certificateProblem } = await import("./failure.ts");
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

/** The etcd backend, as idalloc's tools know it. */
export const etcdDriver: BackendDriver<EtcdStoreDescription> = {
  kind: "etcd",
  harness: new URL("./testing/harness.ts", import.meta.url).href,
  title: "etcd",
  scheme: "etcd://",
  syntax: "etcd://host:port[,host:port…]",
  prefixSyntax: 'a key prefix (default "cilium/state/identities/v1")',
  options: ETCD_OPTIONS,
  description: etcdStoreDescription,
  damageKinds: ETCD_DAMAGE_KINDS,
  accepts: (rest) => etcdHosts(rest) !== undefined,
  describe: describeEtcdStore,
  open,
};
