/**
 * Paged lists. The pages of one list share one snapshot (the continue token pins the first page's
 * resource version); when the API server has compacted that snapshot away (410 on a continue
 * token), the list starts over, so a consumer that collects a whole list always sees one snapshot.
 *
 * @module
 */
import {
  isStatus,
  type KubeClient,
  type KubeList,
  type KubeObject,
  type KubeResource,
} from "./kube.ts";
import { LIST_PAGE } from "./limits.ts";

/** What to list. */
export interface ListSpec {
  /** The namespace of a namespaced resource (the client's when absent). */
  readonly namespace?: string;
  /** List a namespaced resource in every namespace. */
  readonly allNamespaces?: boolean;
  /** A label selector. */
  readonly labelSelector?: string;
  /** Aborts the list. */
  readonly signal: AbortSignal;
}

/** A whole list: its objects and the resource version of its snapshot. */
export interface FullList {
  /** Every object. */
  readonly items: KubeObject[];
  /** The snapshot's resource version (a watch from it misses nothing). */
  readonly resourceVersion: string;
}

/** Lists every object of `res` in one snapshot (see the module doc). */
export async function listAll(
  client: KubeClient,
  res: KubeResource,
  spec: ListSpec,
): Promise<FullList> {
  for (;;) {
    const items: KubeObject[] = [];
    let token: string | undefined;
    let resourceVersion = "";
    try {
      do {
        const page: KubeList = await client.list(res, {
          ...spec,
          limit: LIST_PAGE,
          ...(token === undefined ? {} : { continue: token }),
        });
        items.push(...page.items);
        resourceVersion = page.resourceVersion;
        token = page.continue || undefined;
      } while (token !== undefined);
      return { items, resourceVersion };
    } catch (err) {
      // The snapshot of a continue token was compacted: one list is one snapshot, so start over.
      if (token !== undefined && isStatus(err, 410)) continue;
      throw err;
    }
  }
}
