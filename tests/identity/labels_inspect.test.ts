/**
 * A label set shows its labels in `console.log`, `Deno.inspect`, Node's `util.inspect` and JSON
 * (its labels live in private fields: it used to print as `Labels {}`).
 */
import assert from "node:assert/strict";
import { inspect } from "node:util";
import { Labels } from "../../src/identity/mod.ts";
import { runtime } from "../../src/testing/runtime.ts";
import { test } from "../_support/test.ts";

const labels = Labels.parse(["k8s:app=web", "k8s:io.kubernetes.pod.namespace=prod"]);

test({
  name: "Deno.inspect shows a label set's labels",
  ignore: runtime !== "deno",
  fn: () => {
    assert.equal(
      Deno.inspect(labels),
      'Labels(2) [ "k8s:app=web", "k8s:io.kubernetes.pod.namespace=prod" ]',
    );
    // Nested, as console.log(identity) prints it.
    const identity = { id: 16352, labels };
    assert.match(Deno.inspect(identity), /labels: Labels\(2\) \[ "k8s:app=web", "k8s:io/);
    assert.equal(Deno.inspect(Labels.empty), "Labels(0) []");
  },
});

test("node:util inspect and JSON show the labels too", () => {
  assert.match(inspect({ labels }), /labels: Labels\(2\) \[ 'k8s:app=web', 'k8s:io/);
  assert.equal(
    JSON.stringify({ labels }),
    '{"labels":["k8s:app=web","k8s:io.kubernetes.pod.namespace=prod"]}',
  );
});
