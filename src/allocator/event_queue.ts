/**
 * An unbounded single-consumer async queue. Producers never wait, so a slow consumer never blocks
 * allocation; it only lets its own queue grow (no event is dropped).
 *
 * @module
 */

/** Push values in; iterate them out with `for await`. `end()` finishes the iteration. */
export class EventQueue<T> implements AsyncIterable<T> {
  #items: T[] = [];
  #head = 0;
  #ended = false;
  #wake: (() => void) | undefined;

  /** Values queued and not yet consumed. */
  get length(): number {
    return this.#items.length - this.#head;
  }

  /** Queues `value` unless the queue has ended. */
  push(value: T): void {
    if (this.#ended) return;
    this.#items.push(value);
    this.#wake?.();
  }

  /** Ends the iteration once the queued values are consumed. */
  end(): void {
    this.#ended = true;
    this.#wake?.();
  }

  /** Iterates the values; returns early (and ends the queue) when the consumer breaks. */
  async *[Symbol.asyncIterator](): AsyncGenerator<T> {
    try {
      while (true) {
        if (this.#head < this.#items.length) {
          const value = this.#items[this.#head];
          this.#items[this.#head++] = undefined as T;
          if (this.#head > 1024 && this.#head * 2 > this.#items.length) {
            this.#items = this.#items.slice(this.#head);
            this.#head = 0;
          }
          yield value;
          continue;
        }
        if (this.#ended) return;
        await new Promise<void>((resolve) => (this.#wake = resolve));
        this.#wake = undefined;
      }
    } finally {
      this.#ended = true;
      this.#items = [];
      this.#head = 0;
    }
  }
}
