/**
 * What a test process needs to use a kube-apiserver that another process started (the test
 * launcher's, `./launcher.ts`): a JSON file named by {@linkcode KUBE_TEST_SERVER_ENV}, with the
 * server's URL and CA, the test users' tokens, the client CA (to mint client certificates), the
 * etcd behind it (to compact) and its PID (to read its RSS). `./cluster.ts` attaches to it.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { parseKubeTestServerInfo } from "./attach.ts";
 *
 * const info = parseKubeTestServerInfo(JSON.stringify({
 *   server: "https://127.0.0.1:6443",
 *   caFile: "/tmp/k/certs/apiserver.crt",
 *   dir: "/tmp/k",
 *   clientCa: { cert: "/tmp/k/client-ca.crt", key: "/tmp/k/client-ca.key" },
 *   tokens: { admin: "a", nobody: "n", reader: "r" },
 *   pid: 4242,
 *   startMs: 5000,
 *   etcd: "http://127.0.0.1:2379",
 * }), "example");
 * assert.equal(info.tokens.admin, "a");
 * assert.throws(() => parseKubeTestServerInfo("{}", "example"), { name: "KubeTestServerError" });
 * ```
 * @module
 */
import { z } from "../../../deps/zod.ts";

/** The environment variable naming the test run's kube-apiserver description (a JSON file). */
export const KUBE_TEST_SERVER_ENV = "IDALLOC_KUBE_TEST_SERVER";

/** The description of a running test kube-apiserver, as written to the file. */
export const kubeTestServerInfoSchema = z.object({
  /** `https://127.0.0.1:<port>`. */
  server: z.url(),
  /** The CA file that verifies the server's certificate. */
  caFile: z.string().min(1),
  /** The server's temporary dir (removed when it stops; attached processes write below it). */
  dir: z.string().min(1),
  /** The client CA's certificate and key files. */
  clientCa: z.object({ cert: z.string().min(1), key: z.string().min(1) }),
  /** The bearer tokens of the test users. */
  tokens: z.object({
    admin: z.string().min(1),
    nobody: z.string().min(1),
    reader: z.string().min(1),
  }),
  /** The API server's PID. */
  pid: z.number().int().positive(),
  /** How long its start took (ms). */
  startMs: z.number().nonnegative(),
  /** The client URL of the etcd behind it. */
  etcd: z.url(),
});

/** The description of a running test kube-apiserver. */
export type KubeTestServerInfo = z.infer<typeof kubeTestServerInfoSchema>;

/** The description names no usable server: unreadable, not JSON, or a field missing. */
export class KubeTestServerError extends Error {
  override readonly name = "KubeTestServerError";
  constructor(message: string, options?: ErrorOptions) {
    super(message, options);
  }
}

/** Parses a description read from `source` (named in errors). */
export function parseKubeTestServerInfo(text: string, source: string): KubeTestServerInfo {
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch (err) {
    throw new KubeTestServerError(`${source}: not JSON`, { cause: err });
  }
  const parsed = kubeTestServerInfoSchema.safeParse(json);
  if (!parsed.success) {
    const issue = parsed.error.issues[0];
    throw new KubeTestServerError(
      `${source}: not a test kube-apiserver description (${issue.path.join(".") || "top"}: ` +
        `${issue.message})`,
      { cause: parsed.error },
    );
  }
  return parsed.data;
}

/**
 * What {@linkcode kubeTestServerInfo} reads of a running test server: the parts of
 * `KubeTestCluster` (`./cluster.ts`, which imports this module to attach) that describe it.
 */
export interface DescribedKubeTestServer {
  /** The API server's URL. */
  readonly server: string;
  /** Its CA certificate's file. */
  readonly caFile: string;
  /** The server's directory (its certificates, the client CA). */
  readonly dir: string;
  /** The API server's PID, while it runs. */
  readonly pid: number | undefined;
  /** How long its start took, etcd included (ms). */
  readonly startMs: number;
  /** The etcd behind it. */
  readonly etcd: { readonly endpoints: readonly string[] };
  /** The bearer token of a test user. */
  token(user: "admin" | "nobody" | "reader"): string;
}

/** The description of `cluster` (a server this process started). */
export function kubeTestServerInfo(cluster: DescribedKubeTestServer): KubeTestServerInfo {
  if (cluster.pid === undefined) throw new KubeTestServerError("the kube-apiserver is not running");
  return {
    server: cluster.server,
    caFile: cluster.caFile,
    dir: cluster.dir,
    clientCa: { cert: `${cluster.dir}/client-ca.crt`, key: `${cluster.dir}/client-ca.key` },
    tokens: {
      admin: cluster.token("admin"),
      nobody: cluster.token("nobody"),
      reader: cluster.token("reader"),
    },
    pid: cluster.pid,
    startMs: Math.round(cluster.startMs),
    etcd: cluster.etcd.endpoints[0],
  };
}
