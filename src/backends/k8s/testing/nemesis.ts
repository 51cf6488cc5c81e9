/**
 * The Kubernetes nemesis hooks: not built yet. The shared test suites run on this backend (see
 * `./fixture.ts`); the nemesis — worker kills and stalls, API-server restarts, an etcd restart
 * under the API server, forced watch expiry (410), with the history and store checks — is to come
 * (issue 31 item 8). Until then a nemesis run on `k8s` is skipped with {@linkcode WHY}, and no
 * fault or garbage kind is offered.
 *
 * @module
 */
import type { NemesisHooks } from "../../../testing/nemesis.ts";

/** Why a nemesis run on this backend is skipped. */
export const WHY = "the Kubernetes nemesis hooks are not built yet (issue 31 item 8)";

function notBuilt(): Promise<never> {
  return Promise.reject(new Error(`nemesis on k8s: ${WHY}`));
}

/** The Kubernetes nemesis hooks: every run skipped (see the module doc). */
export const k8sNemesis: NemesisHooks = {
  unavailable: () => WHY,
  faults: [],
  garbageKinds: [],
  overhead: { fixed: 0, share: 0 },
  cilium: false,
  timings: (_name, timings) => timings,
  startRun: notBuilt,
  startGrowth: notBuilt,
  openStore: notBuilt,
  openBackend: notBuilt,
  growth: {
    check: () => {},
    columns: [],
    row: () => [],
  },
};
