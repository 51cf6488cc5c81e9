/**
 * A test process's view of `sharedKubeApiServer()`, printed as one JSON line: the server's URL
 * and PID, whether a client lists namespaces on it, and what `kill()` answered. The launcher's
 * tests run it twice under one launcher to see both processes reach the same server.
 *
 * @module
 */
import { sharedKubeApiServer } from "../../src/backends/k8s/testing/cluster.ts";

const cluster = await sharedKubeApiServer();
await using client = await cluster.client();
const namespaces = await client.list({
  group: "",
  version: "v1",
  plural: "namespaces",
  namespaced: false,
});
const kill = await cluster.kill().then(() => "killed", (err: Error) => err.name);
console.log(JSON.stringify({
  server: cluster.server,
  pid: cluster.pid,
  namespaces: namespaces.items.length,
  kill,
}));
await cluster.close();
