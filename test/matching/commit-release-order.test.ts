/**
 * A commit's wh-record deletes and pauses are applied ahead of its other operations for admission
 * (SPEC §2.6: admission judges what the commit leaves), but matching runs in the listed order
 * (SPEC §2.5: a registry mutation is visible to the next event): an event listed before the delete
 * or pause of a webhook still matches it, whichever place the commit's other wh writes have, and an
 * event listed after it does not. On the relay a commit's operations on other collections sit among
 * its wh operations. In memory and on PostgreSQL.
 */
import * as SqlClient from "@effect/sql/SqlClient"
import { describe, expect, it } from "@effect/vitest"
import { Effect, Ref } from "effect"
import type { StreamEvent } from "../../src/schemas/RecordEvent.js"
import * as Outbox from "../../src/services/matching/Outbox.js"
import { type ProcessOptions, Processor } from "../../src/services/matching/Processor.js"
import { Registry } from "../../src/services/registry/Registry.js"
import { ev, memoryStack, plc, rev, sqlStack, WH, whEv, whRecordValue } from "../support/stack.js"

const ALICE = plc(1)
const BOB = plc(2)
const CAROL = plc(3)
const POST = "app.bsky.feed.post"
const LIKE = "app.bsky.feed.like"
const ALICE_POSTS = `at://${ALICE}/${POST}`
const W = { registryWriter: true } satisfies ProcessOptions
const ENV = { REGISTRY_OWNER_ACTIVE_RECORDS_MAX: "2" }

const run = (batch: ReadonlyArray<StreamEvent>) => Effect.flatMap(Processor, (p) => p.processEvents(batch, W))

/** the outbox rows as `webhook:event rkey:match kind`, sorted */
const memoryRows = Effect.map(
  Effect.flatMap(Outbox.MemoryOutboxState, Ref.get),
  (s) => [...s.rows.values()].map((r) => `${r.webhookRkey}:${r.eventRkey}:${r.matchKind}`).sort()
)
const sqlRows = Effect.flatMap(SqlClient.SqlClient, (sql) =>
  sql<{ row: string }>`
    SELECT webhook_rkey || ':' || event_rkey || ':' || match_kind AS row FROM outbox ORDER BY 1`.pipe(
    Effect.map((rs) => rs.map((r) => r.row).sort())
  ))

const del = (rkey: string, n: number) => whEv(ALICE, rkey, undefined, { rev: rev(n), operation: "delete" })
const pause = (rkey: string, scope: string, n: number) =>
  whEv(ALICE, rkey, whRecordValue(scope, { enabled: false }), { rev: rev(n), operation: "update" })

/**
 * `watch` (alice's posts) removed by the commit's `removal`, in both orders: [post pA, create new1,
 * removal] and [create new2, post pB, removal, post pC]. Alice is at her limit (2) each time: the
 * creates are admitted. Returns the outbox rows of posts.
 */
const bothOrders = <E, R>(
  removal: (n: number) => StreamEvent,
  rows: Effect.Effect<ReadonlyArray<string>, E, R>
) =>
  Effect.gen(function*() {
    const registry = yield* Registry
    yield* run([
      whEv(ALICE, "watch", whRecordValue(ALICE_POSTS), { rev: rev(1) }),
      whEv(ALICE, "other", whRecordValue(`at://${CAROL}`), { rev: rev(2) })
    ])
    yield* run([
      ev(ALICE, POST, "pA", { rev: rev(3) }),
      whEv(ALICE, "new1", whRecordValue(`at://${CAROL}`), { rev: rev(3) }),
      removal(3)
    ])
    expect(registry.index.byOwner(ALICE).map((w) => w.rkey).sort()).toEqual(["new1", "other"])
    // the owner writes `watch` again, in place of `new1` (at the limit again)
    yield* run([
      del("new1", 4),
      whEv(ALICE, "watch", whRecordValue(ALICE_POSTS), { rev: rev(5), operation: "update" })
    ])
    yield* run([
      whEv(ALICE, "new2", whRecordValue(`at://${CAROL}`), { rev: rev(6) }),
      ev(ALICE, POST, "pB", { rev: rev(6) }),
      removal(6),
      ev(ALICE, POST, "pC", { rev: rev(6) })
    ])
    expect(registry.index.byOwner(ALICE).map((w) => w.rkey).sort()).toEqual(["new2", "other"])
    return (yield* rows).filter((r) => r.includes(":p"))
  })

describe("a commit's early-applied wh delete or pause, in memory", () => {
  it.effect("a delete: the posts listed before it are delivered whichever place the wh create has", () =>
    bothOrders((n) => del("watch", n), memoryRows).pipe(
      Effect.map((rows) => expect(rows).toEqual(["watch:pA:direct", "watch:pB:direct"])),
      Effect.provide(memoryStack({ env: ENV }))
    ))

  it.effect("a pause (enabled: false): the same", () =>
    bothOrders((n) => pause("watch", ALICE_POSTS, n), memoryRows).pipe(
      Effect.map((rows) => expect(rows).toEqual(["watch:pA:direct", "watch:pB:direct"])),
      Effect.provide(memoryStack({ env: ENV }))
    ))

  it.effect("the commit's wh create itself, listed before the delete, is delivered to a DID-wide scope", () =>
    Effect.gen(function*() {
      yield* run([whEv(ALICE, "all", whRecordValue(`at://${ALICE}`), { rev: rev(1) })])
      yield* run([
        whEv(ALICE, "new", whRecordValue(`at://${CAROL}`), { rev: rev(2) }),
        del("all", 2),
        ev(ALICE, POST, "after", { rev: rev(2) })
      ])
      expect(yield* memoryRows).toEqual(["all:new:direct"])
    }).pipe(Effect.provide(memoryStack())))

  it.effect("a backlink webhook (the only one) removed early still gets the references listed before", () =>
    Effect.gen(function*() {
      const bobPost = `at://${BOB}/${POST}/3kpost`
      const like = (rkey: string) =>
        ev(ALICE, LIKE, rkey, {
          rev: rev(2),
          record: { $type: LIKE, subject: { uri: bobPost, cid: "bafyreib2rxk3rh6kzwq" } }
        })
      yield* run([whEv(ALICE, "refs", whRecordValue(bobPost, { backlinks: true }), { rev: rev(1) })])
      yield* run([
        whEv(ALICE, "new", whRecordValue(`at://${CAROL}`), { rev: rev(2) }),
        like("l1"),
        del("refs", 2),
        like("l2")
      ])
      expect((yield* memoryRows).filter((r) => !r.includes(WH))).toEqual(["refs:l1:backlink"])
    }).pipe(Effect.provide(memoryStack())))
})

describe("a commit's early-applied wh delete or pause, on PostgreSQL", () => {
  const stack = () => sqlStack({ env: ENV })

  it.effect("a delete", () =>
    bothOrders((n) => del("watch", n), sqlRows).pipe(
      Effect.map((rows) => expect(rows).toEqual(["watch:pA:direct", "watch:pB:direct"])),
      Effect.provide(stack())
    ))

  it.effect("a pause (enabled: false)", () =>
    bothOrders((n) => pause("watch", ALICE_POSTS, n), sqlRows).pipe(
      Effect.map((rows) => expect(rows).toEqual(["watch:pA:direct", "watch:pB:direct"])),
      Effect.provide(stack())
    ))
})
