/**
 * The registry stream remembers the records it refuses (SPEC §8.5 `rejected`, §3.4): through the
 * real batch path (`Processor.processEvents` on the registry stream, one transaction per batch), on
 * the in-memory stores and on PostgreSQL. An invalid record is listed with its error kind, one over
 * an admission limit with the limit; a later valid version or a delete clears the entry; an older
 * replay never overwrites a newer entry; an owner keeps its newest 100. On PostgreSQL, recording
 * and clearing add no statement to the registry's writes.
 */
import * as Statement from "@effect/sql/Statement"
import { describe, expect, it, type Vitest } from "@effect/vitest"
import { Effect, Layer, Ref } from "effect"
import type { RecordEvent } from "../../src/schemas/RecordEvent.js"
import { Processor } from "../../src/services/matching/Processor.js"
import { Tx } from "../../src/services/platform/Persistence.js"
import { Registry } from "../../src/services/registry/Registry.js"
import * as RegistryStore from "../../src/services/registry/RegistryStore.js"
import * as RejectedStore from "../../src/services/registry/RejectedStore.js"
import { ev, memoryStack, plc, rev, sqlStack, WH, whRecordValue } from "../support/stack.js"

const BOB = plc(9_000)
const valid = (o: Parameters<typeof whRecordValue>[1] = {}) => whRecordValue(`at://${BOB}`, o)
/** `http:` is refused outside the insecure development mode: error kind `url` */
const badUrl = () => valid({ url: "http://receiver.example/hook" })
const badSecretId = () => valid({ secretId: "not a valid id!" })

const wh = (owner: string, rkey: string, n: number, record: unknown, operation: "create" | "update" = "create") =>
  ev(owner, WH, rkey, { record, rev: rev(n), cid: `bafy${rkey}${n}`, operation })
const del = (owner: string, rkey: string, n: number) => ev(owner, WH, rkey, { operation: "delete", rev: rev(n) })

/** Process events as one registry-stream batch; each event's registry outcome. */
const live = (events: ReadonlyArray<RecordEvent>) =>
  Effect.flatMap(Processor, (p) => p.processEvents(events, { registryWriter: true })).pipe(
    Effect.map((r) => r.outcomes.map((o) => ("registry" in o && o.registry !== undefined ? o.registry._tag : o._tag)))
  )

const listed = (owner: string) =>
  Effect.flatMap(RejectedStore.RejectedStore, (s) => s.list(owner)).pipe(
    Effect.map((entries) =>
      entries.map((e) => ({ rkey: e.rkey, rev: e.rev, cid: e.cid, reason: e.reason, source: e.source }))
    )
  )

const memoryRkeys = (owner: string) => Effect.map(Registry, (r) => r.index.byOwner(owner).map((w) => w.rkey).sort())

// Both stacks are `Layer.fresh`: without it, in one file, the services of a memory stack built first
// were found in a PostgreSQL stack built after it (its Registry wrote to the memory store).

/** The in-memory stack, with the RejectedStore over the registry store's own state. */
const memory = (env: Record<string, string> = {}) => {
  const state = RegistryStore.emptyMemoryState()
  return Layer.fresh(
    memoryStack({
      env,
      registryStore: Layer.effect(
        RegistryStore.RegistryStore,
        Effect.map(Ref.make(state), RegistryStore.makeMemoryOver)
      )
    }).pipe(Layer.merge(Layer.succeed(RejectedStore.RejectedStore, RejectedStore.makeMemoryOver(state.rejected))))
  )
}

const sql = (env: Record<string, string> = {}) =>
  Layer.fresh(RejectedStore.layerSql.pipe(Layer.provideMerge(sqlStack({ env }))))

type Stack = Processor | Registry | RejectedStore.RejectedStore

