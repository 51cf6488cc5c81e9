/**
 * Cilium operator's CRD identity GC beside a Kubernetes run's Cilium nodes (`--cilium N` on
 * `k8s`): `interop116 -kubeconfig … -gc N -gc-interval D -heartbeat-timeout T`, the rule of Cilium
 * v1.16's `operator/identitygc/crd_gc.go` re-stated in `../shared/cilium-node` (an identity lives
 * while a `CiliumEndpoint` names it or its heartbeat is younger than T; a dead one is marked with
 * `io.cilium.heartbeat`, and a marked dead one is deleted under a resource-version precondition).
 *
 * The operator is a process of its own, as in a cluster: it exits on any API error (as the
 * operator's pod would restart), and is started again at once, forgetting its heartbeats (a new
 * operator counts every identity alive from its start). The nemesis also restarts it as a fault
 * ({@linkcode OPERATOR_FAULT}). What it deleted the store's record shows (`deleted`); its own output
 * (per-round counts) comes only when its rounds end, so it is kept as evidence only.
 *
 * @module
 */
import { join } from "node:path";
import { sleep } from "../src/abort.ts";
import { between } from "../src/testing/prng.ts";
import { ciliumBinary } from "./cilium.ts";
import { Child } from "./child.ts";

/** The fault kind that restarts the operator, and its report label. */
export const OPERATOR_FAULT = { kind: "operator-restart", label: "Cilium operator GC restart" };

/** What {@linkcode CiliumOperator.start} needs. */
export interface CiliumOperatorOptions {
  readonly kubeconfig: string;
  /** The operator's `--identity-heartbeat-timeout`, ms. */
  readonly heartbeatTimeoutMs: number;
  /** Pause between GC rounds, ms. */
  readonly intervalMs: number;
  /** Where its output and stderr go. */
  readonly dir: string;
}

/** One operator incarnation's end. */
export interface OperatorExit {
  readonly at: number;
  readonly code: number;
  /** Whether the nemesis ended it (a fault, the run's end); otherwise it exited on its own. */
  readonly asked: boolean;
}

/** The run's operator GC (see the module doc). */
export class CiliumOperator implements AsyncDisposable {
  readonly #o: CiliumOperatorOptions;
  #child?: Child;
  /** Incarnations the nemesis ended itself. */
  readonly #asked = new WeakSet<Child>();
  #closed = false;
  #n = 0;
  /** Every incarnation's end. */
  readonly exits: OperatorExit[] = [];

  private constructor(o: CiliumOperatorOptions) {
    this.#o = o;
  }

  /** Starts the operator. */
  static async start(o: CiliumOperatorOptions): Promise<CiliumOperator> {
    const op = new CiliumOperator(o);
    await op.#spawn();
    return op;
  }

  /** Incarnations so far. */
  get starts(): number {
    return this.#n;
  }

  async #spawn(): Promise<void> {
    const o = this.#o;
    const n = ++this.#n;
    const files = join(o.dir, `cilium-operator-${n}`);
    const out = await Deno.open(`${files}.out`, { write: true, create: true, append: true });
    const encoder = new TextEncoder();
    const child = await Child.exec(
      `operator@${n}`,
      ciliumBinary(Deno.env.toObject()),
      [
        "-kubeconfig",
        o.kubeconfig,
        "-node",
        "cilium-operator",
        // Rounds enough for any run: it is ended, never left to finish.
        "-gc",
        "1000000",
        "-gc-interval",
        `${o.intervalMs}ms`,
        "-heartbeat-timeout",
        `${o.heartbeatTimeoutMs}ms`,
      ],
      `${files}.stderr`,
      (line) => void out.write(encoder.encode(`${line}\n`)).catch(() => {}),
    );
    this.#child = child;
    child.settled().then(() => out.close());
    child.status.then(async (status) => {
      const asked = this.#asked.has(child);
      this.exits.push({ at: Date.now(), code: status.code, asked });
      if (asked || this.#closed || this.#child !== child) return;
      // Exited on its own (an API error): restarted, as its pod would be (after a second, so an
      // API server that is down does not make a restart loop of it).
      await sleep(1_000);
      if (!this.#closed && this.#child === child) await this.#spawn().catch(() => {});
    });
  }

  /** The {@linkcode OPERATOR_FAULT}: SIGKILL, down 0.5–3 s, start again. */
  async restart(random: () => number): Promise<string> {
    const down = between(random, 500, 3_000);
    const old = this.#child;
    if (old) this.#asked.add(old);
    await old?.kill();
    await old?.settled();
    await sleep(down);
    if (this.#closed) return "the run is ending";
    await this.#spawn();
    return `SIGKILL Cilium's operator GC (incarnation ${this.#n - 1}), down ${down} ms`;
  }

  /** Ends the operator. */
  async [Symbol.asyncDispose](): Promise<void> {
    this.#closed = true;
    if (this.#child) this.#asked.add(this.#child);
    await this.#child?.kill();
    await this.#child?.settled();
  }
}
