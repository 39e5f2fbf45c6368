/**
 * Readiness of an intake whose work keeps ending (SPEC §6.2 "ready = … and intake healthy"). A
 * leader whose work dies at once (here its reload fails, as a new leader's does when the database
 * refuses it) gives the role up and stands by for the retry interval (2 s) before it competes
 * again; every election succeeds, so counting failed elections alone called that standby healthy
 * and the process was ready almost all the time although no frame was ever read. It is not ready
 * until a term sees intake run, or another replica is found holding the role (intake runs there).
 *
 * One replica on real PostgreSQL; the TestClock holds it in its 2 s pauses between terms, which
 * the test moves on. What happens on the database (the lock, its unlock) is waited for by polling
 * with the live clock.
 */
import * as SqlClient from "@effect/sql/SqlClient"
import { describe, expect, it } from "@effect/vitest"
import { Context, Duration, Effect, Layer, TestClock, TestServices } from "effect"
import * as Intake from "../../src/services/intake/Intake.js"
import * as Processor from "../../src/services/matching/Processor.js"
import * as Config from "../../src/services/platform/Config.js"
import * as Health from "../../src/services/platform/Health.js"
import * as Lifecycle from "../../src/services/platform/Lifecycle.js"
import { StoreError } from "../../src/services/platform/Persistence.js"
import * as Db from "../support/db.js"
import { sqlServices, testConfig } from "../support/stack.js"

/** Poll `cond` with the live clock (the TestClock stands still): waits for PostgreSQL only. */
const eventually = <E, R>(cond: Effect.Effect<boolean, E, R>, what: string) =>
  Effect.gen(function*() {
    for (let i = 0; i < 400; i++) {
      if (yield* cond) return
      yield* TestServices.provideLive(Effect.sleep("25 millis"))
    }
    return yield* Effect.dieMessage(`never happened: ${what}`)
  })

interface IntakeBody {
  readonly role: string
  readonly progressing: boolean
}

describe("intake readiness while its work keeps ending", () => {
  it.scoped(
    "a standby whose last term's work ended is not ready (nor progressing) until another replica is found holding the role",
    () =>
      Effect.gen(function*() {
        const config = testConfig({
          NODE_ENV: "test",
          WEBHOOK_ALLOW_INSECURE_DEV: "1",
          JETSTREAM_URL: "ws://127.0.0.1:9/subscribe"
        })
        const db = yield* Layer.build(Db.layer())
        const sql = Context.get(db, SqlClient.SqlClient)
        const matching = sqlServices().pipe(Layer.provideMerge(Config.layerValue(config)))
        // the real processor, except that its reload (run by every new intake leader) fails
        let reloads = 0
        const broken = Layer.effect(
          Processor.Processor,
          Effect.map(Processor.Processor, (p) => ({
            ...p,
            reload: Effect.suspend(() => {
              reloads++
              return Effect.fail(new StoreError({ op: "registry.load", code: "unavailable" }))
            })
          }))
        ).pipe(Layer.provide(matching))
        const replica = Intake.layer({}).pipe(
          Layer.provide(broken),
          Layer.provideMerge(Health.layerWith({ required: ["intake"] })),
          Layer.provideMerge(Lifecycle.layer({ shutdownTimeout: "5 seconds" })),
          Layer.provideMerge(matching),
          Layer.provide(Layer.succeedContext(db))
        )
        const ctx = yield* Layer.build(replica)
        const health = Context.get(ctx, Health.Health)
        yield* Context.get(ctx, Lifecycle.Lifecycle).setPhase("live")
        const intake = Effect.map(health.report, (r) => ({
          ready: r.ready,
          intake: r.body["intake"] as unknown as IntakeBody
        }))
        /** the lock is free on the server (the last term's unlock done) */
        const lockFree = Effect.map(
          sql<{ n: number }>`SELECT count(*)::int AS n FROM pg_locks
            WHERE locktype = 'advisory' AND objid = ${Intake.INTAKE_LOCK_KEY} AND granted
              AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`,
          (rows) => rows[0]?.n === 0
        )
        // the reloads are counted before the role and the lock are read: counted after, a term
        // elected (and its reload failed) while the lock query was on its way passed for one over
        // (the role and the lock read before its election), and the next read found it leading
        const standingBy = (terms: number) =>
          Effect.zipRight(
            eventually(
              Effect.flatMap(Effect.sync(() => reloads), (counted) =>
                Effect.map(
                  Effect.zip(intake, lockFree),
                  ([h, free]) => counted === terms && h.intake.role === "standby" && free
                )),
              `term ${terms} over`
            ),
            intake
          )

        // the first term: elected, its reload fails, the role is given up; 2 s of standing by
        expect(yield* standingBy(1)).toEqual({
          ready: false,
          intake: expect.objectContaining({ role: "standby", progressing: false })
        })
        // the next term, 2 s later: the same
        yield* TestClock.adjust(Duration.seconds(2))
        expect(yield* standingBy(2)).toEqual({
          ready: false,
          intake: expect.objectContaining({ role: "standby", progressing: false })
        })

        // another replica takes the role: at the next election this one is a standby like any other
        const other = yield* sql.reserve
        expect(yield* other.executeValues("SELECT pg_try_advisory_lock($1)", [Intake.INTAKE_LOCK_KEY])).toEqual([[
          true
        ]])
        yield* TestClock.adjust(Duration.seconds(2))
        yield* eventually(Effect.map(intake, (h) => h.ready), "ready once another replica holds the role")
        expect(yield* intake).toEqual({
          ready: true,
          intake: expect.objectContaining({ role: "standby", progressing: true })
        })
        expect(reloads).toBe(2)
        yield* other.executeValues("SELECT pg_advisory_unlock($1)", [Intake.INTAKE_LOCK_KEY])
      }),
    { timeout: 60_000 }
  )

  it.effect("the standby section: not ready and not progressing while its work ended, whatever its elections", () =>
    Effect.gen(function*() {
      const intake: Intake.IntakeShape = {
        run: Effect.never,
        stats: Effect.succeed({ running: false, streams: [] }),
        stopAccepting: Effect.void
      }
      const section = (failed: number, ended: boolean) =>
        Effect.map(
          Intake.healthSection(
            intake,
            Effect.succeed("standby" as const),
            Effect.succeed({ rejected: {} }),
            undefined,
            Effect.succeed(failed),
            Effect.succeed(ended)
          ),
          (h) => ({ ready: h.ready, progressing: h.body.progressing })
        )
      expect(yield* section(0, false)).toEqual({ ready: true, progressing: true })
      expect(yield* section(0, true)).toEqual({ ready: false, progressing: false })
      expect(yield* section(Intake.STANDBY_FAILED_ELECTIONS_MAX, false)).toEqual({ ready: false, progressing: true })
    }))
})
