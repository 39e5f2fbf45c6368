/**
 * A registration's replay survives a crash (SPEC §3.1: "nothing since the registration is
 * missed"; §6.4: another process may take the intake lock at any instant). The registry stream
 * commits a registration; the direct stream (and, for a backlink webhook, the backlink stream)
 * must replay from before it, as it may have read the DID's events made after the registration
 * before the registry stream registered it. Until 0017 that obligation was held in memory only
 * (JetstreamPlan's check, the runner's replay point): a process that died (SIGKILL, or lost the
 * intake lock) after the registry commit and before a session from the replay point committed a
 * batch lost it, and the next process started from its durable cursor − 2 s: the new webhook never
 * got the events read in between (found by a review; the assertions below failed: p1 reached
 * ["w1"] only, l1 ["b1"] only). The registry batch now writes it in its transaction
 * (`cursors.replay_from`), and the stream clears it once its replay reached its stored cursor.
 *
 * Three "processes" (each its own Processor/Registry/Intake over ONE PostgreSQL database; closing
 * a process's scope loses its memory, as a crash or a lost leader lock does) against the fake
 * Jetstream. Process 2's reconfiguration delay is long so that its "crash" lands inside the window.
 */
import * as SqlClient from "@effect/sql/SqlClient"
import { describe, expect, it } from "@effect/vitest"
import { Duration, Effect, Layer } from "effect"
import * as Intake from "../../src/services/intake/Intake.js"
import * as Config from "../../src/services/platform/Config.js"
import * as Db from "../support/db.js"
import { eventually } from "../support/eventually.js"
import { commitFrame, type Connection, startFakeJetstream } from "../support/fakeJetstream.js"
import { plc, sqlServices, testConfig, WH, whRecordValue } from "../support/stack.js"
import { fastTuning, isBacklink, isDirect, isOpen, isRegistry, sendTo } from "./jetstream-connections-support.js"

const POST = "app.bsky.feed.post"
const LIKE = "app.bsky.feed.like"
const T0 = 1_750_000_000_000_000
const S = 1_000_000
const OWNER = plc(1)
const X = plc(2)
const STRANGER = plc(9)
const likeOf = (did: string) => ({ $type: LIKE, subject: { uri: `at://${did}/${POST}/3kpost`, cid: "bafyx" } })

interface Case {
  /** the stream that reads the events of the scenario */
  readonly stream: "direct" | "backlink"
  readonly which: (c: Connection) => boolean
  readonly backlinks: boolean
  /** the event made at `timeUs` that the scenario's webhooks match */
  readonly event: (rkey: string, timeUs: number) => ReturnType<typeof commitFrame>
}

const cases: ReadonlyArray<Case> = [
  {
    stream: "direct",
    which: isDirect,
    backlinks: false,
    event: (rkey, timeUs) => commitFrame(X, timeUs, POST, rkey, "create")
  },
  {
    stream: "backlink",
    which: isBacklink,
    backlinks: true,
    event: (rkey, timeUs) => commitFrame(STRANGER, timeUs, LIKE, rkey, "create", likeOf(X))
  }
]

