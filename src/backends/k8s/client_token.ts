/**
 * The bearer token of a client: the kubeconfig's `token`, or a `tokenFile` (the in-cluster
 * service-account token, which the kubelet rotates) read again when older than the refresh period
 * — and at once when the server refuses it (the client then retries the request once).
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
import type { KubeConnection } from "./kubeconfig.ts";

/** The bearer token, re-read from its file when older than the refresh period. */
export class TokenSource {
  #value: string | undefined;
  #readAt = 0;
  readonly connection: KubeConnection;
  readonly refreshMs: number;

  constructor(connection: KubeConnection, refreshMs: number) {
    this.connection = connection;
    this.refreshMs = refreshMs;
    this.#value = connection.token;
  }

  async header(): Promise<string | undefined> {
    const file = this.connection.tokenFile;
    if (file !== undefined && Date.now() - this.#readAt >= this.refreshMs) await this.reload();
    return this.#value === undefined ? undefined : `Bearer ${this.#value}`;
  }

  /** Re-reads the file now; whether the token changed. */
  async reload(): Promise<boolean> {
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
