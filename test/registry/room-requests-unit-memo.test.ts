/**
 * A unit of work (an intake batch) asks the store for other owners to request under a global limit
 * at most once while nothing is left to find: a request that stamped fewer others than it could
 * marks its limits exhausted for the rest of the unit (RoomRequests.ts). Before, a batch of N
 * deletes ran the statement N times, each reading up to RejectedStore.ROOM_READ_MAX refusals in the
 * batch's transaction. Logic only: a fake store and index.
 */
import { describe, expect, it } from "@effect/vitest"
import { Effect } from "effect"
import type { WebhookIndex } from "../../src/services/matching/WebhookIndex.js"
import type { RoomFreed } from "../../src/services/registry/RejectedStore.js"
import * as RoomRequests from "../../src/services/registry/RoomRequests.js"

/** An index whose total is `size.n` (each write below lowers it by one). */
const fakeIndex = (size: { n: number }) => {
  const index: Pick<WebhookIndex, "ownerCount" | "wantedDids" | "backlinkDids"> & {
    readonly size: number
    readonly wantedDidsBytes: number
  } = {
    get size() {
      return size.n
    },
    wantedDidsBytes: 0,
    ownerCount: () => 0,
    wantedDids: () => new Set<string>(),
    backlinkDids: () => new Set<string>()
  }
  return index as unknown as WebhookIndex
}

const setup = (answers: ReadonlyArray<ReadonlyArray<string>>) => {
  const size = { n: 100 }
  const calls: Array<RoomFreed> = []
  const ctx: RoomRequests.RoomContext = {
    store: {
      requestRoomReconciles: (freed) => Effect.sync(() => answers[calls.push(freed) - 1] ?? [])
    },
    index: fakeIndex(size),
    jetstream: true,
    memo: ((m) => () => m)(RoomRequests.newMemo()),
    onCommit: () => Effect.void
  }
  /** a delete of one active webhook of `did`: the total goes down by one */
  const remove = (did: string) =>
    RoomRequests.afterWrite(
      ctx,
      did,
      Effect.sync(() => (size.n -= 1, { outcome: { _tag: "deleted" }, rowRemoved: false }))
    )
  return { calls, remove }
}

describe("room requests within one unit of work", () => {
  it.effect("a limit that stamped nobody is not asked again in its unit", () =>
    Effect.gen(function*() {
      const { calls, remove } = setup([])
      for (let i = 0; i < 5; i++) yield* remove(`did:plc:writer${i}`)
      expect(calls.map((c) => c.global)).toEqual([["total"]])
    }))

  it.effect("a request that stamped fewer than it could marks its limits only; the unit's cap still holds", () =>
    Effect.gen(function*() {
      const some = ["did:plc:a1", "did:plc:a2"]
      const { calls, remove } = setup([some])
      yield* remove("did:plc:writer1")
      yield* remove("did:plc:writer2")
      expect(calls.map((c) => [c.global, c.othersMax])).toEqual([[["total"], RoomRequests.ROOM_REQUESTS_MAX]])
    }))

  it.effect("a write that leaves the direct set as large but shorter in bytes frees room under direct_dids", () =>
    Effect.gen(function*() {
      const bytes = { n: 9_000_000 }
      const calls: Array<RoomFreed> = []
      const index = {
        size: 10,
        get wantedDidsBytes() {
          return bytes.n
        },
        ownerCount: () => 1,
        wantedDids: () => new Set(["did:web:a"]),
        backlinkDids: () => new Set<string>()
      } as unknown as WebhookIndex
      const ctx: RoomRequests.RoomContext = {
        store: { requestRoomReconciles: (freed) => Effect.sync(() => (calls.push(freed), [])) },
        index,
        jetstream: true,
        memo: () => undefined,
        onCommit: () => Effect.void
      }
      // a scope moved from a long did:web to a short one: same count, fewer bytes
      yield* RoomRequests.afterWrite(
        ctx,
        "did:plc:writer",
        Effect.sync(() => (bytes.n -= 2_000, { outcome: { _tag: "updated" }, rowRemoved: false }))
      )
      expect(calls.map((c) => c.global)).toEqual([["direct_dids"]])
    }))
})