describe("a crash between a registration's commit and its stream's replay", () => {
  for (const c of cases) {
    it.scopedLive(
      `the ${c.stream} stream replays for the new webhook after a restart (durable replay obligation)`,
      () =>
        Effect.gen(function*() {
          const fake = yield* Effect.acquireRelease(
            Effect.promise(() => startFakeJetstream()),
            (f) => Effect.promise(() => f.close())
          )
          const config = testConfig({ NODE_ENV: "test", WEBHOOK_ALLOW_INSECURE_DEV: "1", JETSTREAM_URL: fake.url })
          const db = yield* Layer.build(Layer.mergeAll(Db.layer(), Config.layerValue(config)))
          const sql = yield* Effect.provide(SqlClient.SqlClient, db)
          const webhooksOf = (eventRkey: string) =>
            Effect.orDie(sql<{ webhook_rkey: string }>`
              SELECT webhook_rkey FROM outbox WHERE event_rkey = ${eventRkey} ORDER BY webhook_rkey`).pipe(
              Effect.map((rows) => rows.map((r) => r.webhook_rkey))
            )
          const rowOf = (stream: string) =>
            Effect.orDie(sql<{ cursor: string; replay_from: string | null }>`
              SELECT cursor::text AS cursor, replay_from::text AS replay_from FROM cursors WHERE stream = ${stream}`)
              .pipe(Effect.map((rows) => rows[0]))
          const cursorOf = (stream: string) =>
            Effect.map(rowOf(stream), (r) => (r === undefined ? undefined : BigInt(r.cursor)))
          /** one process: its own matching services and intake, until `body` ends (then it "dies") */
          const processRun = (reconfigureDelay: Duration.DurationInput, body: Effect.Effect<void>) =>
            Effect.scoped(
              Effect.gen(function*() {
                const ctx = yield* Layer.build(sqlServices())
                const intake = yield* Intake.make({ reconfigureDelay, tuning: fastTuning }).pipe(Effect.provide(ctx))
                yield* Effect.forkScoped(intake.run)
                yield* body
              }).pipe(Effect.provide(db))
            )
          const wh = (rkey: string, timeUs: number, url?: string) =>
            commitFrame(
              OWNER,
              timeUs,
              WH,
              rkey,
              "create",
              whRecordValue(`at://${X}`, { backlinks: c.backlinks, ...(url === undefined ? {} : { url }) })
            )

          // process 1: w1 registered; the stream runs and commits e0 for it
          yield* processRun(
            "20 millis",
            Effect.gen(function*() {
              fake.publish([wh("w1", T0 + 1 * S)])
              yield* eventually(Effect.sync(() => fake.connections.some((x) => c.which(x) && isOpen(x))), c.stream)
              fake.publish([c.event("e0", T0 + 2 * S)])
              yield* eventually(Effect.map(webhooksOf("e0"), (w) => w.includes("w1")), "e0 for w1")
            })
          )

          // process 2: the registry stream lags. The stream reads e1 (T0+11 s) and e2 (T0+20 s)
          // and commits its cursor at T0+20 s; then the registry stream registers w2 (T0+10 s)
          // and commits it; the process dies before its next check
          const w2 = wh("w2", T0 + 10 * S, "https://second.example/hook")
          const e1 = c.event("e1", T0 + 11 * S)
          const e2 = c.event("e2", T0 + 20 * S)
          const before2 = fake.connections.length
          yield* processRun(
            "1 hour",
            Effect.gen(function*() {
              // process 2's stream and registry stream have sent their options (so the fake has
              // replayed the log to them: nothing published from here on is replayed to them), and
              // none of process 1's connections is still open (the frames sent below reach process 2
              // only)
              yield* eventually(
                Effect.sync(() => {
                  const live = fake.connections.slice(before2).filter(isOpen)
                  return live.some(c.which) && live.some(isRegistry) &&
                    !fake.connections.slice(0, before2).some(isOpen)
                }),
                "process 2 connected"
              )
              fake.paused = true
              fake.publish([w2, e1, e2])
              sendTo(fake, c.which, e1)
              sendTo(fake, c.which, e2)
              yield* eventually(
                Effect.map(cursorOf(c.stream), (x) => x !== undefined && x >= BigInt(T0 + 20 * S)),
                `${c.stream} at e2`
              )
              expect(yield* webhooksOf("e1")).toEqual(["w1"])
              sendTo(fake, isRegistry, w2)
              yield* eventually(
                Effect.map(cursorOf("registry"), (x) => x !== undefined && x >= BigInt(T0 + 10 * S)),
                "w2 committed"
              )
              // the obligation is durable: w2's time − 2 s
              expect((yield* rowOf(c.stream))?.replay_from).toBe(String(T0 + 8 * S))
            })
          )
          fake.paused = false

          // process 3 (a restart, or the standby that took the lock): w2 is stored; the stream
          // resumes from min(its durable cursor − 2 s, the obligation)
          yield* processRun(
            "20 millis",
            Effect.gen(function*() {
              yield* eventually(Effect.map(webhooksOf("e2"), (w) => w.includes("w2")), "e2 for w2")
              yield* eventually(
                Effect.map(webhooksOf("e1"), (w) => w.length === 2),
                "e1 for w2 (made after its registration)"
              )
              expect(yield* webhooksOf("e1")).toEqual(["w1", "w2"])
              // replayed up to the stored cursor: cleared
              yield* eventually(Effect.map(rowOf(c.stream), (r) => r?.replay_from === null), "obligation cleared")
            })
          )

          // process 4: nothing pending, the stream resumes from its durable cursor − 2 s only
          const before = fake.connections.length
          yield* processRun(
            "20 millis",
            Effect.gen(function*() {
              yield* eventually(
                Effect.sync(() => fake.connections.slice(before).some((x) => c.which(x) && isOpen(x))),
                "process 4 connected"
              )
              const first = fake.connections.slice(before).find(c.which)
              expect(first?.cursor).toBe(BigInt(T0 + 18 * S))
            })
          )
        }),
      { timeout: 90_000 }
    )
  }
})
