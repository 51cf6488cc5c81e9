// `allocate` ends within its signal even while a deletion of the key's reference hangs in the store
// (the mixed nemesis: 12.5 s on a 10 s signal while etcd was down under the API server), and the
// deletion it had cancelled to re-acquire still happens: no reference outlives the call.
import assert from "node:assert/strict";
import { Allocator } from "../../mod.ts";
import type { Backend } from "../../src/allocator/backend.ts";
import { SessionDouble } from "./_session_double.ts";

Deno.test("allocate ends within its signal while the key's deletion hangs, and the deletion still lands", async () => {
  const session = new SessionDouble();
  const backend = {
    kind: "session-double",
    node: "n",
    checkKey() {},
    openSession: () => Promise.resolve(session),
    admin(): never {
      throw new Error("no admin view");
    },
  } as unknown as Backend;
  await using alloc = await Allocator.open(backend, {
    min: 1,
    max: 100,
    releaseInBackground: true,
  });
  await alloc.allocate("a;");
  let open!: () => void;
  session.releaseSteps.push(new Promise<void>((resolve) => open = resolve));
  await alloc.release("a;");
  // The deletion is in flight and the store does not answer: the call must give up at its signal.
  let bound: ReturnType<typeof setTimeout> | undefined;
  const stuck = new Promise<"stuck">((resolve) => {
    bound = setTimeout(() => resolve("stuck"), 10_000);
  });
  const outcome = await Promise.race([
    alloc.allocate("a;", { signal: AbortSignal.timeout(100) }).then(
      () => "allocated",
      (err: Error) => err.name,
    ),
    stuck,
  ]);
  clearTimeout(bound);
  assert.equal(outcome, "TimeoutError");
  open();
  await alloc.flush();
  assert.equal(session.references.has("a;"), false, "the reference went after all");
});
