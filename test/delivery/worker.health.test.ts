/**
 * SPEC §6.2 on real PostgreSQL: `/health` answers within 1 s whatever the database does. The
 * outbox is locked by another transaction, so the worker's counts query waits; every health report
 * still answers at once, with the last counts, marked stale once they are older than 5 s, and
 * fresh again once the lock is gone.
 */
import * as SqlClient from "@effect/sql/SqlClient"
import { describe, expect, it } from "@effect/vitest"
import { Deferred, Effect } from "effect"
import type { HealthReport } from "../../src/services/platform/Health.js"
import { sqlStack } from "../support/stack.js"
import { eventually, startWorker, TimedOut } from "./worker-support.js"

const staleOf = (r: HealthReport): unknown => {
  const d = r.body["delivery"]
  return typeof d === "object" && d !== null ? d["stale"] : undefined
}

describe("delivery health counts on PostgreSQL", () => {
  it.scopedLive(
    "the delivery section answers within 1 s while the counts query waits on a lock: stale past 5 s, fresh after",
    () =>
      Effect.gen(function*() {
        const worker = yield* startWorker({ options: { pollIntervalMs: 50 } })
        yield* worker.lifecycle.setPhase("live")
        const sql = yield* SqlClient.SqlClient
        const report = worker.health.report.pipe(
          Effect.timeoutFail({ duration: "1 second", onTimeout: () => new TimedOut({ what: "/health within 1 s" }) })
        )
        // the first counts are in (not stale)
        yield* eventually("first counts", report, (r) => staleOf(r) !== true)

        const locked = yield* Deferred.make<void>()
        const release = yield* Deferred.make<void>()
        yield* Effect.addFinalizer(() => Deferred.succeed(release, undefined))
        yield* Effect.forkScoped(
          sql.withTransaction(
            Effect.gen(function*() {
              yield* sql`LOCK TABLE outbox IN ACCESS EXCLUSIVE MODE`
              yield* Deferred.succeed(locked, undefined)
              yield* Deferred.await(release)
            })
          ).pipe(Effect.orDie)
        )
        yield* Deferred.await(locked)
        // every report answers within 1 s (a report that waited for the query would fail the test)
        const stale = yield* eventually("stale counts", report, (r) => staleOf(r) === true, 15_000)
        // the backlog never gates readiness
        expect(stale.ready).toBe(true)
        expect(stale.body["delivery"]).toEqual({
          pending: 0,
          leased: 0,
          deadLetter: 0,
          inFlight: 0,
          openCircuits: 0,
          autoDisabledWebhooks: 0,
          goneWebhooks: 0,
          stale: true
        })
        yield* Deferred.succeed(release, undefined)
        yield* eventually("fresh counts", report, (r) => staleOf(r) === false, 15_000)
      }).pipe(Effect.scoped, Effect.provide(sqlStack())),
    60_000
  )
})
