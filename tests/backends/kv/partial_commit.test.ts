// Deno KV's partial commit (docs/deno-kv-partial-commit.md): the store behaviour the backend's
// commit ordering relies on. A Deno release that changes it fails this test.
import assert from "node:assert/strict";
import { reproduce } from "../../../docs/deno-kv-partial-commit.ts";

Deno.test("deno kv: a failing sum keeps the mutations before it, not those after", async () => {
  const dir = await Deno.makeTempDir({ prefix: "idalloc-kv-partial-" });
  try {
    for (const path of [`${dir}/repro.kv`, ":memory:"]) {
      using kv = await Deno.openKv(path);
      const observed = await reproduce(kv);
      assert.match(observed.error ?? "", /non-U64/, path);
      assert.deepEqual(
        { ...observed, error: undefined },
        {
          error: undefined,
          setBeforeSumApplied: true,
          setAfterSumApplied: false,
          goodSumBeforeApplied: true,
          failedCheckAppliesNothing: true,
        },
        path,
      );
    }
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});
