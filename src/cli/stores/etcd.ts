/**
 * `--store etcd://host:port[,host:port…]`: etcd in Cilium's layout, over TLS with `--ca` (and
 * `--cert`/`--key` for mutual TLS), with `--user`/`--password` authentication. The etcd client is
 * loaded only when this driver opens a store.
 *
 * @module
 */
import { InvalidOptionsError } from "../../errors.ts";
import type { GlobalOptions } from "../args.ts";
import type { DriverOpenOptions, OpenedBackend, StoreDriver } from "./driver.ts";

function errorText(err: unknown): string {
  return err instanceof Error ? err.message : String(err);
}

function hostsOf(rest: string): string[] | undefined {
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
 * How long connecting waits for an answer unless `--connect-timeout` says otherwise (and at most
 * `--timeout`): a reachable etcd answers in milliseconds, and a failure should be said in seconds.
 */
export const DEFAULT_CONNECT_TIMEOUT_MS = 5_000;

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
    // Said here with the flag and the file; the backend would only say "the CA certificate".
    const { certificateProblem } = await import("../../backends/etcd/failure.ts");
    const { StoreTlsError } = await import("../../backends/etcd/errors.ts");
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

async function open(
  rest: string,
  o: GlobalOptions,
  open: DriverOpenOptions,
): Promise<OpenedBackend> {
  if (o.ca === undefined && (o.cert !== undefined || o.tlsServerName !== undefined)) {
    throw new InvalidOptionsError("invalid option: --cert/--key/--tls-server-name need --ca");
  }
  const { EtcdBackend, CILIUM_IDENTITIES_PREFIX } = await import("../../backends/etcd/mod.ts");
  const scheme = o.ca !== undefined ? "https" : "http";
  const endpoints = hostsOf(rest)!.map((h) => `${scheme}://${h}`);
  const ca = await readPem("--ca", o.ca);
  const tls = ca === undefined ? undefined : {
    ca,
    cert: await readPem("--cert", o.cert),
    key: await readPem("--key", o.key),
    serverName: o.tlsServerName,
  };
  // Connecting waits --connect-timeout (5s by default), at most --timeout. A request retries
  // across members for --connect-timeout when it is given, else for --timeout.
  const dialMs = Math.min(o.connectTimeoutMs ?? DEFAULT_CONNECT_TIMEOUT_MS, o.timeoutMs);
  const requestMs = Math.min(o.connectTimeoutMs ?? o.timeoutMs, o.timeoutMs);
  const backend = await EtcdBackend.connect({
    endpoints,
    prefix: o.prefix ?? CILIUM_IDENTITIES_PREFIX,
    node: o.node,
    tls,
    user: o.user,
    password: o.password,
    dialTimeoutMs: dialMs,
    requestTimeoutMs: requestMs,
  }, { signal: open.interrupt ?? open.signal });
  return { backend, where: `etcd ${endpoints.join(",")}`, close: () => backend.close() };
}

/** `etcd://host:port[,host:port…]`. */
export const etcdDriver: StoreDriver = {
  scheme: "etcd://",
  syntax: "etcd://host:port[,host:port…]",
  valid: (rest) => hostsOf(rest) !== undefined,
  open,
};
