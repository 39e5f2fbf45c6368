/**
 * The owners' API when its stores fail (a database outage, a broken table): every call answers
 * 500, and the warning that says so is written once a minute per store and driver code, not once
 * per call (120 calls a minute per caller DID, and anyone can have many DIDs: one line per call
 * would let callers fill the operator's log while the database is down).
 */
import * as SqlClient from "@effect/sql/SqlClient"
import { describe, expect, it } from "@effect/vitest"
import { Effect, Layer, Logger } from "effect"
import { apiLayer, callAs, captureLogs, newOwner } from "./support.js"

const W = "dev.firehook.webhook"

describe("API store failures in the log", () => {
  it.scopedLive(
    "30 calls whose store fails: 30 × 500, and at most one warning per method's store in the minute",
    () => {
      const { capture, lines } = captureLogs()
      return Effect.gen(function*() {
        const ctx = yield* Layer.build(apiLayer())
        yield* Effect.gen(function*() {
          const sql = yield* SqlClient.SqlClient
          const owner = yield* newOwner()
          // every statement on these tables now fails (42P01), as in an outage, for each store
          yield* sql`ALTER TABLE outbox RENAME TO outbox_away`
          yield* sql`ALTER TABLE webhooks RENAME TO webhooks_away`
          yield* sql`ALTER TABLE secrets RENAME TO secrets_away`
          for (let i = 0; i < 10; i++) {
            for (const nsid of [`${W}.listDeliveries`, `${W}.list`, "place.wisp.v2.secret.list"]) {
              const r = yield* callAs(owner, nsid)
              expect([r.status, nsid]).toEqual([500, nsid])
            }
          }
        }).pipe(Effect.provide(ctx))
        const warnings = lines.filter((l) => l.level !== "DEBUG" && l.level !== "INFO" && l.level !== "TRACE")
        expect(warnings.length).toBeGreaterThan(0)
        // one per store (delivery, webhook state, secrets) in the minute, not one per call
        expect(warnings.length).toBeLessThanOrEqual(3)
      }).pipe(Effect.provide(Logger.replace(Logger.defaultLogger, capture)))
    },
    { timeout: 60_000 }
  )
})
