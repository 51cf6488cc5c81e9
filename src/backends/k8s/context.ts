/**
 * What the parts of a Kubernetes session share: the client, the validated options, the node, the
 * namespace of its Leases, the resources it works on and the backend's store telemetry.
 *
 * @module
 */
import type { StoreTelemetry } from "../../telemetry/store.ts";
import type { ServerClock } from "./clock.ts";
import type { KubeClient, KubeResource } from "./kube.ts";
import type { K8sSettings } from "./options.ts";

/** The shared state of one backend and its sessions. */
export interface K8sContext {
  /** The API server. */
  readonly client: KubeClient;
  /** The backend's options, validated, with defaults. */
  readonly settings: K8sSettings;
  /** This node's name. */
  readonly node: string;
  /** The coordination namespace: of the node Leases and key claims (`coordination.ts`). */
  readonly namespace: string;
  /** This process's clock against the API server's (`clock.ts`), measured by Lease writes. */
  readonly clock: ServerClock;
  /** The identity resource. */
  readonly identities: KubeResource;
  /** `apiVersion` and `kind` of identity objects. */
  readonly identityKind: { readonly apiVersion: string; readonly kind: string };
  /** `<plural>.<group>` of the identity resource (claims hash it in). */
  readonly resourceName: string;
  /**
   * The backend's store telemetry: the client's round trips are timed through it
   * (`telemetry.ts`); the lease keeper records renewals, the informer re-lists and reconnects.
   */
  readonly telemetry: StoreTelemetry;
  /** The endpoint resource GC reads, if any. */
  readonly endpoints?: KubeResource;
  /** The endpoint-slice resource GC reads, if any (cluster-scoped). */
  readonly endpointSlices?: KubeResource;
}
