/**
 * Child of the CA test (`client_kubeconfig.test.ts`): asks the API server at `$SERVER` for its
 * version, trusting the CA in `$CA_FILE`, and prints `ok` or the error's name. Its parent sets
 * `DENO_CERT` to the server's real CA, so that the runtime's own roots would trust the server.
 */
import { readFile } from "node:fs/promises";
import process from "node:process";
import { createKubeClient } from "../../../src/backends/k8s/client.ts";

const client = await createKubeClient({
  server: process.env.SERVER!,
  namespace: "default",
  source: "ca test",
  ca: await readFile(process.env.CA_FILE!, "utf8"),
});
try {
  await client.version();
  console.log("ok");
} catch (err) {
  console.log(`${(err as Error).name}: ${(err as Error).message}`);
} finally {
  await client.close();
}
