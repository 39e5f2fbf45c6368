/**
 * A relay that answers `FutureCursor` (its seq space is behind the stored cursor: a relay reset, or
 * RELAY_URL now names another relay behind the same name), on a real socket. Intake goes live
 * (docs/decisions.md); it must do so at once: every second it waits is a second of events it will
 * never read, since a live connection starts at the relay's present. Before, the error frame was
 * treated like a poison frame: the stream was shown `quarantined` and waited at least
 * WEBHOOK_INTAKE_POISON_BACKOFF_MS (10 s by default) before its live connection.
 */
import { describe, expect, it } from "@effect/vitest"
import { Duration, Effect } from "effect"
import * as CursorStore from "../../src/services/intake/CursorStore.js"
import * as Intake from "../../src/services/intake/Intake.js"
import { eventually } from "../support/eventually.js"
import { relayConfig, relayServer } from "../support/fakeRelay.js"
import { memoryStack } from "../support/stack.js"
import { errorFrame } from "./frames.js"

const tuning: Partial<Intake.IntakeTuning> = {
  batchRetryBase: Duration.millis(5),
  backoffBase: Duration.millis(10),
  backoffCap: Duration.millis(50),
  // far longer than the test waits for the live connection
  poisonBackoff: Duration.minutes(10)
}

describe("a relay answering FutureCursor to the stored cursor", () => {
  it.scopedLive(
    "the stream reconnects live at once, not quarantined and without the poison backoff",
    () =>
      Effect.gen(function*() {
        const cursors: Array<string | null> = []
        const { port } = yield* relayServer((socket, req) => {
          const cursor = new URL(req.url ?? "/", "ws://x").searchParams.get("cursor")
          cursors.push(cursor)
          // as the reference PDS does: the error frame, then close 1008
          if (cursor !== null) {
            socket.send(errorFrame("FutureCursor"))
            socket.close(1008, "FutureCursor")
          }
        })
        yield* Effect.gen(function*() {
          const store = yield* CursorStore.CursorStore
          yield* store.save("relay", `ws://127.0.0.1:${port}`, 26_000_000_000n)
          const intake = yield* Intake.make({ tuning })
          yield* Effect.forkScoped(intake.run)
          yield* eventually(Effect.sync(() => cursors.length >= 2), "the live connection after FutureCursor")
          // the stored cursor rewound, then live
          expect(cursors.slice(0, 2)).toEqual([String(26_000_000_000n - 10n), null])
          yield* eventually(
            Effect.map(intake.stats, (s) => s.streams[0]?.state.connected === true),
            "connected live"
          )
          const state = (yield* intake.stats).streams[0]?.state
          // a relay error frame is a protocol failure, but no poison frame: nothing is quarantined
          expect(state).toMatchObject({ quarantined: false, failureKind: "protocol", connected: true })
        }).pipe(Effect.provide(memoryStack({ config: relayConfig(port) })))
      }),
    { timeout: 60_000 }
  )
})
