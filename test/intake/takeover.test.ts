/**
 * Intake takeover (SPEC §6.4, §2.4): two replicas on one PostgreSQL database. The standby loaded
 * its registry and its prior-reference key index at startup, before the leader wrote the prior
 * references of Alice's like; when it takes the intake role, it must reload both before it reads a
 * frame, so that Alice's later update or delete of a record referencing Bob still reaches Bob's
 * backlink webhook.
 */
import * as SqlClient from "@effect/sql/SqlClient"
import { describe, expect, it } from "@effect/vitest"
import { Context, Duration, Effect, Layer } from "effect"
import * as Intake from "../../src/services/intake/Intake.js"
import * as Processor from "../../src/services/matching/Processor.js"
import * as Config from "../../src/services/platform/Config.js"
import * as Health from "../../src/services/platform/Health.js"
import * as Lifecycle from "../../src/services/platform/Lifecycle.js"
import * as Db from "../support/db.js"
import { commitFrame, type Connection, startFakeJetstream, tidAt } from "../support/fakeJetstream.js"
import { ev, plc, sqlServices, testConfig, whEv, whRecordValue } from "../support/stack.js"

const ALICE = plc(1)
const BOB = plc(2)
const POST = "app.bsky.feed.post"
const LIKE = "app.bsky.feed.like"
const T0 = 1_750_000_000_000_000
const bobPost = `at://${BOB}/${POST}/3kbobpost`
const likeOf = (uri: string) => ({ $type: LIKE, subject: { uri, cid: "bafyx" }, createdAt: "2026-01-01T00:00:00Z" })

const fakeJetstream = Effect.acquireRelease(
  Effect.promise(() => startFakeJetstream()),
  (f) => Effect.promise(() => f.close())
)

const tuning: Partial<Intake.IntakeTuning> = {
  batchRetryBase: Duration.millis(5),
  backoffBase: Duration.millis(10),
  backoffCap: Duration.millis(50),
  poisonBackoff: Duration.millis(20)
}

/** Poll `cond` (bounded) — waits for real sockets and a real lock, asserts nothing about time. */
const eventually = <E, R>(cond: Effect.Effect<boolean, E, R>, what: string) =>
  Effect.gen(function*() {
    for (let i = 0; i < 600; i++) {
      if (yield* cond) return
      yield* Effect.sleep("25 millis")
    }
    return yield* Effect.dieMessage(`never happened: ${what}`)
  })

/** one replica's matching on the shared database */
const matching = (config: Config.FirehookConfigShape) =>
  sqlServices().pipe(Layer.provideMerge(Config.layerValue(config)))

/** one replica with intake under leader election (as `src/main.ts` runs it) */
const replica = (config: Config.FirehookConfigShape) =>
  Intake.layer({ reconfigureDelay: "50 millis", tuning }).pipe(
    Layer.provideMerge(Health.layer),
    Layer.provideMerge(Lifecycle.layer({ shutdownTimeout: "5 seconds" })),
    Layer.provideMerge(matching(config))
  )

/** the backlink stream's connection: its hello filters on neither collections nor DIDs */
const isBacklink = (c: Connection) => {
  const o = c.options.at(-1)
  if (o === undefined) return false
  const cols = o["wantedCollections"]
  return !Array.isArray(o["wantedDids"]) && !(Array.isArray(cols) && cols.length > 0)
}

describe("intake takeover", () => {
  it.scopedLive(
    "the new leader reloads the prior-reference key index: a record referenced under the old leader, updated or deleted after the takeover, reaches the backlink hook",
    () =>
      Effect.gen(function*() {
        const fake = yield* fakeJetstream
        const config = testConfig({ NODE_ENV: "test", WEBHOOK_ALLOW_INSECURE_DEV: "1", JETSTREAM_URL: fake.url })
        const db = yield* Layer.build(Db.layer())
        const onDb = Layer.succeedContext(db)
        const sql = Context.get(db, SqlClient.SqlClient)
        const delivered = (rkey: string) =>
          sql<{ event_operation: string }>`
            SELECT event_operation FROM outbox
            WHERE owner_did = ${BOB} AND webhook_rkey = 'bl' AND event_rkey = ${rkey}
            ORDER BY created_at`.pipe(Effect.orDie, Effect.map((rows) => rows.map((r) => r.event_operation)))

        // the old leader holds the intake role
        const leaderConnection = yield* sql.reserve.pipe(Effect.orDie)
        yield* leaderConnection.executeValues("SELECT pg_advisory_lock($1)", [Intake.INTAKE_LOCK_KEY]).pipe(
          Effect.orDie
        )
        // the standby starts now: its registry and its key index are loaded (empty)
        const standby = yield* Layer.build(replica(config).pipe(Layer.provide(onDb)))
        const standbyProcessor = Context.get(standby, Processor.Processor)
        expect((yield* standbyProcessor.stats).priorRefKeys).toBe(0)

        // under the old leader: Bob's backlink hook, Alice's like of Bob's post, Alice's post citing it
        const leader = Context.get(yield* Layer.build(matching(config).pipe(Layer.provide(onDb))), Processor.Processor)
        yield* leader.processEvents(
          [whEv(BOB, "bl", whRecordValue(`at://${BOB}`, { backlinks: true }), { rev: tidAt(T0) })],
          { registryWriter: true }
        )
        yield* leader.processEvents(
          [
            ev(ALICE, LIKE, "l1", { rev: tidAt(T0 + 1000), record: likeOf(bobPost), stream: "backlink" }),
            ev(ALICE, POST, "p1", { rev: tidAt(T0 + 2000), record: { $type: POST, text: bobPost }, stream: "backlink" })
          ],
          { registryWriter: false }
        )
        expect(yield* delivered("l1")).toEqual(["create"])
        expect(yield* delivered("p1")).toEqual(["create"])

        // the old leader is gone: the standby takes the role, and its streams connect
        yield* leaderConnection.executeValues("SELECT pg_advisory_unlock($1)", [Intake.INTAKE_LOCK_KEY]).pipe(
          Effect.orDie
        )
        yield* eventually(Effect.sync(() => fake.connections.some(isBacklink)), "the new leader's backlink stream")

        // Alice edits her post (no reference left) and deletes her like
        fake.publish([
          commitFrame(ALICE, T0 + 1_000_000, POST, "p1", "update", { $type: POST, text: "edited" }),
          commitFrame(ALICE, T0 + 1_001_000, LIKE, "l1", "delete")
        ])
        yield* eventually(
          Effect.map(delivered("l1"), (ops) => ops.includes("delete")),
          "the like's delete delivered to Bob's backlink hook"
        )
        expect(yield* delivered("l1")).toEqual(["create", "delete"])
        expect(yield* delivered("p1")).toEqual(["create", "update"])
        // and the index follows: both keys gone
        const stats = yield* standbyProcessor.stats
        expect(stats.priorRefKeys).toBe(1)
        expect(stats.priorRefIndexComplete).toBe(true)
      }),
    { timeout: 60_000 }
  )
})
