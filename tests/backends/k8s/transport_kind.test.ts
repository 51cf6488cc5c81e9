// How a transport error is classified, on plain errors: a peer that goes away during the TLS
// handshake (a restarting API server) is a dropped connection, retried; a certificate the client
// distrusts stays a TLS setup problem.
import assert from "node:assert/strict";
import { transportFailureKind } from "../../../src/backends/k8s/failure.ts";

Deno.test("k8s transport failure: an EOF mid-handshake is a reset, a bad certificate is TLS", () => {
  const eof = new TypeError("client error (Connect)", {
    cause: new Error(
      "peer closed connection without sending TLS close_notify: " +
        "https://docs.rs/rustls/latest/rustls/manual/_03_howto/index.html#unexpected-eof",
    ),
  });
  assert.equal(transportFailureKind(eof), "reset");
  const untrusted = new TypeError("client error (Connect)", {
    cause: new Error("invalid peer certificate: UnknownIssuer"),
  });
  assert.equal(transportFailureKind(untrusted), "tls");
});
