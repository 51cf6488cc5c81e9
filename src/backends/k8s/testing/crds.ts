/**
 * The CustomResourceDefinitions the Kubernetes backend's tests install, as plain objects: Cilium
 * v1.16's `CiliumIdentity` (cluster-scoped, `cilium.io/v2`, `security-labels`), `CiliumEndpoint`
 * (namespaced, `status.identity.id`) and `CiliumEndpointSlice` (cluster-scoped,
 * `cilium.io/v2alpha1`, `endpoints[].id`), with Cilium's names, scope and the schema
 * of every field idalloc reads or writes, copied from Cilium's generated CRDs
 * (`pkg/k8s/apis/cilium.io/client/crds/v2/`, `…/v2alpha1/`). CI has no Cilium build, so the tests take them from
 * here; `tests/backends/k8s/client_cluster.test.ts` checks them against Cilium's own YAML where a
 * Cilium build left it (`~/.cache/cilium-node/crds/`). Descriptions are left out.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { identityCrd } from "./crds.ts";
 *
 * const crd = identityCrd("t1.idalloc.test");
 * assert.equal(crd.metadata.name, "ciliumidentities.t1.idalloc.test");
 * assert.equal(crd.spec.scope, "Cluster");
 * ```
 *
 * @module
 */

/** A CustomResourceDefinition as JSON (the fields these manifests use). */
export interface CrdManifest {
  /** `apiextensions.k8s.io/v1`. */
  readonly apiVersion: "apiextensions.k8s.io/v1";
  /** `CustomResourceDefinition`. */
  readonly kind: "CustomResourceDefinition";
  /** `<plural>.<group>`. */
  readonly metadata: { readonly name: string };
  /** Group, names, scope, versions and their schemas. */
  readonly spec: {
    readonly group: string;
    readonly names: {
      readonly kind: string;
      readonly listKind: string;
      readonly plural: string;
      readonly singular: string;
      readonly shortNames: readonly string[];
      readonly categories: readonly string[];
    };
    readonly scope: "Cluster" | "Namespaced";
    readonly versions: readonly {
      readonly name: string;
      readonly served: boolean;
      readonly storage: boolean;
      readonly schema: { readonly openAPIV3Schema: Record<string, unknown> };
      readonly subresources?: Record<string, unknown>;
    }[];
  };
}

/** Cilium's group. */
export const CILIUM_GROUP = "cilium.io";

/** The API server's CustomResourceDefinitions, as a resource the client reads and writes. */
export const CRD_RESOURCE = {
  group: "apiextensions.k8s.io",
  version: "v1",
  plural: "customresourcedefinitions",
  namespaced: false,
  kind: "CustomResourceDefinition",
} as const;

/** Namespaces, as a resource the client reads and writes. */
export const NAMESPACE_RESOURCE = {
  group: "",
  version: "v1",
  plural: "namespaces",
  namespaced: false,
} as const;

/** The fields every object has (Cilium's CRDs declare them so). */
const objectFields = {
  apiVersion: { type: "string" },
  kind: { type: "string" },
  metadata: { type: "object" },
} as const;

/** A Cilium CRD (v2 only, as Cilium v1.16 serves them) of `kind`, in `group`. */
function ciliumCrd(
  group: string,
  kind: string,
  shortNames: readonly string[],
  scope: "Cluster" | "Namespaced",
  schema: Record<string, unknown>,
  subresources: Record<string, unknown>,
): CrdManifest {
  const singular = kind.toLowerCase();
  const plural = singular.endsWith("y") ? `${singular.slice(0, -1)}ies` : `${singular}s`;
  return {
    apiVersion: "apiextensions.k8s.io/v1",
    kind: "CustomResourceDefinition",
    metadata: { name: `${plural}.${group}` },
    spec: {
      group,
      names: {
        categories: ["cilium"],
        kind,
        listKind: `${kind}List`,
        plural,
        shortNames,
        singular,
      },
      scope,
      versions: [{
        name: "v2",
        served: true,
        storage: true,
        schema: { openAPIV3Schema: { type: "object", ...schema } },
        subresources,
      }],
    },
  };
}

/**
 * Cilium's `CiliumIdentity` CRD, in `group` (Cilium's own by default; tests install copies under
 * a fresh group each, so that fixtures do not see each other's identities).
 */
export function identityCrd(group: string = CILIUM_GROUP): CrdManifest {
  return ciliumCrd(group, "CiliumIdentity", ["ciliumid"], "Cluster", {
    required: ["metadata", "security-labels"],
    properties: {
      ...objectFields,
      "security-labels": { type: "object", additionalProperties: { type: "string" } },
    },
  }, { status: {} });
}

/**
 * Cilium's `CiliumEndpoint` CRD (`group` as for {@linkcode identityCrd}), with the status fields a
 * Cilium agent writes that name the identity and the endpoint; Cilium's other status fields
 * (policy, networking, controllers…) are kept as given rather than described.
 */
export function endpointCrd(group: string = CILIUM_GROUP): CrdManifest {
  return ciliumCrd(group, "CiliumEndpoint", ["cep", "ciliumep"], "Namespaced", {
    required: ["metadata"],
    properties: {
      ...objectFields,
      status: {
        type: "object",
        "x-kubernetes-preserve-unknown-fields": true,
        properties: {
          id: { type: "integer", format: "int64" },
          identity: {
            type: "object",
            properties: {
              id: { type: "integer", format: "int64" },
              labels: { type: "array", items: { type: "string" } },
            },
          },
          state: { type: "string" },
        },
      },
    },
  }, {});
}

/**
 * Cilium's `CiliumEndpointSlice` CRD (`group` as for {@linkcode identityCrd}): cluster-scoped,
 * served as `v2alpha1` (Cilium v1.16), with the slim endpoints (`endpoints[]`: `name`, the
 * identity's `id`, `networking`, `encryption`, `named-ports`) and the slice's `namespace`, as
 * Cilium's operator writes them with CES enabled.
 */
export function endpointSliceCrd(group: string = CILIUM_GROUP): CrdManifest {
  const crd = ciliumCrd(group, "CiliumEndpointSlice", ["ces"], "Cluster", {
    required: ["endpoints", "metadata"],
    properties: {
      ...objectFields,
      namespace: { type: "string" },
      endpoints: {
        type: "array",
        items: {
          type: "object",
          properties: {
            name: { type: "string" },
            id: { type: "integer", format: "int64" },
            encryption: { type: "object", properties: { key: { type: "integer" } } },
            "named-ports": {
              type: "array",
              items: {
                type: "object",
                properties: {
                  name: { type: "string" },
                  port: { type: "integer" },
                  protocol: { type: "string" },
                },
              },
            },
            networking: {
              type: "object",
              required: ["addressing"],
              properties: {
                addressing: {
                  type: "array",
                  items: {
                    type: "object",
                    properties: { ipv4: { type: "string" }, ipv6: { type: "string" } },
                  },
                },
                node: { type: "string" },
              },
            },
          },
        },
      },
    },
  }, {});
  // Cilium v1.16 serves endpoint slices as v2alpha1 only, without a status subresource.
  const [version] = crd.spec.versions;
  const { subresources: _none, ...served } = version;
  return { ...crd, spec: { ...crd.spec, versions: [{ ...served, name: "v2alpha1" }] } };
}
