/**
 * `scope.backlinksOnly` through the pipeline (SPEC §1, §2.2, §3.4, §5.3): a record written on the
 * registry stream, the batch processor's matching and outbox, the stored registration and the
 * registry's reload from PostgreSQL, and a reconciliation page.
 */
import * as SqlClient from "@effect/sql/SqlClient"
import { describe, expect, it } from "@effect/vitest"
import { Effect, Either, Ref } from "effect"
import type { StreamEvent } from "../../src/schemas/RecordEvent.js"
import * as Outbox from "../../src/services/matching/Outbox.js"
import { type ProcessOptions, Processor } from "../../src/services/matching/Processor.js"
import { defaultLimits } from "../../src/services/reconciliation/Reconciler.js"
import { pageRows } from "../../src/services/reconciliation/Snapshot.js"
import { Registry } from "../../src/services/registry/Registry.js"
import { RegistryStore } from "../../src/services/registry/RegistryStore.js"
import { ev, memoryStack, plc, rev, sqlStack, WH, whEv } from "../support/stack.js"

const ALICE = plc(1)
const BOB = plc(2)
const CAROL = plc(3)
const POST = "app.bsky.feed.post"
const LIKE = "app.bsky.feed.like"
const BOB_POST = `at://${BOB}/${POST}/3kpost`

const W = { registryWriter: true } satisfies ProcessOptions

const run = (batch: ReadonlyArray<StreamEvent>, options: ProcessOptions = W) =>
  Effect.flatMap(Processor, (p) => p.processEvents(batch, options))

const hook = (scope: Record<string, unknown>): Record<string, unknown> => ({
  $type: WH,
  scope,
  url: "https://receiver.example/hook",
  createdAt: "2026-01-01T00:00:00Z"
})

const likeOf = (uri: string, rkey: string, n: number) =>
  ev(CAROL, LIKE, rkey, { rev: rev(n), record: { $type: LIKE, subject: { uri, cid: "bafyreib2rxk3rh6kzwq" } } })

/** the outbox rows of post and like events as `hook:post|like:match` (wh records referencing the scope left out) */
const memoryRows = Effect.gen(function*() {
  const s = yield* Ref.get(yield* Outbox.MemoryOutboxState)
  return [...s.rows.values()].filter((r) => r.eventCollection !== WH).map((r) =>
    `${r.webhookRkey}:${r.eventCollection === POST ? "post" : "like"}:${r.matchKind}`
  ).sort()
})

describe("scope.backlinksOnly through processEvents", () => {
  it.effect("the like of the scope's post is delivered, the post itself is not", () =>
    Effect.gen(function*() {
      const reg = yield* run([
        whEv(ALICE, "only", hook({ aturi: BOB_POST, backlinksOnly: true }), { rev: rev(1) }),
        whEv(ALICE, "both", hook({ aturi: BOB_POST, backlinks: true }), { rev: rev(2) })
      ])
      expect(reg.outcomes).toMatchObject([{ registry: { _tag: "active" } }, { registry: { _tag: "active" } }])
      const registry = yield* Registry
      expect(registry.index.get(`${ALICE}/only`)).toMatchObject({ backlinks: true, backlinksOnly: true })
      expect((yield* registry.stats).backlinkDids).toBe(1)

      const r = yield* run([ev(BOB, POST, "3kpost", { rev: rev(10) }), likeOf(BOB_POST, "l1", 11)], {
        registryWriter: false
      })
      expect(r.outcomes.map((o) => o._tag)).toEqual(["enqueued", "enqueued"])
      expect(yield* memoryRows).toEqual(["both:like:backlink", "both:post:direct", "only:like:backlink"])
    }).pipe(Effect.provide(memoryStack())))

  it.effect("{backlinks: false, backlinksOnly: true} is invalid: rejected, counted, and revokes the registration", () =>
    Effect.gen(function*() {
      yield* run([whEv(ALICE, "w", hook({ aturi: BOB_POST, backlinks: true }), { rev: rev(1) })])
      const registry = yield* Registry
      expect(registry.index.size).toBe(1)
      const r = yield* run([
        whEv(ALICE, "w", hook({ aturi: BOB_POST, backlinks: false, backlinksOnly: true }), { rev: rev(2) }),
        whEv(ALICE, "new", hook({ aturi: BOB_POST, backlinksOnly: true, backlinks: false }), { rev: rev(3) })
      ])
      expect(r.outcomes).toMatchObject([
        { registry: { _tag: "invalid", kind: "scope", revoked: true } },
        { registry: { _tag: "invalid", kind: "scope", revoked: false } }
      ])
      expect(registry.index.size).toBe(0)
      expect((yield* registry.stats).invalidRecords).toBe(2)
      expect((yield* (yield* RegistryStore).get(ALICE, "w")).row).toBeUndefined()
      yield* run([likeOf(BOB_POST, "l1", 10)], { registryWriter: false })
      expect(yield* memoryRows).toEqual([])
    }).pipe(Effect.provide(memoryStack())))
})

