/**
 * TLS failures in the words an operator needs, for every backend that speaks TLS (etcd,
 * Kubernetes): which {@linkcode TlsProblem} a TLS stack's message describes (Node's and rustls'
 * words), and why a PEM file is not a usable certificate (chain) before a handshake would only
 * say "unable to verify".
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { certificateProblem, tlsProblemOf } from "./tls.ts";
 *
 * assert.equal(tlsProblemOf(new Error("self-signed certificate in certificate chain")), "untrusted");
 * assert.equal(certificateProblem("not a PEM file"), "it holds no -----BEGIN CERTIFICATE----- block");
 * ```
 *
 * @module
 */
import { X509Certificate } from "node:crypto";
import { errorMessage, type TlsProblem } from "../../errors.ts";

/** What went wrong with TLS, from the TLS stack's message (Node's and rustls' words). */
export function tlsProblemOf(err: unknown): TlsProblem {
  const text = errorMessage(err);
  if (/servername.*must not be an IP address/i.test(text)) return "ip-server-name";
  if (/ALTNAME_INVALID|does not match certificate's altnames|NotValidForName/i.test(text)) {
    return "name-mismatch";
  }
  if (/BadCertificate|CertificateRequired|certificate required|UnknownCA.*alert/i.test(text)) {
    return "client-certificate";
  }
  if (/wrong version number|InvalidContentType|disconnected before secure TLS/i.test(text)) {
    return "not-tls";
  }
  if (/unable to verify|self.signed|local issuer|UnknownIssuer|certificate/i.test(text)) {
    return "untrusted";
  }
  return "handshake";
}

/**
 * Why `pem` is not a usable PEM certificate (chain), or `undefined` when every block parses. The
 * TLS stack would only say "unable to verify the first certificate" about such a file, the same
 * words as for a CA that did not sign the server's certificate.
 */
export function certificateProblem(pem: string): string | undefined {
  const blocks = pem.match(/-----BEGIN CERTIFICATE-----[\s\S]*?-----END CERTIFICATE-----/g);
  if (blocks === null) return "it holds no -----BEGIN CERTIFICATE----- block";
  for (const [i, block] of blocks.entries()) {
    try {
      new X509Certificate(block);
    } catch (err) {
      const which = blocks.length > 1 ? `certificate ${i + 1} of ${blocks.length}` : "it";
      return `${which} does not parse (${errorMessage(err)})`;
    }
  }
  return undefined;
}
