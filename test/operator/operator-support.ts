/**
 * Shared pieces of the operator action tests (operator.*.test.ts): owners, times, the Operator over
 * the SQL stack, outbox rows made by the real `Processor.processEvents` and read or settled with
 * test-side SQL, and the six deliveries most tests start from.
 */
import * as SqlClient from "@effect/sql/SqlClient"
import { expect } from "@effect/vitest"
import { Effect, Exit, Layer } from "effect"
import type { StreamEvent } from "../../src/schemas/RecordEvent.js"
import { Processor } from "../../src/services/matching/Processor.js"
import * as Operator from "../../src/services/operator/Operator.js"
import { ev, plc, rev, sqlStack, whEv, whRecordValue } from "../support/stack.js"

export const ALICE = plc(1)
export const BOB = plc(2)
export const CAROL = plc(3)
export const POST = "app.bsky.feed.post"

export const T1 = new Date("2026-01-01T00:00:00Z")
export const T2 = new Date("2026-01-02T00:00:00Z")
export const T3 = new Date("2026-01-03T00:00:00Z")

export const stack = () => Operator.layer.pipe(Layer.provideMerge(sqlStack()))

export const run = (batch: ReadonlyArray<StreamEvent>) =>
  Effect.flatMap(Processor, (p) => p.processEvents(batch, { registryWriter: true }))

export interface Row {
  readonly delivery_id: string
  readonly owner_did: string
  readonly webhook_rkey: string
  readonly event_rkey: string
  readonly status: string
  readonly attempt_count: number
  readonly lease_token: string | null
  readonly leased_until: Date | null
  readonly last_error_kind: string | null
  readonly last_http_status: number | null
  readonly finished_at: Date | null
  readonly due: boolean
}

export const rows = Effect.flatMap(
  SqlClient.SqlClient,
  (sql) =>
    sql<Row>`
    SELECT delivery_id, owner_did, webhook_rkey, event_rkey, status, attempt_count, lease_token, leased_until,
           last_error_kind, last_http_status, finished_at, next_attempt_at <= now() AS due
    FROM outbox ORDER BY owner_did, event_rkey`
)

export const rowOf = (owner: string, eventRkey: string) =>
  Effect.map(rows, (rs) => {
    const r = rs.find((x) => x.owner_did === owner && x.event_rkey === eventRkey)
    if (r === undefined) return Effect.dieMessage("row missing")
    return Effect.succeed(r)
  }).pipe(Effect.flatten)

/** What the delivery worker would have written for a terminal outcome (test-side SQL). */
export const settle = (owner: string | undefined, eventRkey: string | undefined, status: string, attempts = 12) =>
  Effect.flatMap(
    SqlClient.SqlClient,
    (sql) =>
      sql`
      UPDATE outbox SET status = ${status}, attempt_count = ${attempts},
        last_error_kind = CASE WHEN ${status} = 'dead_letter' THEN 'http_5xx' ELSE NULL END,
        last_http_status = CASE WHEN ${status} = 'dead_letter' THEN 503 WHEN ${status} = 'delivered' THEN 200 ELSE NULL END,
        finished_at = CASE WHEN ${status} IN ('delivered', 'dead_letter', 'cancelled') THEN now() ELSE NULL END,
        next_attempt_at = now() + interval '1 hour'
      WHERE (${owner ?? null}::text IS NULL OR owner_did = ${owner ?? null})
        AND (${eventRkey ?? null}::text IS NULL OR event_rkey = ${eventRkey ?? null})`
  )

/**
 * ALICE/w1 and CAROL/w2 both watch BOB; BOB posts p1, p2, p3 (enqueued at T1, T2, T3): six
 * deliveries through the real processor.
 */
export const seed = Effect.gen(function*() {
  yield* run([
    whEv(ALICE, "w1", whRecordValue(`at://${BOB}`, { url: "https://alice.example/hook" }), { rev: rev(1) }),
    whEv(CAROL, "w2", whRecordValue(`at://${BOB}`, { url: "https://carol.example/hook" }), { rev: rev(1) })
  ])
  const r = yield* run([
    ev(BOB, POST, "p1", { rev: rev(10) }),
    ev(BOB, POST, "p2", { rev: rev(11) }),
    ev(BOB, POST, "p3", { rev: rev(12) })
  ])
  expect(r.inserted).toBe(6)
  const sql = yield* SqlClient.SqlClient
  for (const [rkey, t] of [["p1", T1], ["p2", T2], ["p3", T3]] as const) {
    yield* sql`UPDATE outbox SET created_at = ${t} WHERE event_rkey = ${rkey}`
  }
})

export const invalid = <A, E>(exit: Exit.Exit<A, E>) =>
  Exit.isFailure(exit) && JSON.stringify(exit.cause).includes("InvalidArgument")
