// The acquire protocol's steps on plain data: join Cilium's answer or claim the key; follow a
// claim (join what it names, touch it to re-create a missing one, confirm a foreign key before
// moving it, move one outside the range or naming nothing); after reading an identity, join it,
// touch the claim to re-create it, or move the claim off it. On the real API server: with its
// identity watch lagging (failing, or expired and not re-listed), a node looks in the store before
// it creates, and joins the identity a Cilium agent created meanwhile; the common path's round
// trips stay as they were.
import assert from "node:assert/strict";
import { afterClaimRead, afterIdentityRead, firstStep } from "../../../src/backends/k8s/acquire.ts";
import { usable } from "../../../src/backends/shared/candidates.ts";
import {
  readIdentity,
  sanitizedLabels,
  securityLabelsOf,
} from "../../../src/backends/k8s/layout.ts";
import { K8sBackend } from "../../../src/backends/k8s/backend.ts";
import type { ListOptions, WatchOptions } from "../../../src/backends/k8s/client.ts";
import { KubeApiError } from "../../../src/backends/k8s/errors.ts";
import type { KubeClient, KubeResource } from "../../../src/backends/k8s/kube.ts";
import type { K8sSession } from "../../../src/backends/k8s/session.ts";
import { abortable } from "../../../src/abort.ts";
import { StoreUnavailableError } from "../../../src/errors.ts";
import { deadline, eventually, fixture, type K8sFixture, k8sTest } from "./_helpers.ts";

const RANGE = { min: 256, max: 65535 };
const claim = (id: number, key = "k") => ({ name: "idalloc-key-x", key, id, rv: "5" });

Deno.test("first step: join Cilium's answer when the index has one, else claim the key", () => {
  assert.deepEqual(firstStep("k", undefined, RANGE), { kind: "claim" });
  assert.deepEqual(firstStep("k", { id: 300, annotated: false }, RANGE), {
    kind: "join",
    id: 300,
    annotated: false,
  });
  assert.throws(() => firstStep("k", { id: 7, annotated: true }, RANGE), {
    name: "InvalidIdError",
  });
  assert.equal(usable(undefined, 7), true);
  assert.equal(usable(RANGE, 0), false);
});

Deno.test("after reading the claim: follow it", () => {
  assert.deepEqual(afterClaimRead("k", undefined, undefined, RANGE), { kind: "claim" });
  // Its identity is missing: touch the claim (under the version read) before re-creating it.
  assert.deepEqual(afterClaimRead("k", claim(300), undefined, RANGE), {
    kind: "touch",
    id: 300,
    claimRv: "5",
  });
  assert.deepEqual(afterClaimRead("k", claim(300), { key: "k", annotated: true }, RANGE), {
    kind: "join",
    id: 300,
    annotated: true,
    claimRv: "5",
  });
  // The index says another key: read it before moving the claim (the index may lag).
  assert.deepEqual(afterClaimRead("k", claim(300), { key: "j", annotated: true }, RANGE), {
    kind: "readIdentity",
    id: 300,
    claimRv: "5",
  });
  assert.deepEqual(afterClaimRead("k", claim(7), undefined, RANGE), {
    kind: "moveClaim",
    from: 7,
    claimRv: "5",
  });
  assert.throws(() => afterClaimRead("k", claim(300, "other"), undefined, RANGE), {
    name: "CorruptEntryError",
  });
  // Naming no key or ID (hand-made): garbage must cost no key, so it is moved like a stale one.
  assert.deepEqual(afterClaimRead("k", { undecodable: true, rv: "5" }, undefined, RANGE), {
    kind: "moveClaim",
    claimRv: "5",
  });
});

