/**
 * An outcome whose time is outside Date's range (epoch ms beyond ±8.64e15) has no ISO form: its
 * frame cannot be rendered. One such outcome must never stop the live tail of the process:
 * - from another process (a row of a notification): the row does not decode, so it is skipped
 *   alone, with the notification's other outcomes kept (docs/decisions.md: "skipped alone");
 * - however it reaches the hub (here published in this process, past any decoding): it is skipped
 *   alone, counted as dropped on its owner's connections (their next `#info`) and logged once;
 *   the hub goes on serving every connection (before, `toISOString` threw in the hub's fan-out
 *   fiber, which died: no tail of the process received anything more until a restart).
 */
import { describe, expect, it } from "@effect/vitest"
import { Effect } from "effect"
import * as TailHub from "../../src/services/api/Tail.js"
import * as DeliveryOutcomes from "../../src/services/delivery/DeliveryOutcomes.js"
import { captureLogs } from "../support/captureLogs.js"
import { outcome } from "./tailClient.js"

const A = "did:plc:aaaaaaaaaaaaaaaaaaaaaaaa"
const B = "did:plc:bbbbbbbbbbbbbbbbbbbbbbbb"
const DATE_MAX_MS = 8_640_000_000_000_000

const row = (id: string, atMs: number) => ["01" + id, B, "hook1", "create", "delivered", 200, null, atMs]
const payload = (rows: ReadonlyArray<ReadonlyArray<unknown>>) => JSON.stringify({ o: "peer-origin", d: rows })

describe("a tail outcome whose time is outside Date's range", () => {
  it("a notified row with such a time is skipped alone; times from 0 to Date's last are kept", () => {
    const decoded = DeliveryOutcomes.decode(payload([
      row("TOOLATE", 9e15),
      row("JUSTPAST", DATE_MAX_MS + 1),
      row("NEGATIVE", -1),
      row("EPOCH", 0),
      row("LAST", DATE_MAX_MS),
      row("NOW", Date.UTC(2026, 11, 7))
    ]))
    expect(decoded?.skipped).toBe(3)
    expect(decoded?.outcomes.map((o) => o.id)).toEqual(["01EPOCH", "01LAST", "01NOW"])
  })

  it("a frame that cannot be rendered is undefined (never thrown)", () => {
    expect(TailHub.renderFrame(outcome(A, { atMs: 9e15 }))).toBeUndefined()
    expect(TailHub.renderFrame(outcome(A, { atMs: Number.NaN }))).toBeUndefined()
    expect(TailHub.renderFrame(outcome(A, { atMs: DATE_MAX_MS }))?.at).toBe("+275760-09-13T00:00:00.000Z")
  })

  it.scopedLive("published in the process, it is skipped alone: every connection goes on, its owner's counts it", () =>
    Effect.gen(function*() {
      const { layer, lines } = yield* captureLogs
      const outcomes = yield* DeliveryOutcomes.make()
      const tail = yield* TailHub.make().pipe(
        Effect.provideService(DeliveryOutcomes.DeliveryOutcomes, outcomes),
        Effect.provide(layer)
      )
      const a = yield* tail.connect(A)
      const b = yield* tail.connect(B)
      // another owner's, then the connection's own owner's, then good ones
      yield* outcomes.publish(outcome(B, { id: "01BADB", atMs: 9e15 }))
      yield* outcomes.publish(outcome(A, { id: "01BADA", atMs: -9e15 }))
      yield* outcomes.publish(outcome(A, { id: "01GOODA" }))
      yield* outcomes.publish(outcome(B, { id: "01GOODB" }))
      // bounded in real time: a hub that died never answers
      const framesA = yield* Effect.timeoutFail(a.take, { duration: "10 seconds", onTimeout: () => "no frame for A" })
      const framesB = yield* Effect.timeoutFail(b.take, { duration: "10 seconds", onTimeout: () => "no frame for B" })
      const ids = (fs: ReadonlyArray<TailHub.Frame>) =>
        fs.map((f) => f.$type === TailHub.OUTCOME_TYPE ? f.id : `info ${f.dropped}`)
      expect(ids(framesA)).toEqual(["01GOODA", "info 1"])
      expect(ids(framesB)).toEqual(["01GOODB", "info 1"])
      expect((yield* tail.stats).dropped).toBe(2)
      // logged, without the outcome's values
      const logged = (yield* lines).filter((l) => l.includes("could not be rendered"))
      expect(logged.length).toBe(1)
      expect(logged.join()).not.toContain("01BAD")
      expect(logged.join()).not.toContain(A)
    }))
})
