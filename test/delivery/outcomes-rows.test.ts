/**
 * The live tail's outcome notifications row by row (DeliveryOutcomes; SPEC §8.5
 * `subscribeDeliveries`: "a frame per terminal outcome of the caller's deliveries"), in units:
 * - a receiver's status outside 100–599 (999; classified `http_5xx`, docs/decisions.md) is notified
 *   as no status, and the outcome itself still reaches the other processes, with the payload's other
 *   outcomes (before, the row schema refused it and the whole payload, up to 256 outcomes of any
 *   owners, was lost);
 * - a row that does not decode (another process's, of a version that sent such a status, or any
 *   malformed one) is skipped alone: the payload's other outcomes are published, the skipped ones
 *   counted as dropped and logged at most once a minute (never their values).
 */
import { describe, expect, it } from "@effect/vitest"
import { Chunk, Duration, Effect, Metric, MetricState, Queue, Stream, TestClock } from "effect"
import * as DeliveryOutcomes from "../../src/services/delivery/DeliveryOutcomes.js"
import { outcome } from "../api/tailClient.js"
import { captureLogs } from "../support/captureLogs.js"

const OWNER_A = "did:plc:aaaaaaaaaaaaaaaaaaaaaaaa"
const OWNER_B = "did:plc:bbbbbbbbbbbbbbbbbbbbbbbb"

const droppedTotal = Effect.map(Metric.snapshot, (pairs) => {
  for (const pair of pairs) {
    if (pair.metricKey.name !== "firehook_outcomes_dropped_total") continue
    if (MetricState.isCounterState(pair.metricState)) return Number(pair.metricState.count)
  }
  return 0
})

/** `payload` (one outcome or more, of `origin`) with `rows` (JSON texts) put before its own. */
const withRows = (payload: string, rows: ReadonlyArray<string>) => payload.replace("\"d\":[", `"d":[${rows.join(",")},`)

describe("DeliveryOutcomes: a status outside 100–599", () => {
  it("is notified as no status; the outcome and the payload's others arrive", () => {
    const ok = outcome(OWNER_A, { id: "01OKROW" })
    const odd = outcome(OWNER_B, { id: "01ODDROW", status: "dead_letter", httpStatus: 999, errorKind: "http_5xx" })
    const { payloads, skipped } = DeliveryOutcomes.encodePayloads("origin", [ok, odd])
    expect(skipped).toBe(0)
    expect(payloads.length).toBe(1)
    expect(payloads[0]?.text).not.toContain("999")
    const decoded = DeliveryOutcomes.decode(payloads[0]?.text ?? "")
    expect(decoded?.skipped).toBe(0)
    expect(decoded?.outcomes).toEqual([
      ok,
      { ...odd, httpStatus: undefined }
    ])
  })

  it("a status in 100–599 is notified as it is, at both ends of the range", () => {
    const low = outcome(OWNER_A, { httpStatus: 100 })
    const high = outcome(OWNER_A, { status: "dead_letter", httpStatus: 599, errorKind: "http_5xx" })
    const { payloads } = DeliveryOutcomes.encodePayloads("origin", [low, high])
    expect(DeliveryOutcomes.decode(payloads[0]?.text ?? "")?.outcomes.map((o) => o.httpStatus)).toEqual([100, 599])
  })

  it("a row with such a status from another process is read without it", () => {
    const ok = outcome(OWNER_A, { id: "01OKROW2" })
    const text = DeliveryOutcomes.encodePayloads("other", [ok]).payloads[0]?.text ?? ""
    const old = JSON.stringify(["01OLDROW", OWNER_B, "hook1", "create", "dead_letter", 799, "http_5xx", 1])
    const decoded = DeliveryOutcomes.decode(withRows(text, [old]))
    expect(decoded?.skipped).toBe(0)
    expect(decoded?.outcomes.map((o) => [o.id, o.httpStatus, o.errorKind])).toEqual([
      ["01OLDROW", undefined, "http_5xx"],
      ["01OKROW2", 200, undefined]
    ])
  })
})

describe("DeliveryOutcomes: a row that does not decode", () => {
  it("is skipped alone: the payload's other outcomes are kept", () => {
    const ok = outcome(OWNER_A, { id: "01KEPT" })
    const text = DeliveryOutcomes.encodePayloads("other", [ok]).payloads[0]?.text ?? ""
    const bad = [
      JSON.stringify(["01BADDID", "not a did", "hook1", "create", "delivered", 200, null, 1]),
      JSON.stringify(["01BADSTATUS", OWNER_B, "hook1", "create", "pending", null, null, 1]),
      "{\"not\":\"a row\"}"
    ]
    const decoded = DeliveryOutcomes.decode(withRows(text, bad))
    expect(decoded?.origin).toBe("other")
    expect(decoded?.outcomes.map((o) => o.id)).toEqual(["01KEPT"])
    expect(decoded?.skipped).toBe(3)
  })

  it("a payload that is not one is still refused whole", () => {
    expect(DeliveryOutcomes.decode("{\"o\":\"x\"}")).toBeUndefined()
    expect(DeliveryOutcomes.decode("not json")).toBeUndefined()
  })

  it.scoped("heard from another process: the others are published, the skipped counted and logged once a minute", () =>
    Effect.gen(function*() {
      const { layer, lines } = yield* captureLogs
      const payloads = yield* Queue.unbounded<string>()
      const outcomes = yield* DeliveryOutcomes.make({ listen: Stream.fromQueue(payloads) }).pipe(Effect.provide(layer))
      const feed = yield* outcomes.subscribe
      const before = yield* droppedTotal
      const bad = JSON.stringify(["01BAD", "not a did", "hook1", "create", "delivered", 200, null, 1])
      const payloadOf = (id: string) =>
        withRows(DeliveryOutcomes.encodePayloads("other", [outcome(OWNER_A, { id })]).payloads[0]?.text ?? "", [bad])

      yield* Queue.offer(payloads, payloadOf("01FIRST"))
      yield* TestClock.adjust(Duration.zero)
      yield* Queue.offer(payloads, payloadOf("01SECOND"))
      yield* TestClock.adjust(Duration.zero)
      expect(Chunk.toReadonlyArray(yield* Queue.takeAll(feed)).map((o) => o.id)).toEqual(["01FIRST", "01SECOND"])
      expect((yield* droppedTotal) - before).toBe(2)
      const skippedLines = (yield* lines).filter((l) => l.includes("do not decode"))
      expect(skippedLines.map((l) => JSON.parse(l) as unknown)).toEqual([{
        message: ["delivery outcomes: notified outcomes that do not decode were skipped"],
        annotations: { skipped: 1, suppressed: 0 }
      }])

      // a minute later: logged again, with the count held back meanwhile
      yield* TestClock.adjust(Duration.minutes(1))
      yield* Queue.offer(payloads, payloadOf("01THIRD"))
      yield* TestClock.adjust(Duration.zero)
      expect(Chunk.toReadonlyArray(yield* Queue.takeAll(feed)).map((o) => o.id)).toEqual(["01THIRD"])
      const again = (yield* lines).filter((l) => l.includes("do not decode"))
      expect(again.length).toBe(2)
      expect(JSON.parse(again[1] ?? "{}")).toMatchObject({ annotations: { skipped: 1, suppressed: 1 } })
    }))
})