Deno.test("after reading the identity: join it, create it, or move the claim off it", () => {
  const of = (key: string) =>
    readIdentity({
      metadata: { name: "300", resourceVersion: "9", annotations: { a: "b" } },
      "security-labels": { "idalloc:key": key },
    });
  assert.deepEqual(afterIdentityRead("k", 300, undefined, "5"), {
    kind: "touch",
    id: 300,
    claimRv: "5",
  });
  assert.deepEqual(afterIdentityRead("k", 300, undefined, undefined), { kind: "claim" });
  assert.deepEqual(afterIdentityRead("k", 300, of("k"), "5"), {
    kind: "join",
    id: 300,
    annotated: true,
    claimRv: "5",
  });
  assert.deepEqual(afterIdentityRead("k", 300, of("k"), undefined), {
    kind: "join",
    id: 300,
    annotated: true,
  });
  assert.deepEqual(afterIdentityRead("k", 300, of("j"), "5"), {
    kind: "moveClaim",
    from: 300,
    claimRv: "5",
  });
  assert.deepEqual(afterIdentityRead("k", 300, of("j"), undefined), { kind: "claim" });
  const damaged = readIdentity({ metadata: { name: "300" }, "security-labels": { x: "y" } });
  assert.deepEqual(afterIdentityRead("k", 300, damaged, "5"), {
    kind: "moveClaim",
    from: 300,
    claimRv: "5",
  });
  // Damaged, but idalloc's (it carries references) and the claim names it: repaired, not replaced.
  const ours = readIdentity({
    metadata: { name: "300", resourceVersion: "8", annotations: { "ref.idalloc.io/a": "e1" } },
    "security-labels": { x: "y" },
  });
  assert.deepEqual(afterIdentityRead("k", 300, ours, "5"), {
    kind: "repair",
    id: 300,
    rv: "8",
    annotated: true,
    claimRv: "5",
  });
  assert.deepEqual(afterIdentityRead("k", 300, ours, undefined), { kind: "claim" });
});

// On the real API server: an idalloc node whose identity watch lags must not create a second
// identity for a key a Cilium agent gave one meanwhile (the mixed nemesis, seed 4).

/** The identity watch of a client, under the test's control (see {@linkcode laggingWatch}). */
interface WatchGate {
  /** The client to give the backend. */
  readonly client: KubeClient;
  /** Watches of the identities started so far (the informer's retries count). */
  readonly attempts: number;
  /** Re-lists held so far (forced expiry). */
  readonly relists: number;
  /** Breaks the watch now, and fails every new one (a watch failing over and over). */
  fail(): void;
  /** Ends the watch now with `410 Gone`, and holds the informer's re-list that follows. */
  expire(): void;
  /** Back to normal: watches pass, a held re-list goes out. */
  release(): void;
}

/**
 * `client` with its watch of `identities` under the test's control, every other call passed on to
 * the real API server: the lags of seed 4 (the watch failing over and over after a fault) and of a
 * forced watch expiry whose re-list does not complete. The informer's own re-list is a list
 * without a label selector; the look before a create selects by the key's labels and passes.
 */
function laggingWatch(client: KubeClient, identities: KubeResource): WatchGate {
  let mode: "live" | "failing" | "expired" = "live";
  let attempts = 0;
  let relists = 0;
  let released = Promise.withResolvers<void>();
  const current = new Set<{ controller: AbortController; error?: Error }>();
  const ours = (res: KubeResource) =>
    res.plural === identities.plural && res.group === identities.group;
  const breakAll = (error: Error) => {
    for (const w of current) {
      w.error = error;
      w.controller.abort();
    }
  };
  async function* watch(res: KubeResource, options: WatchOptions) {
    attempts++;
    if (mode === "failing") throw new StoreUnavailableError("the test holds the watch (failing)");
    const w: { controller: AbortController; error?: Error } = { controller: new AbortController() };
    const onAbort = () => w.controller.abort();
    options.signal?.addEventListener("abort", onAbort, { once: true });
    current.add(w);
    try {
      yield* client.watch(res, { ...options, signal: w.controller.signal });
    } finally {
      current.delete(w);
      options.signal?.removeEventListener("abort", onAbort);
    }
    if (w.error !== undefined && !options.signal?.aborted) throw w.error;
  }
  const gated = new Proxy(client, {
    get(target, prop) {
      if (prop === "watch") {
        return (res: KubeResource, o: WatchOptions) =>
          ours(res) ? watch(res, o) : target.watch(res, o);
      }
      if (prop === "list") {
        return async (res: KubeResource, o?: ListOptions) => {
          if (mode === "expired" && ours(res) && o?.labelSelector === undefined) {
            relists++;
            await abortable(released.promise, o?.signal);
          }
          return await target.list(res, o);
        };
      }
      const value = Reflect.get(target, prop, target);
      return typeof value === "function" ? value.bind(target) : value;
    },
  });
  return {
    client: gated,
    get attempts() {
      return attempts;
    },
    get relists() {
      return relists;
    },
    fail() {
      mode = "failing";
      breakAll(new StoreUnavailableError("the test broke the watch"));
    },
    expire() {
      mode = "expired";
      breakAll(KubeApiError.fromStatus({
        kind: "Status",
        code: 410,
        reason: "Expired",
        message: "too old resource version (forced by the test)",
      }, 410));
    },
    release() {
      mode = "live";
      released.resolve();
      released = Promise.withResolvers<void>();
    },
  };
}

