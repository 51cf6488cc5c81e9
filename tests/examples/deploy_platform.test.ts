/**
 * The Deploy example names an isolate's node from the variables today's Deno Deploy sets
 * (`DENO_TIMELINE`, `DENO_DEPLOYMENT_ID`; Deploy Classic's `DENO_REGION` is not set any more).
 */
import assert from "node:assert/strict";
import { isolateNode } from "../../examples/deploy/main.ts";

function env(vars: Record<string, string>): Pick<typeof Deno.env, "get"> {
  return { get: (name: string) => vars[name] };
}

Deno.test("deploy: a node name says the timeline and deployment, and never holds '/'", () => {
  const branch = isolateNode(
    env({ DENO_TIMELINE: "git-branch/feat/x", DENO_DEPLOYMENT_ID: "0123456789abcdef" }),
  );
  assert.match(branch, /^deploy-git-branch-feat-x-0123456789ab-[0-9a-f]{8}$/);
  assert.match(
    isolateNode(env({ DENO_TIMELINE: "production", DENO_DEPLOYMENT_ID: "d1" })),
    /^deploy-production-d1-[0-9a-f]{8}$/,
  );
  assert.match(isolateNode(env({})), /^deploy-local-dev-[0-9a-f]{8}$/);
  // Two isolates of one deployment are two nodes.
  const vars = env({ DENO_TIMELINE: "production", DENO_DEPLOYMENT_ID: "d1" });
  assert.notEqual(isolateNode(vars), isolateNode(vars));
});
