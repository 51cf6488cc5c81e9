/**
 * The double-write store's development harness: its nemesis hooks (`./nemesis.ts`), composed of
 * the etcd and Kubernetes harnesses'. It is no backend of the registry (no `--store` scheme names
 * it; the CLI opens it from `--identity-allocation-mode`), so the nemesis lists it beside the
 * registry's backends (`nemesis/composed.ts`). Not published.
 *
 * @module
 */
import type { ComposedHarness } from "../../../testing/harness_contract.ts";
import { etcdUnavailable } from "../../etcd/testing/cluster.ts";
import { kubeApiserverUnavailable } from "../../k8s/testing/cluster.ts";
import { doubleWriteNemesis } from "./nemesis.ts";
import { DOUBLEWRITE_KIND } from "./nemesis_spec.ts";

/** The double-write harness: it needs both an etcd binary and a kube-apiserver. */
export const harness: ComposedHarness = {
  kind: DOUBLEWRITE_KIND,
  unavailable: () => etcdUnavailable() ?? kubeApiserverUnavailable(),
  nemesis: doubleWriteNemesis,
};
