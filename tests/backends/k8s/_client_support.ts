/**
 * Registration of the Kubernetes API client tests (through tests/_support/test.ts, so they run on
 * Node.js too): skipped loudly when kube-apiserver is not built, unless CI is set.
 */
import { kubeApiserverUnavailable } from "../../../src/backends/k8s/testing/cluster.ts";
import { test } from "../../_support/test.ts";

/** Whether the API server tests are skipped here (no kube-apiserver binary, CI not set). */
export const skipApiServer = kubeApiserverUnavailable() !== undefined;

/** A registrar of tests named `k8s <area>: <name>` that need the API server. */
export function apiServerTests(area: string): (name: string, fn: () => Promise<void>) => void {
  return (name, fn) => test({ name: `k8s ${area}: ${name}`, ignore: skipApiServer, fn });
}
