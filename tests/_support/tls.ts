/**
 * Throw-away TLS material for tests: a private CA with a server certificate for 127.0.0.1 (and
 * {@linkcode SERVER_NAME}) and a client certificate, made with the `openssl` binary in a temp dir.
 *
 * @example
 * ```ts ignore
 * // Needs openssl and an etcd binary; tests/backends/etcd/cli_security.test.ts runs it.
 * if (hasOpenssl()) {
 *   await withCerts("idalloc-tls-", async (files) => {
 *     await using etcd = await startEtcd({ tls: etcdTls(files, { mutual: true }) });
 *   });
 * }
 * ```
 * @module
 */
import type { StartEtcdOptions } from "../../src/backends/etcd/testing/cluster.ts";

/** The DNS name in the test server certificate (Deno's TLS refuses an IP address as SNI). */
export const SERVER_NAME = "etcd.idalloc.test";

/** Paths of the PEM files {@linkcode makeCerts} writes. */
export interface CertFiles {
  /** The CA certificate. */
  readonly ca: string;
  /** The server certificate (127.0.0.1 and {@linkcode SERVER_NAME}). */
  readonly cert: string;
  /** The server key. */
  readonly key: string;
  /** The client certificate (for mutual TLS). */
  readonly clientCert: string;
  /** The client key. */
  readonly clientKey: string;
}

/** Whether an `openssl` binary is on PATH (the TLS tests are skipped without one). */
export function hasOpenssl(): boolean {
  return (Deno.env.get("PATH") ?? "").split(":").some((dir) => {
    try {
      return dir !== "" && Deno.statSync(`${dir}/openssl`).isFile;
    } catch {
      return false;
    }
  });
}

async function openssl(dir: string, ...args: string[]): Promise<void> {
  const out = await new Deno.Command("openssl", { args, cwd: dir, stdout: "null", stderr: "piped" })
    .output();
  if (!out.success) throw new Error(`openssl ${args[0]}: ${new TextDecoder().decode(out.stderr)}`);
}

/** P-256 keys: generated in milliseconds, unlike RSA. */
const EC_KEY = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"];

/** Writes a fresh private CA, a server and a client certificate into `dir`. */
export async function makeCerts(dir: string): Promise<CertFiles> {
  await Deno.writeTextFile(
    `${dir}/server.ext`,
    `subjectAltName=IP:127.0.0.1,DNS:${SERVER_NAME}\nextendedKeyUsage=serverAuth\n`,
  );
  await Deno.writeTextFile(`${dir}/client.ext`, "extendedKeyUsage=clientAuth\n");
  await openssl(
    dir,
    "req",
    "-x509",
    ...EC_KEY,
    "-nodes",
    "-keyout",
    "ca.key",
    "-out",
    "ca.crt",
    "-days",
    "1",
    "-subj",
    "/CN=idalloc test CA",
  );
  for (const [name, cn] of [["server", "127.0.0.1"], ["client", "idalloc"]]) {
    await openssl(
      dir,
      "req",
      ...EC_KEY,
      "-nodes",
      "-keyout",
      `${name}.key`,
      "-out",
      `${name}.csr`,
      "-subj",
      `/CN=${cn}`,
    );
    await openssl(
      dir,
      "x509",
      "-req",
      "-in",
      `${name}.csr`,
      "-CA",
      "ca.crt",
      "-CAkey",
      "ca.key",
      "-CAcreateserial",
      "-out",
      `${name}.crt`,
      "-days",
      "1",
      "-extfile",
      `${name}.ext`,
    );
  }
  return {
    ca: `${dir}/ca.crt`,
    cert: `${dir}/server.crt`,
    key: `${dir}/server.key`,
    clientCert: `${dir}/client.crt`,
    clientKey: `${dir}/client.key`,
  };
}

/** Runs `fn` with fresh certificates in a temp dir named with `prefix`, removed afterwards. */
export async function withCerts<T>(
  prefix: string,
  fn: (files: CertFiles) => Promise<T>,
): Promise<T> {
  const dir = await Deno.makeTempDir({ prefix });
  try {
    return await fn(await makeCerts(dir));
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
}

/** `startEtcd`'s `tls` option serving these files; `mutual` also demands the client certificate. */
export function etcdTls(
  files: CertFiles,
  { mutual = false }: { mutual?: boolean } = {},
): NonNullable<StartEtcdOptions["tls"]> {
  const server = { ca: files.ca, cert: files.cert, key: files.key };
  return mutual ? { ...server, client: { cert: files.clientCert, key: files.clientKey } } : server;
}
