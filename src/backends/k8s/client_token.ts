/**
 * The credentials of a client: the kubeconfig's `token`, a `tokenFile` (the in-cluster
 * service-account token, which the kubelet rotates) read again when older than the refresh period,
 * or an `exec` credential plugin's token or client certificate, kept until it expires and run again
 * then. When the server refuses the credentials (401) {@linkcode TokenSource.reload} reads the file
 * or runs the plugin again at once, and the client retries the request once.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { TokenSource } from "./client_token.ts";
 *
 * const source = new TokenSource({ server: "https://k", namespace: "default", source: "t", token: "abc" }, 60_000);
 * assert.equal(await source.header(), "Bearer abc");
 * assert.equal(await source.reload(), false); // no file to read again
 * ```
 *
 * @module
 */
import { readFile } from "node:fs/promises";
import { errorMessage, InvalidOptionsError } from "../../errors.ts";
import type { ExecCredential } from "./client_exec.ts";
import type { KubeConnection } from "./kubeconfig.ts";

/** A client certificate and its key, PEM. */
export interface ClientCertificate {
  /** The certificate. */
  readonly cert: string;
  /** Its key. */
  readonly key: string;
}

/** The client's credentials (see the module doc). */
export class TokenSource {
  #value: string | undefined;
  #readAt = 0;
  #exec: ExecCredential | undefined;
  #running: Promise<ExecCredential> | undefined;
  readonly connection: KubeConnection;
  readonly refreshMs: number;

  constructor(connection: KubeConnection, refreshMs: number) {
    this.connection = connection;
    this.refreshMs = refreshMs;
    this.#value = connection.token;
  }

  /** The `authorization` header, or `undefined` when the client sends none. */
  async header(): Promise<string | undefined> {
    if (this.connection.exec !== undefined) {
      const token = (await this.#credential()).token;
      return token === undefined ? undefined : `Bearer ${token}`;
    }
    const file = this.connection.tokenFile;
    if (file !== undefined && Date.now() - this.#readAt >= this.refreshMs) await this.reload();
    return this.#value === undefined ? undefined : `Bearer ${this.#value}`;
  }

  /** The client certificate an exec plugin gave (the connection's own goes to the transport). */
  async certificate(): Promise<ClientCertificate | undefined> {
    if (this.connection.exec === undefined) return undefined;
    const { cert, key } = await this.#credential();
    return cert !== undefined && key !== undefined ? { cert, key } : undefined;
  }

  /** The plugin's credential: the one held until it expires, else a new run (one at a time). */
  async #credential(): Promise<ExecCredential> {
    const held = this.#exec;
    if (held !== undefined && (held.expiresAt === undefined || held.expiresAt > Date.now())) {
      return held;
    }
    return await this.#run();
  }

  #run(): Promise<ExecCredential> {
    // Loaded only for a kubeconfig with an exec plugin: the others never load node:child_process.
    this.#running ??= import("./client_exec.ts")
      .then(({ runExecPlugin }) => runExecPlugin(this.connection.exec!, this.connection.source))
      .then((credential) => (this.#exec = credential))
      .finally(() => (this.#running = undefined));
    return this.#running;
  }

  /**
   * Gets the credentials again now (the token file re-read, the exec plugin run again); whether
   * they changed.
   */
  async reload(): Promise<boolean> {
    if (this.connection.exec !== undefined) {
      const before = this.#exec;
      const after = await this.#run();
      return before === undefined || after.token !== before.token || after.cert !== before.cert;
    }
    const file = this.connection.tokenFile;
    if (file === undefined) return false;
    const before = this.#value;
    try {
      this.#value = (await readFile(file, "utf8")).trim();
    } catch (err) {
      // A token that vanished mid-run (a rotation in progress) keeps the last one; a first read
      // that fails is the setup's mistake.
      if (before === undefined) {
        throw new InvalidOptionsError(
          `cannot read the token file ${file} (${errorMessage(err)})`,
          { cause: err },
        );
      }
    }
    this.#readAt = Date.now();
    return this.#value !== before;
  }
}
