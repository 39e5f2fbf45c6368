/**
 * SPEC §4.2 step 1 is checked when the attempt starts, not when the row was claimed: a row that
 * was claimed (leased, waiting for its origin's slot) before its subscription changed is cancelled
 * without a request, and one whose owner started a reconciliation meanwhile is deferred. The first
 * row of the origin is held by a receiver that answers only when the test says so, so the second
 * row waits after its claim for as long as the test needs.
 */
import * as SqlClient from "@effect/sql/SqlClient"
import { describe, expect, it } from "@effect/vitest"
import { Effect } from "effect"
import type { Scope } from "effect"
import * as Http from "node:http"
import type * as Net from "node:net"
import { ev, plc, rev, sqlStack, whEv, whRecordValue } from "../support/stack.js"
import { countWhere, eventually, outboxRows, run, startWorker } from "./worker-support.js"

const OWNER_A = plc(1)
const OWNER_B = plc(3)
const BOB = plc(2)
const CAROL = plc(4)
const POST = "app.bsky.feed.post"

const ENV = {
  WEBHOOK_ALLOW_INSECURE_DEV: "1",
  DELIVERY_RETRY_BASE_MS: "600000",
  DELIVERY_RETRY_MAX_MS: "3600000",
  DELIVERY_PER_ORIGIN_CONCURRENCY: "1"
}

/** Answers `/held` only after `release`; anything else 200 at once. Counts requests by path. */
const gatedReceiver: Effect.Effect<
  { readonly url: string; readonly paths: Array<string>; readonly release: Effect.Effect<void> },
  never,
  Scope.Scope
> = Effect.acquireRelease(
  Effect.async<
    { url: string; paths: Array<string>; release: Effect.Effect<void>; server: Http.Server; sockets: Set<Net.Socket> }
  >(
    (resume) => {
      const paths: Array<string> = []
      const held: Array<Http.ServerResponse> = []
      const sockets = new Set<Net.Socket>()
      const server = Http.createServer((req, res) => {
        req.resume()
        req.on("end", () => {
          const path = req.url ?? ""
          paths.push(path)
          if (path === "/held") held.push(res)
          else res.writeHead(200).end("ok")
        })
      })
      server.on("connection", (s: Net.Socket) => {
        sockets.add(s)
        s.on("close", () => sockets.delete(s))
      })
      const release = Effect.sync(() => {
        for (const r of held.splice(0, held.length)) r.writeHead(200).end("ok")
      })
      server.listen(0, "127.0.0.1", () => {
        const addr = server.address()
        const port = typeof addr === "object" && addr !== null ? addr.port : 0
        resume(Effect.succeed({ url: `http://127.0.0.1:${port}`, paths, release, server, sockets }))
      })
    }
  ),
  ({ server, sockets }) =>
    Effect.async<void>((resume) => {
      for (const s of sockets) s.destroy()
      server.close(() => resume(Effect.void))
    })
)

const statusOf = (rkey: string) =>
  Effect.flatMap(SqlClient.SqlClient, (sql) =>
    Effect.map(
      sql<{ status: string }>`SELECT status FROM outbox WHERE webhook_rkey = ${rkey}`,
      (rows) => rows[0]?.status ?? "none"
    ))

/** A's row is in flight (held by the receiver) and B's row is claimed and waiting for the origin. */
const heldWithBClaimed = Effect.gen(function*() {
  const rx = yield* gatedReceiver
  yield* run([
    whEv(OWNER_A, "a", whRecordValue(`at://${BOB}`, { url: `${rx.url}/held` }), { rev: rev(1) }),
    whEv(OWNER_B, "b", whRecordValue(`at://${CAROL}`, { url: `${rx.url}/b` }), { rev: rev(1) })
  ])
  // A's row is due first, so it takes the origin's only slot
  yield* run([ev(BOB, POST, "p1", { rev: rev(10) })])
  yield* run([ev(CAROL, POST, "p2", { rev: rev(11) })])
  yield* startWorker({ options: { pollIntervalMs: 100 } })
  yield* eventually("A in flight", Effect.sync(() => rx.paths.length), (n) => n === 1)
  expect(rx.paths).toEqual(["/held"])
  yield* eventually("B claimed", statusOf("b"), (s) => s === "leased")
  return rx
})

describe("the subscription is checked when the attempt starts", () => {
  it.scopedLive("disabled after the claim, before the attempt → cancelled, no request", () =>
    Effect.gen(function*() {
      const rx = yield* heldWithBClaimed
      yield* run([
        whEv(OWNER_B, "b", whRecordValue(`at://${CAROL}`, { url: `${rx.url}/b`, enabled: false }), { rev: rev(2) })
      ])
      yield* rx.release
      const rows = yield* eventually("both settled", outboxRows, (rs) =>
        rs.length === 2 && rs.every((r) =>
          r.lease_token === null && r.status !== "pending"
        ))
      const byStatus = rows.map((r) => r.status).sort()
      expect(byStatus).toEqual(["cancelled", "delivered"])
      expect(rows.find((r) => r.status === "cancelled")?.last_error_kind).toBe("subscription_changed")
      expect(rx.paths).toEqual(["/held"])
      expect(yield* countWhere("audit", "status = 'cancelled' AND error_kind = 'subscription_changed'")).toBe(1)
    }).pipe(Effect.scoped, Effect.provide(sqlStack({ env: ENV }))))

  it.scopedLive("URL changed after the claim → cancelled, nothing sent to either URL", () =>
    Effect.gen(function*() {
      const rx = yield* heldWithBClaimed
      yield* run([whEv(OWNER_B, "b", whRecordValue(`at://${CAROL}`, { url: `${rx.url}/b2` }), { rev: rev(2) })])
      yield* rx.release
      yield* eventually("B cancelled", statusOf("b"), (s) => s === "cancelled")
      yield* eventually("A delivered", statusOf("a"), (s) => s === "delivered")
      expect(rx.paths).toEqual(["/held"])
    }).pipe(Effect.scoped, Effect.provide(sqlStack({ env: ENV }))))

  it.scopedLive("owner reconciliation started after the claim → deferred without spending an attempt", () =>
    Effect.gen(function*() {
      const rx = yield* heldWithBClaimed
      const sql = yield* SqlClient.SqlClient
      yield* sql`UPDATE owners SET reconcile_status = 'scanning' WHERE did = ${OWNER_B}`
      yield* rx.release
      const rows = yield* eventually(
        "B deferred",
        outboxRows,
        (rs) => rs.length === 2 && rs.every((r) => r.lease_token === null)
      )
      const b = rows.find((r) => r.status === "pending")
      expect(b).toMatchObject({ attempt_count: 0, last_error_kind: null })
      expect(rows.filter((r) => r.status === "delivered").length).toBe(1)
      expect(rx.paths).toEqual(["/held"])
      expect(yield* countWhere("delivery_attempts", "true")).toBe(1)
    }).pipe(Effect.scoped, Effect.provide(sqlStack({ env: ENV }))))
})
