/**
 * Stand-in for `NodeInUseError` of `src/errors.ts` (issue 28's "open a session under a live node
 * name" rule, added by the i28-lib branch): the same name, fields and retryability, so that the
 * merge replaces this module by a re-export.
 *
 * @module
 */
import { IdallocError, type IdallocErrorOptions } from "../../errors.ts";

/**
 * A writable session was opened under a node name whose lease another process holds and keeps
 * live. Opening it would cut that process's references. Not retryable: stop the other process,
 * give this one another name, or pass `restart: true` when this process is that node restarting.
 */
export class NodeInUseError extends IdallocError {
  /** The node name. */
  readonly node: string;
  /** When the other holder's lease ends unless renewed (ms since the epoch), if known. */
  readonly expiresAt?: number;

  /**
   * Creates the error.
   * @param node the node name
   * @param expiresAt when the holder's lease ends unless renewed
   * @param options the `cause`
   */
  constructor(node: string, expiresAt?: number, options?: IdallocErrorOptions) {
    super(
      `node name '${node}' is in use: another process holds its live lease` +
        (expiresAt === undefined ? "" : ` (until ${new Date(expiresAt).toISOString()})`) +
        "; stop it, use another node name, or open with restart: true if this is that node " +
        "restarting",
      options,
    );
    this.name = "NodeInUseError";
    this.node = node;
    if (expiresAt !== undefined) this.expiresAt = expiresAt;
  }
}
