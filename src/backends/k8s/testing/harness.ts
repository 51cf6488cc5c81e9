/**
 * The Kubernetes backend's development harness: its fixture for the shared test suites (a private
 * kube-apiserver per test process, a fresh CRD group and namespace per fixture), its nemesis hooks
 * (`./nemesis.ts`: API-server and etcd faults, 410), its bench opener and a private API server for
 * the examples, loaded by kind through `src/testing/harness.ts`, which finds it in this folder by the driver. Not published.
 *
 * @module
 */
import type { BackendHarness } from "../../../testing/harness_contract.ts";
import { k8sBench } from "./bench.ts";
import { findKubeApiserver, kubeApiserverUnavailable, startKubeApiServer } from "./cluster.ts";
import { k8sFactory } from "./fixture.ts";
import { k8sNemesis } from "./nemesis.ts";

/** The Kubernetes harness. */
export const harness: BackendHarness = {
  kind: "k8s",
  unavailable: kubeApiserverUnavailable,
  fixture: k8sFactory,
  nemesis: k8sNemesis,
  bench: k8sBench,
  async server() {
    if (findKubeApiserver() === undefined) return undefined;
    // Cilium's own CRDs (cilium.io) installed, as on a cluster running Cilium in CRD mode.
    const cluster = await startKubeApiServer();
    try {
      const kubeconfig = await cluster.kubeconfig("admin", {
        context: "idalloc-example",
        namespace: "default",
        current: true,
      });
      return {
        endpoints: [cluster.server],
        kubeconfig,
        close: () => cluster.close(),
        [Symbol.asyncDispose]: () => cluster.close(),
      };
    } catch (err) {
      await cluster.close();
      throw err;
    }
  },
};
