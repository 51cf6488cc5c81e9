/**
 * The phases of etcd's master feed on plain data (no etcd): what a (re)list and a watch response
 * report, given what was reported before. The feed itself runs on a real etcd in watch.test.ts.
 */
import assert from "node:assert/strict";
import type { IEvent, IWatchResponse } from "../../../src/deps/etcd3.ts";
import { EtcdLayout } from "../../../src/backends/etcd/layout.ts";
import { type FeedState, relisted, watched } from "../../../src/backends/etcd/watch.ts";
import { kv } from "./_plain.ts";

const layout = new EtcdLayout("p");

function state(known: Record<number, string> = {}, revision = 0n): FeedState {
  return { known: new Map(Object.entries(known).map(([id, mod]) => [Number(id), mod])), revision };
}

const master = (id: number, key: string, modRevision: string) => ({ id, key, modRevision });

Deno.test("relisted: new and changed masters are upserted, vanished ones deleted", () => {
  const s = state({ 1: "3", 2: "4", 3: "5" }, 5n);
  const events = relisted(s, {
    entries: [master(1, "a;", "3"), master(2, "b;", "8"), master(4, "d;", "9")],
    revision: "12",
  });
  assert.deepEqual(events, [
    { type: "upsert", id: 2, key: "b;", version: "8" },
    { type: "upsert", id: 4, key: "d;", version: "9" },
    { type: "delete", id: 3 },
  ]);
  assert.deepEqual([...s.known], [[1, "3"], [2, "8"], [4, "9"]]);
  assert.equal(s.revision, 12n);
});

function response(events: IEvent[], revision = "0"): Pick<IWatchResponse, "events" | "header"> {
  return { events, header: { revision } as IWatchResponse["header"] };
}

const putEvent = (id: string, value: string, mod: string): IEvent =>
  ({ type: "Put", kv: kv(`p/id/${id}`, value, mod) }) as IEvent;
const deleteEvent = (id: string, mod: string): IEvent =>
  ({ type: "Delete", kv: kv(`p/id/${id}`, "", mod) }) as IEvent;

Deno.test("watched: puts are upserts dated by arrival; corrupt masters are skipped", () => {
  const s = state({}, 10n);
  const events = watched(
    layout,
    s,
    response([
      putEvent("7", "a;", "11"),
      putEvent("x", "b;", "12"),
      putEvent("8", "", "13"),
    ]),
    1_000,
  );
  assert.deepEqual(events, [{ type: "upsert", id: 7, key: "a;", version: "11", at: 1_000 }]);
  assert.deepEqual([...s.known], [[7, "11"]]);
  // The revision still moves past the skipped ones: they are not asked for again.
  assert.equal(s.revision, 13n);
});

Deno.test("watched: a delete is reported only for a master that was", () => {
  const s = state({ 7: "11" }, 11n);
  const events = watched(layout, s, response([deleteEvent("7", "14"), deleteEvent("8", "15")]), 5);
  assert.deepEqual(events, [{ type: "delete", id: 7, at: 5 }]);
  assert.equal(s.known.size, 0);
  assert.equal(s.revision, 15n);
});

Deno.test("watched: a progress notification moves the revision forward, never back", () => {
  const s = state({}, 20n);
  assert.deepEqual(watched(layout, s, response([], "25"), 0), []);
  assert.equal(s.revision, 25n);
  watched(layout, s, response([], "22"), 0);
  assert.equal(s.revision, 25n);
});
