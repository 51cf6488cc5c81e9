/**
 * A kubeconfig user's legacy `auth-provider` (client-go's in-tree plugins, removed from kubectl in
 * Kubernetes 1.26 for `gcp` and `azure`). `oidc` works while its `id-token` is valid (the token is
 * sent as it is, as kubectl does); refreshing it, and the `gcp` and `azure` providers, need the
 * cloud's own login flow, so those fail at load time naming the `exec` plugin to switch to.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { authProviderToken } from "./kubeconfig_auth_provider.ts";
 *
 * assert.throws(() => authProviderToken({ name: "gcp" }, "kubeconfig k"), /gke-gcloud-auth-plugin/);
 * ```
 *
 * @module
 */
import { InvalidOptionsError } from "../../errors.ts";

/** What the kubeconfig says of the provider. */
export interface AuthProviderConfig {
  /** `gcp`, `azure`, `oidc`, … */
  readonly name: string;
  /** The provider's settings (`id-token`, `refresh-token`, `idp-issuer-url`, …). */
  readonly config?: Readonly<Record<string, string>> | null;
}

/** The `exp` claim (seconds) of a JWT, or `undefined` when it is not a readable JWT. */
function jwtExpiry(token: string): number | undefined {
  const payload = token.split(".")[1];
  if (payload === undefined) return undefined;
  try {
    const json = JSON.parse(atob(payload.replace(/-/g, "+").replace(/_/g, "/")));
    return typeof json.exp === "number" ? json.exp : undefined;
  } catch {
    return undefined;
  }
}

/**
 * The bearer token of `provider`, or an {@linkcode InvalidOptionsError} naming what to switch to.
 * `now` is for tests.
 */
export function authProviderToken(
  provider: AuthProviderConfig,
  where: string,
  now: number = Date.now(),
): string {
  const at = `${where}: the auth-provider '${provider.name}'`;
  switch (provider.name) {
    case "gcp":
      throw new InvalidOptionsError(
        `${at} is not supported (kubectl dropped it in 1.26): install gke-gcloud-auth-plugin and ` +
          "run 'gcloud container clusters get-credentials' to rewrite the user as an exec plugin",
      );
    case "azure":
      throw new InvalidOptionsError(
        `${at} is not supported (kubectl dropped it in 1.26): install kubelogin and run ` +
          "'kubelogin convert-kubeconfig' to rewrite the user as an exec plugin",
      );
    case "oidc": {
      const token = provider.config?.["id-token"];
      const exp = token ? jwtExpiry(token) : undefined;
      if (token && (exp === undefined || exp * 1000 > now)) return token;
      throw new InvalidOptionsError(
        `${at} has ${token ? "an expired" : "no"} id-token, and refreshing it is not ` +
          "supported: log in with kubectl first, or switch the user to an exec plugin " +
          "(kubelogin: 'kubectl oidc-login setup')",
      );
    }
    default:
      throw new InvalidOptionsError(
        `${at} is not supported: switch the user to an exec credential plugin`,
      );
  }
}
