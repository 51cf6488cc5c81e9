// Connecting as users do, on a real API server: from a kubeconfig (the coordination namespace is
// the option's, idalloc-system by default, never the context's) and through the driver
// (`--store k8s:<kubeconfig>`); the named errors for a user without rights, a reader's writable
// session, and an identity resource that is not installed.
import assert from "node:assert/strict";
import { Allocator } from "../../../src/allocator/allocator.ts";
import { K8sBackend } from "../../../src/backends/k8s/backend.ts";
import { k8sDriver } from "../../../src/backends/k8s/driver.ts";
import { deadline, fixture, k8sTest } from "./_helpers.ts";

k8sTest(
  "connect from a kubeconfig: the option's namespace (never the context's), a working allocator",
  async () => {
    await using fx = await fixture();
    const kubeconfig = await fx.cluster.kubeconfig("admin", { namespace: fx.namespace });
    const options = {
      node: "a",
      kubeconfig,
      context: "test", // the test kubeconfig's current context is another one
      resource: { group: fx.group },
      maxClockSkewMs: 500,
    };
    {
      await using defaulted = await K8sBackend.connect(options);
      assert.equal(defaulted.namespace, "idalloc-system", "not the context's");
    }
    await using backend = await K8sBackend.connect({ ...options, namespace: fx.namespace });
    assert.equal(backend.namespace, fx.namespace);
    assert.equal(backend.server, fx.cluster.server);
    assert.throws(() => backend.checkKey(""), { name: "InvalidKeyError" });
    await using alloc = await Allocator.open(backend, { max: 65535, leaseTtlMs: 3_000 });
    const { id, isNew } = await alloc.allocate("k8s:app=web;");
    assert.equal(isNew, true);
    assert.deepEqual((await fx.identity(id))!["security-labels"], { "k8s:app": "web" });
  },
);

k8sTest("the driver opens --store k8s:<kubeconfig> with --prefix and --namespace", async () => {
  await using fx = await fixture();
  const kubeconfig = await fx.cluster.kubeconfig("admin");
  const description = k8sDriver.describe(kubeconfig, {
    context: "test",
    namespace: fx.namespace,
    clockSkew: "1s",
  }, {
    prefix: `ciliumidentities.${fx.group}/v2`,
    timeoutMs: 30_000,
    leaseTtlMs: 3_000,
  });
  const opened = await k8sDriver.open(description, {
    node: "cli",
    create: true,
    signal: deadline(),
  });
  try {
    assert.match(opened.where, new RegExp(`namespace ${fx.namespace}`));
    await using alloc = await Allocator.open(opened.backend, { max: 65535, leaseTtlMs: 15_000 });
    await alloc.allocate("x;");
    assert.equal((await fx.records()).length, 1);
  } finally {
    await opened.close();
  }
});

k8sTest("a user without rights: StoreAccessDeniedError naming the rule, at connect", async () => {
  await using fx = await fixture();
  const kubeconfig = await fx.cluster.kubeconfig("nobody", { namespace: fx.namespace });
  await assert.rejects(
    () => K8sBackend.connect({ node: "a", kubeconfig, resource: { group: fx.group } }),
    (err: Error) => {
      assert.equal(err.name, "StoreAccessDeniedError");
      assert.match(
        err.message,
        new RegExp(`ciliumidentities\\.${fx.group.replaceAll(".", "\\.")}`),
      );
      return true;
    },
  );
});

k8sTest(
  "a reader lists read-only; its writable session is refused with the rule to add",
  async () => {
    await using fx = await fixture();
    await fx.cluster.grant("reader", [
      { apiGroups: [fx.group], resources: ["ciliumidentities"], verbs: ["get", "list", "watch"] },
    ]);
    await fx.cluster.grant("reader", [
      { apiGroups: ["coordination.k8s.io"], resources: ["leases"], verbs: ["get", "list"] },
    ], fx.namespace);
    const writer = await fx.allocator("w");
    const { id } = await writer.allocate("seen;");
    const kubeconfig = await fx.cluster.kubeconfig("reader", { namespace: fx.namespace });
    await using backend = await K8sBackend.connect({
      node: "r",
      kubeconfig,
      context: "test",
      namespace: fx.namespace,
      resource: { group: fx.group },
      maxClockSkewMs: 500,
    });
    {
      await using reader = await Allocator.open(backend, { max: 65535, readOnly: true });
      await reader.waitForInitialSync();
      assert.deepEqual([...reader.entries()], [[id, "seen;"]]);
    }
    await assert.rejects(
      () => Allocator.open(backend, { max: 65535, leaseTtlMs: 3_000 }),
      (err: Error) => {
        assert.equal(err.name, "StoreAccessDeniedError");
        assert.match(err.message, /leases/);
        return true;
      },
    );
  },
);

k8sTest("an identity resource that is not installed: ResourceNotInstalledError", async () => {
  await using fx = await fixture();
  await assert.rejects(
    () =>
      K8sBackend.connect(fx.options("a", { resource: { group: "absent.idalloc.test" } }), {
        client: fx.client,
      }),
    { name: "ResourceNotInstalledError" },
  );
});
