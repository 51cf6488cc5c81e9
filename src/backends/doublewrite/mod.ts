/**
 * Cilium v1.17's double-write identity modes on idalloc: {@linkcode DoubleWriteBackend} writes
 * every identity to both of Cilium's stores — the kvstore (etcd, `@idalloc/idalloc/etcd`) and
 * the CRDs (Kubernetes, `@idalloc/idalloc/k8s`) — and reads the side its mode names, so that a
 * cluster moves between them without renumbering (`kvstore` → `doublewrite-readkvstore` →
 * `doublewrite-readcrd` → `crd`, or back). {@linkcode identityDrift} counts each side's
 * identities and those on one side only, as Cilium's operator does; a writable session reports the
 * same counts as metrics (`idalloc.identity.{kvstore,crd}.{total,only}_count`), and the backend's
 * doctor ({@linkcode DoubleWriteBackend.findDamage}, {@linkcode findDrift}) names each drift and
 * repairs it under the stores' guards ({@linkcode DriftRepairer}).
 *
 * @example Allocate in `doublewrite-readkvstore` (needs etcd and an API server: a function here)
 * ```ts
 * import { Allocator } from "@idalloc/idalloc";
 * import { EtcdBackend } from "@idalloc/idalloc/etcd";
 * import { K8sBackend } from "@idalloc/idalloc/k8s";
 * import { DoubleWriteBackend } from "@idalloc/idalloc/doublewrite";
 *
 * // Needs etcd and an API server: a function here, so that the doc tests type-check it without
 * // calling it.
 * async function webIdentity(): Promise<number> {
 *   await using kvstore = await EtcdBackend.connect({ endpoints: ["http://127.0.0.1:2379"], node: "n1" });
 *   await using crd = await K8sBackend.connect({ node: "n1", kubeconfig: "kubeconfig" });
 *   const backend = new DoubleWriteBackend({ mode: "doublewrite-readkvstore", kvstore, crd });
 *   await using alloc = await Allocator.open(backend, { min: 256, max: 65535 });
 *   return (await alloc.allocate("k8s:app=web;")).id;
 * }
 * ```
 *
 * @module
 */
export {
  bothAdmins,
  DoubleWriteBackend,
  type DoubleWriteOptions,
  identityDrift,
} from "./backend.ts";
export { countDrift, type DriftCount, type SideCount } from "./drift.ts";
export { listMasters } from "./masters.ts";
export {
  bothDoctors,
  CILIUM_USE,
  classifyDrift,
  type DoctorSides,
  type Drift,
  DRIFT_KINDS,
  type DriftKind,
  DriftRepairer,
  type DriftRepairOptions,
  findDrift,
  isDriftKind,
} from "./doctor.ts";
export { DoubleWriteConflictError } from "./errors.ts";
export {
  type DoubleWriteMode,
  IDENTITY_ALLOCATION_MODES,
  type IdentityAllocationMode,
  isDoubleWrite,
  parseIdentityAllocationMode,
  readSideOf,
  type Side,
} from "./mode.ts";
export { ConflictError, IdallocError, type IdallocErrorOptions } from "../../errors.ts";
export type * from "../../allocator/backend.ts";
export type * from "../../allocator/damage.ts";
