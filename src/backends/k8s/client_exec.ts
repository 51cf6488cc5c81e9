/**
 * Runs a kubeconfig user's `exec` credential plugin as client-go does: the program with its
 * `args`, its `env` added to ours and `KUBERNETES_EXEC_INFO` set to an `ExecCredential` of the
 * plugin's `apiVersion` (`spec.interactive` false: the client never hands it a terminal, so
 * `interactiveMode: Always` fails in words; `spec.cluster` when `provideClusterInfo`). It reads
 * the `ExecCredential` the plugin prints (checked with zod): a `token`, or a client certificate and
 * key, and when it expires.
 *
 * @example
 * ```ts ignore
 * // ignored: runs a program; tests/backends/k8s/client_exec.test.ts runs real plugins.
 * const credential = await runExecPlugin(connection.exec!, connection.source);
 * console.log(credential.token, credential.expiresAt);
 * ```
 *
 * @module
 */
import { spawn } from "node:child_process";
import process from "node:process";
import { z } from "../../deps/zod.ts";
import { errorMessage } from "../../errors.ts";
import { CredentialPluginError } from "./errors.ts";
import type { ExecPlugin } from "./kubeconfig.ts";

/** What a plugin gave. */
export interface ExecCredential {
  /** A bearer token. */
  readonly token?: string;
  /** A client certificate, PEM (with `key`). */
  readonly cert?: string;
  /** Its key, PEM. */
  readonly key?: string;
  /** When it expires (ms since the epoch); never when absent. */
  readonly expiresAt?: number;
}

const credentialSchema = z.looseObject({
  apiVersion: z.string(),
  kind: z.literal("ExecCredential"),
  status: z.looseObject({
    token: z.string().nullish(),
    clientCertificateData: z.string().nullish(),
    clientKeyData: z.string().nullish(),
    expirationTimestamp: z.string().nullish(),
  }),
});

/** How much of the plugin's standard error a message carries. */
const STDERR_TAIL = 2000;

/** Runs `plugin` once (see the module doc); `where` names the kubeconfig user for messages. */
export async function runExecPlugin(plugin: ExecPlugin, where: string): Promise<ExecCredential> {
  const at = `${where}: the exec plugin '${plugin.command}'`;
  if (plugin.interactiveMode === "Always") {
    throw new CredentialPluginError(
      `${at} needs a terminal (interactiveMode: Always), and idalloc never gives it one: log in ` +
        "first so that it runs without asking, or set interactiveMode to IfAvailable or Never",
      plugin.command,
    );
  }
  const info = {
    apiVersion: plugin.apiVersion,
    kind: "ExecCredential",
    spec: { interactive: false, ...(plugin.cluster !== undefined && { cluster: plugin.cluster }) },
  };
  const { code, stdout, stderr } = await run(plugin, JSON.stringify(info), at);
  if (code !== 0) {
    throw new CredentialPluginError(
      `${at} exited with ${code}: ${stderr.trim().slice(-STDERR_TAIL) || "(no output)"}`,
      plugin.command,
    );
  }
  return credentialOf(stdout, plugin, at);
}

function credentialOf(stdout: string, plugin: ExecPlugin, at: string): ExecCredential {
  let raw: unknown;
  try {
    raw = JSON.parse(stdout);
  } catch (err) {
    throw new CredentialPluginError(
      `${at} printed no JSON ExecCredential: ${stdout.trim().slice(0, 200) || "(nothing)"}`,
      plugin.command,
      { cause: err },
    );
  }
  const parsed = credentialSchema.safeParse(raw);
  if (!parsed.success) {
    const issue = parsed.error.issues[0];
    throw new CredentialPluginError(
      `${at} printed no ExecCredential: '${issue.path.join(".")}' ${issue.message}`,
      plugin.command,
      { cause: parsed.error },
    );
  }
  const { apiVersion, status } = parsed.data;
  if (apiVersion !== plugin.apiVersion) {
    throw new CredentialPluginError(
      `${at} answered ${apiVersion}, not the kubeconfig's ${plugin.apiVersion}`,
      plugin.command,
    );
  }
  const cert = status.clientCertificateData || undefined;
  const key = status.clientKeyData || undefined;
  if ((cert === undefined) !== (key === undefined)) {
    throw new CredentialPluginError(
      `${at} gave a client certificate without its key, or a key without its certificate`,
      plugin.command,
    );
  }
  if (!status.token && cert === undefined) {
    throw new CredentialPluginError(
      `${at} gave neither a token nor a client certificate`,
      plugin.command,
    );
  }
  let expiresAt: number | undefined;
  if (status.expirationTimestamp) {
    expiresAt = Date.parse(status.expirationTimestamp);
    if (Number.isNaN(expiresAt)) {
      throw new CredentialPluginError(
        `${at} gave an expirationTimestamp that is not RFC 3339: ${status.expirationTimestamp}`,
        plugin.command,
      );
    }
  }
  return {
    ...(status.token && { token: status.token }),
    ...(cert !== undefined && { cert, key }),
    ...(expiresAt !== undefined && { expiresAt }),
  };
}

function run(
  plugin: ExecPlugin,
  info: string,
  at: string,
): Promise<{ code: number | null; stdout: string; stderr: string }> {
  return new Promise((resolve, reject) => {
    const child = spawn(plugin.command, [...plugin.args], {
      env: { ...process.env, ...plugin.env, KUBERNETES_EXEC_INFO: info },
      stdio: ["ignore", "pipe", "pipe"],
    });
    const out: string[] = [];
    const err: string[] = [];
    child.stdout!.setEncoding("utf8").on("data", (d: string) => out.push(d));
    child.stderr!.setEncoding("utf8").on("data", (d: string) => err.push(d));
    child.once("error", (e: Error & { code?: string }) => {
      if (e.code === "ENOENT") {
        reject(
          new CredentialPluginError(
            `${at} is not installed (not found${plugin.command.includes("/") ? "" : " on PATH"})` +
              (plugin.installHint ? `: ${plugin.installHint.trim()}` : ""),
            plugin.command,
            { cause: e },
          ),
        );
      } else {
        reject(
          new CredentialPluginError(`${at} could not run (${errorMessage(e)})`, plugin.command, {
            cause: e,
          }),
        );
      }
    });
    child.once("close", (code) => resolve({ code, stdout: out.join(""), stderr: err.join("") }));
  });
}