/** Creates identity `id` of `key` as Cilium v1.16's CRD backend does (`AllocateID`): no claim. */
async function ciliumCreates(fx: K8sFixture, id: number, key: string): Promise<void> {
  const labels = securityLabelsOf(key);
  await fx.client.create(fx.identities, {
    apiVersion: `${fx.group}/v2`,
    kind: "CiliumIdentity",
    metadata: { name: String(id), labels: sanitizedLabels(labels) },
    "security-labels": labels,
  }, { signal: deadline() });
}

for (const lag of ["failing", "expired"] as const) {
  k8sTest(
    `a lagging identity watch (${lag}): acquire joins the identity a Cilium agent created meanwhile, and a current one costs no extra round trip`,
    async () => {
      await using fx = await fixture();
      const gate = laggingWatch(fx.client, fx.identities);
      await using backend = await K8sBackend.connect(fx.options("w"), { client: gate.client });
      const session = await backend.openSession({
        leaseTtlMs: 60_000,
        readOnly: false,
        onLeaseReplaced: () => {},
      }) as K8sSession;
      await session.informer.waitSynced(deadline());
      const acquire = async (key: string, id: number) => {
        const tally = { count: 0 };
        const got = await session.acquire({
          key,
          pickCandidate: (exclude) => (exclude.has(id) ? undefined : id),
          signal: deadline(),
          roundTrips: tally,
        });
        return { ...got, requests: tally.count };
      };

      // The common path, an index the watch keeps current: a new key is 3 requests (the claim
      // and the reference in parallel, then the create), as before the look existed.
      const before = await acquire("k8s:app=k1;", 300);
      assert.deepEqual([before.id, before.created, before.requests], [300, true, 3]);

      // The watch lags from here: it fails over and over, or expired and cannot re-list.
      const started = gate.attempts;
      if (lag === "failing") {
        gate.fail();
        await eventually(() => gate.attempts >= started + 2, "the informer retried the watch");
      } else {
        gate.expire();
        await eventually(() => gate.relists >= 1, "the informer is re-listing");
      }
      // A Cilium agent gives k39 its identity; the lagging index cannot show it.
      const key = "k8s:app=k39;";
      await ciliumCreates(fx, 700, key);
      assert.equal(session.informer.index.answer(key), undefined, "the index lags");

      const lagged = await acquire(key, 301);
      assert.deepEqual([lagged.id, lagged.created], [700, false], "Cilium's identity, joined");
      const stored = (await fx.records()).filter((r) => r.key === key).map((r) => r.id);
      assert.deepEqual(stored, [700], "no second identity of the key");
      assert.deepEqual([...await fx.held("w")].map(([id]) => id).sort(), [300, 700]);
      console.log(
        `round trips: new key, index current: ${before.requests} requests; ` +
          `index lagging (${lag}), joining Cilium's: ${lagged.requests} requests`,
      );

      // Back to normal: once the index is current again, a new key costs what it did.
      gate.release();
      await eventually(() => session.informer.freshness.current, "the index is current again");
      const after = await acquire("k8s:app=k2;", 302);
      assert.deepEqual([after.id, after.created, after.requests], [302, true, 3]);
    },
  );
}
