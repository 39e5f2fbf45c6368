/**
 * Health of a relay stream that has committed nothing since this process started (real relay socket,
 * real PostgreSQL): its `cursorAgeSeconds` counts from when its stored cursor was written, as a
 * Jetstream stream's counts from its loaded time cursor. A relay `seq` is not a time, so before, a
 * relay stream stalled on a poison frame since startup reported a cursor age of 0 for ever
 * (docs/operations.md promises it grows).
 */
import * as SqlClient from "@effect/sql/SqlClient"
import { describe, expect, it } from "@effect/vitest"
import { Context, Duration, Effect, Layer } from "effect"
import * as Intake from "../../src/services/intake/Intake.js"
import * as Config from "../../src/services/platform/Config.js"
import * as Db from "../support/db.js"
import { eventually } from "../support/eventually.js"
import { relayConfig, relayServer } from "../support/fakeRelay.js"
import { sqlServices } from "../support/stack.js"

const tuning: Partial<Intake.IntakeTuning> = {
  batchRetryBase: Duration.millis(5),
  backoffBase: Duration.millis(10),
  backoffCap: Duration.millis(50),
  poisonBackoff: Duration.seconds(30)
}

describe("relay stream health before its first commit", () => {
  it.scopedLive(
    "a relay stream stalled on a poison frame since startup reports the age of its stored cursor's last write, not 0",
    () =>
      Effect.gen(function*() {
        let connects = 0
        // every connection gets a text frame first: not part of the protocol, a poison frame
        const { port } = yield* relayServer((socket) => {
          connects++
          socket.send("not a cbor frame")
        })
        const config = relayConfig(port)
        const db = yield* Layer.build(Db.layer())
        const sql = Context.get(db, SqlClient.SqlClient)
        // the previous process committed seq 500 an hour ago
        yield* sql`INSERT INTO cursors (stream, relay, cursor, updated_at)
          VALUES ('relay', ${`ws://127.0.0.1:${port}`}, 500, now() - interval '1 hour')`.pipe(Effect.orDie)
        const services = sqlServices().pipe(
          Layer.provideMerge(Config.layerValue(config)),
          Layer.provide(Layer.succeedContext(db))
        )
        const intake = yield* Intake.make({ tuning }).pipe(Effect.provide(yield* Layer.build(services)))
        yield* Effect.forkScoped(intake.run)
        yield* eventually(
          Effect.map(intake.stats, (s) => connects === 1 && s.streams[0]?.state.quarantined === true),
          "quarantined at the first frame"
        )
        const h = yield* Intake.healthSection(
          intake,
          Effect.succeed("leader" as const),
          Effect.succeed({ rejected: {} })
        )
        const relay = h.body.streams["relay"]
        expect(relay).toMatchObject({ quarantined: true, failureKind: "protocol" })
        // an hour, give or take the test's own seconds
        expect(relay?.cursorAgeSeconds).toBeGreaterThanOrEqual(3590)
        expect(relay?.cursorAgeSeconds).toBeLessThanOrEqual(3700)
        expect(h.ready).toBe(false)
      }),
    { timeout: 60_000 }
  )
})
