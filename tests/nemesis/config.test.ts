// The nemesis fault list: names, garbage kinds and removals, as .ci/run and the README use them.
import assert from "node:assert/strict";
import { FAULT_KINDS, parseFaults } from "../../nemesis/config.ts";
import { GARBAGE_KINDS } from "../../nemesis/stores/store.ts";

Deno.test("nemesis faults: 'all', and removals that start from everything", () => {
  assert.deepEqual([...parseFaults("all").faults], [...FAULT_KINDS]);
  const { faults, garbage } = parseFaults("-stall,-garbage/bad-index,-garbage/oversized");
  assert.ok(!faults.has("stall") && faults.has("kill") && faults.has("garbage"));
  assert.deepEqual(
    [...garbage],
    GARBAGE_KINDS.filter((g) => g !== "bad-index" && g !== "oversized"),
  );
});

Deno.test("nemesis faults: a list of names, one garbage kind, no garbage at all", () => {
  const only = parseFaults("stall,garbage/orphan-ref");
  assert.deepEqual([...only.faults], ["stall", "garbage"]);
  assert.deepEqual([...only.garbage], ["orphan-ref"]);
  const none = parseFaults("-garbage");
  assert.ok(!none.faults.has("garbage"));
  assert.equal(none.garbage.size, 0);
});

Deno.test("nemesis faults: unknown names are refused", () => {
  assert.throws(() => parseFaults("stal"), /unknown fault 'stal'/);
  assert.throws(() => parseFaults("garbage/huge"), /unknown garbage kind 'huge'/);
});
