/**
 * The backstop of the direct set's byte bound (admission keeps it under IndexRules.DIRECT_DIDS_MAX_BYTES):
 * a direct set whose `options_update` hello would be over Jetstream's 10 MB (Jetstream closes the
 * connection on it) is not planned: the direct stream keeps its previous set, with one warning and
 * no values logged. TestClock; the streams are stand-ins that record their restarts.
 */
import { describe, expect, it } from "@effect/vitest"
import { Duration, Effect, Logger, Ref, TestClock } from "effect"
import { MAX_SCOPE_URI_LENGTH } from "../../src/schemas/AtUri.js"
import { directHelloFits, directStep, runJetstream } from "../../src/services/intake/JetstreamPlan.js"
import {
  initialState,
  type StreamRunner,
  type StreamSpec,
  type StreamState
} from "../../src/services/intake/StreamModel.js"
import { WebhookIndex } from "../../src/services/matching/WebhookIndex.js"
import { plc, webhook } from "../matching/fixtures.js"
import { longDidWeb } from "../support/longDidWeb.js"
import { turns } from "./intake-bounds-support.js"

const LEN = MAX_SCOPE_URI_LENGTH - "at://".length
const OWNER = plc(1)
/** 5,000 DIDs of 2,043 characters: a hello of ~10.2 MB, within the count limit */
const OVERSIZE = 5_000
const nextCheck = Effect.zipRight(TestClock.adjust("1 second"), turns(10))

describe("the direct stream's hello over Jetstream's 10 MB limit", () => {
  it("directHelloFits measures the hello; directStep keeps the previous plan when it does not fit", () => {
    const big = Array.from({ length: OVERSIZE }, (_, i) => longDidWeb(i, LEN))
    expect(directHelloFits(big)).toBe(false)
    expect(directHelloFits(big.slice(0, 4_000))).toBe(true)
    const A = plc(2)
    expect(directStep(new Set([A]), new Set(big), true, 10_000, false, false)).toEqual({ _tag: "too_large" })
    expect(directStep(new Set(), new Set(big), false, 10_000, false, false)).toEqual({ _tag: "too_large" })
    // an emptied set still stops the stream
    expect(directStep(new Set([A]), new Set(), true, 10_000, false, false)).toEqual({ _tag: "stop" })
  })

  it.scoped("the plan does not reconnect the direct stream with an oversize set; it warns once, with no values", () =>
    Effect.gen(function*() {
      const logs: Array<string> = []
      const restarts: Array<string> = []
      const started: Array<string> = []
      const index = new WebhookIndex()
      index.upsert(webhook(OWNER, "w0", `at://${plc(2)}`))
      const makeRunner = (spec: StreamSpec) =>
        Effect.map(Ref.make<StreamState>(initialState), (state): StreamRunner => ({
          spec,
          state,
          restart: () => Effect.sync(() => void restarts.push(spec.name)),
          runFrom: () => Effect.never,
          run: Effect.never,
          stopReading: Effect.void
        }))
      yield* Effect.forkScoped(
        runJetstream({
          url: "wss://jetstream.test/subscribe",
          common: { maxBytes: 1 << 20, connectTimeoutMs: 1000, allowInsecure: false },
          index,
          directDidsMax: 10_000,
          reconfigureDelay: Duration.seconds(1),
          makeRunner,
          start: (r) => Effect.zipRight(Effect.sync(() => void started.push(r.spec.name)), Effect.never)
        }).pipe(
          Effect.provide(Logger.replace(
            Logger.defaultLogger,
            Logger.make(({ message }) => void logs.push(Array.isArray(message) ? message.join(" ") : String(message)))
          ))
        )
      )
      yield* turns(10)
      expect(started).toEqual(["registry", "direct"])
      // bypassing admission (as a changed configuration could): a set whose hello is ~10.2 MB
      for (let i = 0; i < OVERSIZE; i++) index.upsert(webhook(OWNER, `w${i + 1}`, `at://${longDidWeb(i, LEN)}`))
      for (let n = 0; n < 3; n++) {
        yield* nextCheck
        // and it changes again while over: still no reconnect, no second warning
        index.upsert(webhook(OWNER, `x${n}`, `at://${longDidWeb(OVERSIZE + n, LEN)}`))
      }
      expect(restarts.filter((s) => s === "direct")).toEqual([])
      const warnings = logs.filter((l) => l.includes("size limit"))
      expect(warnings).toHaveLength(1)
      expect(warnings[0]).not.toContain("did:")
      // back within the limit: the plan reconnects it (replaying for the new DIDs)
      for (let i = 0; i < OVERSIZE; i++) index.remove(`${OWNER}/w${i + 1}`)
      yield* nextCheck
      expect(restarts.filter((s) => s === "direct")).toHaveLength(1)
    }))
})