/** The behaviour, on each stack (owners are distinct per test: the stack is shared). */
const behaviour = (it: Vitest.MethodsNonLive<Stack>, base: number) => {
  it.effect("an invalid record is listed with its error kind, cid and rev; nothing of the record is kept", () =>
    Effect.gen(function*() {
      const owner = plc(base + 1)
      expect(yield* live([wh(owner, "a", 5, badUrl()), wh(owner, "b", 6, badSecretId())])).toEqual([
        "invalid",
        "invalid"
      ])
      expect(yield* listed(owner)).toEqual([
        { rkey: "b", rev: rev(6), cid: "bafyb6", reason: "secret_id", source: "stream" },
        { rkey: "a", rev: rev(5), cid: "bafya5", reason: "url", source: "stream" }
      ])
      const [entry] = yield* Effect.flatMap(RejectedStore.RejectedStore, (s) => s.list(owner))
      expect(Object.keys(entry ?? {}).sort()).toEqual(
        ["cid", "firstSeenAt", "lastSeenAt", "ownerDid", "reason", "rev", "rkey", "source"]
      )
      expect(JSON.stringify(entry)).not.toContain("receiver.example")
    }))

  it.effect("a valid record replaced by an invalid version is revoked and listed", () =>
    Effect.gen(function*() {
      const owner = plc(base + 2)
      expect(yield* live([wh(owner, "a", 1, valid())])).toEqual(["active"])
      expect(yield* live([wh(owner, "a", 2, badUrl(), "update")])).toEqual(["invalid"])
      expect(yield* memoryRkeys(owner)).toEqual([])
      expect(yield* listed(owner)).toEqual([{ rkey: "a", rev: rev(2), cid: "bafya2", reason: "url", source: "stream" }])
    }))

  it.effect("a later valid version clears the entry (active or disabled), and so does a delete", () =>
    Effect.gen(function*() {
      const owner = plc(base + 3)
      yield* live([wh(owner, "a", 1, badUrl()), wh(owner, "b", 1, badUrl()), wh(owner, "c", 1, badUrl())])
      expect((yield* listed(owner)).map((e) => e.rkey).sort()).toEqual(["a", "b", "c"])
      expect(yield* live([wh(owner, "a", 2, valid(), "update")])).toEqual(["active"])
      expect((yield* listed(owner)).map((e) => e.rkey).sort()).toEqual(["b", "c"])
      expect(yield* live([wh(owner, "b", 2, valid({ enabled: false }), "update")])).toEqual(["disabled"])
      expect((yield* listed(owner)).map((e) => e.rkey)).toEqual(["c"])
      expect(yield* live([del(owner, "c", 2)])).toEqual(["deleted"])
      expect(yield* listed(owner)).toEqual([])
      expect(yield* memoryRkeys(owner)).toEqual(["a"])
    }))

  it.effect("an older replay (invalid or valid) neither overwrites nor clears a newer entry", () =>
    Effect.gen(function*() {
      const owner = plc(base + 4)
      yield* live([wh(owner, "a", 5, badUrl())])
      const before = yield* listed(owner)
      expect(before).toEqual([{ rkey: "a", rev: rev(5), cid: "bafya5", reason: "url", source: "stream" }])
      expect(yield* live([wh(owner, "a", 3, badSecretId())])).toEqual(["stale"])
      expect(yield* live([wh(owner, "a", 4, valid())])).toEqual(["stale"])
      expect(yield* live([del(owner, "a", 5)])).toEqual(["stale"])
      expect(yield* listed(owner)).toEqual(before)
      expect(yield* memoryRkeys(owner)).toEqual([])
    }))

  it.effect("an owner keeps its newest 100: the 101st refusal drops the oldest", () =>
    Effect.gen(function*() {
      const owner = plc(base + 5)
      const events = Array.from(
        { length: 101 },
        (_, i) => wh(owner, `r${String(i).padStart(3, "0")}`, 10 + i, badUrl())
      )
      expect(new Set(yield* live(events))).toEqual(new Set(["invalid"]))
      const rkeys = (yield* listed(owner)).map((e) => e.rkey)
      expect(rkeys.length).toBe(100)
      expect(rkeys[0]).toBe("r100")
      expect(rkeys).not.toContain("r000")
    }))
}

/** The admission limits (one active webhook per owner here). */
const admission = (it: Vitest.MethodsNonLive<Stack>, base: number) => {
  it.effect("a record over an admission limit is listed with the limit; a valid version that fits clears it", () =>
    Effect.gen(function*() {
      const owner = plc(base + 1)
      expect(yield* live([wh(owner, "a", 1, valid()), wh(owner, "b", 2, valid())])).toEqual(["active", "rejected"])
      expect(yield* listed(owner)).toEqual([
        { rkey: "b", rev: rev(2), cid: "bafyb2", reason: "limit_owner", source: "stream" }
      ])
      // the owner frees the slot, then writes b again: it fits now
      expect(yield* live([del(owner, "a", 3), wh(owner, "b", 4, valid(), "update")])).toEqual(["deleted", "active"])
      expect(yield* listed(owner)).toEqual([])
      expect(yield* memoryRkeys(owner)).toEqual(["b"])
    }))
}

describe("the registry stream's refusals (memory)", () => {
  it.layer(memory())("records and clears", (it) => behaviour(it, 0))
  it.layer(memory({ REGISTRY_OWNER_ACTIVE_RECORDS_MAX: "1" }))("admission", (it) => admission(it, 100))
})

describe("the registry stream's refusals (PostgreSQL)", () => {
  it.layer(sql(), { timeout: "120 seconds" })("records and clears", (it) => behaviour(it, 1_000))

  it.layer(sql({ REGISTRY_OWNER_ACTIVE_RECORDS_MAX: "1" }), { timeout: "120 seconds" })("admission", (it) => {
    admission(it, 1_100)

    it.effect("recording and clearing add no statement: every wh write runs the statements of a plain delete (one freeing room: one more)", () =>
      Effect.gen(function*() {
        const registry = yield* Registry
        const tx = yield* Tx
        /** the statements one wh event runs, in its own transaction */
        const statements = (e: RecordEvent) =>
          Effect.gen(function*() {
            let n = 0
            const outcome = yield* registry.applyWhEvent(e).pipe(
              Statement.withTransformer((s) =>
                Effect.sync(() => {
                  n++
                  return s
                })
              ),
              tx.withTransaction
            )
            return { outcome: outcome._tag, n }
          })
        const owner = plc(1_200)
        const runs = [
          yield* statements(wh(owner, "a", 1, valid())),
          yield* statements(wh(owner, "b", 2, valid())),
          yield* statements(wh(owner, "c", 3, badUrl())),
          yield* statements(wh(owner, "c", 4, badSecretId(), "update")),
          yield* statements(del(owner, "a", 5)),
          yield* statements(wh(owner, "b", 6, valid(), "update")),
          yield* statements(wh(owner, "c", 7, valid({ enabled: false }), "update"))
        ]
        expect(runs.map((r) => r.outcome)).toEqual([
          "active",
          "rejected",
          "invalid",
          "invalid",
          "deleted",
          "active",
          "disabled"
        ])
        // lock the owner (2), read the key (2), bump the generation (1), write the row or the tombstone (2);
        // the delete of the active "a" frees room for the refused "b" (limit_owner): one more, the
        // owner's reconciliation request (RoomRequests); a write that frees no room runs none
        expect(runs.map((r) => r.n)).toEqual([7, 7, 7, 7, 8, 7, 7])
        expect(yield* listed(owner)).toEqual([])
      }))
  })
})