describe("scope.backlinksOnly in PostgreSQL", () => {
  it.effect("the stored registration keeps it (clean copy) and the registry reloads it", () =>
    Effect.gen(function*() {
      yield* run([whEv(ALICE, "only", hook({ aturi: `at://${BOB}`, backlinksOnly: true }), { rev: rev(1) })])
      const sql = yield* SqlClient.SqlClient
      const stored = yield* sql<{ record: { scope: unknown }; backlinks: boolean }>`
        SELECT record, backlinks FROM webhooks WHERE rkey = 'only'`
      expect(stored).toEqual([{
        record: expect.objectContaining({ scope: { aturi: `at://${BOB}`, backlinksOnly: true } }),
        backlinks: true
      }])

      const registry = yield* Registry
      const before = registry.index.get(`${ALICE}/only`)
      yield* registry.reload
      const after = registry.index.get(`${ALICE}/only`)
      expect(after).not.toBe(before)
      expect(after).toMatchObject({ backlinks: true, backlinksOnly: true, fingerprint: before?.fingerprint })
      expect([...registry.index.candidatesByScopeDid(BOB)]).toEqual([])

      const r = yield* run([ev(BOB, POST, "p1", { rev: rev(10) }), likeOf(`at://${BOB}/${POST}/p1`, "l1", 11)], {
        registryWriter: false
      })
      expect(r.outcomes.map((o) => o._tag)).toEqual(["no_match", "enqueued"])
      const rows = yield* sql<{ event_did: string; match_kind: string }>`SELECT event_did, match_kind FROM outbox`
      expect(rows).toEqual([{ event_did: CAROL, match_kind: "backlink" }])
    }).pipe(Effect.provide(sqlStack())))
})

describe("scope.backlinksOnly in a reconciliation page", () => {
  it("is kept in the row; the invalid combination is omitted and counted", () => {
    const page = [
      { uri: `at://${ALICE}/${WH}/only`, cid: "bafyonly", value: hook({ aturi: `at://${BOB}`, backlinksOnly: true }) },
      {
        uri: `at://${ALICE}/${WH}/bad`,
        cid: "bafybad",
        value: hook({ aturi: `at://${BOB}`, backlinks: false, backlinksOnly: true })
      }
    ]
    const out = pageRows(
      page,
      { did: ALICE, token: 1, snapshotRev: rev(5) },
      new Set(),
      defaultLimits,
      { allowInsecureDev: false }
    )
    if (Either.isLeft(out)) throw new Error(`page failed: ${out.left}`)
    expect(out.right.invalid).toBe(1)
    expect(out.right.rows.map((r) => [r.rkey, r.record.scope, r.backlinks])).toEqual([
      ["only", { aturi: `at://${BOB}`, backlinksOnly: true }, true]
    ])
  })
})
