/**
 * Through the real intake on the relay firehose: valid atproto data that the fast decoders could
 * not represent (a DAG-CBOR integer outside ±(2^53 − 1), a collection NSID longer than a scope's
 * 253 chars) is matched and delivered, instead of being a poison frame that stalls the stream.
 */
import { describe, expect, it } from "@effect/vitest"
import { Duration, Effect, Ref } from "effect"
import * as CursorStore from "../../src/services/intake/CursorStore.js"
import * as Intake from "../../src/services/intake/Intake.js"
import * as Outbox from "../../src/services/matching/Outbox.js"
import { eventually } from "../support/eventually.js"
import { relayConfig, relayServer } from "../support/fakeRelay.js"
import { memoryStack, whRecordValue } from "../support/stack.js"
import * as frames from "./frames.js"

const WH = "place.wisp.v2.wh"

describe("Intake on the relay firehose: data the fast decoders cannot represent", () => {
  it.scopedLive(
    "a record with an integer beyond 2^53 in a 263-char collection is delivered with its exact digits; the cursor moves on",
    () =>
      Effect.gen(function*() {
        const OWNER = frames.DID
        const connections: Array<{ send: (b: Uint8Array) => void }> = []
        const { port } = yield* relayServer((socket) => connections.push({ send: (b) => socket.send(b) }))
        const config = relayConfig(port)
        const seg = "a".repeat(63)
        const collection = `com.${seg}.${seg}.${seg}.${"b".repeat(60)}.record` // a valid NSID, 263 chars
        const record = { $type: collection, n: 4294967296 }
        const block = frames.wideIntBlock(record, [2n ** 60n + 3n])
        yield* Effect.gen(function*() {
          const intake = yield* Intake.make({
            tuning: {
              ...Intake.defaultTuning(512, 128),
              batchRetryBase: Duration.millis(5),
              backoffBase: Duration.millis(10),
              backoffCap: Duration.millis(50),
              poisonBackoff: Duration.millis(20)
            }
          })
          yield* Effect.forkScoped(intake.run)
          yield* eventually(Effect.sync(() => connections.length === 1), "connected")
          // a webhook on the whole repo (a DID scope), then the record
          connections[0]!.send(frames.commitFrame({
            seq: 10,
            rev: "3l3qo2vutsw2b",
            ops: [{ action: "create", path: `${WH}/hook`, record: whRecordValue(`at://${OWNER}`) }]
          }))
          connections[0]!.send(frames.commitFrame({
            seq: 11,
            rev: "3l3qo2vutsw2c",
            ops: [{ action: "create", path: `${collection}/big`, record, block }]
          }))
          const outbox = yield* Outbox.MemoryOutboxState
          yield* eventually(
            Effect.map(Ref.get(outbox), (s) => [...s.rows.values()].some((r) => r.eventRkey === "big")),
            "the record enqueued"
          )
          const s = yield* Ref.get(outbox)
          const row = [...s.rows.values()].find((r) => r.eventRkey === "big")!
          expect(row.eventCollection).toBe(collection)
          const body = s.events.get(row.eventId)?.body ?? ""
          expect(body).toContain(`"record":{"$type":"${collection}","n":1152921504606846979}`)
          expect(s.quarantine).toEqual([])
          const cursors = yield* CursorStore.CursorStore
          expect(yield* cursors.load("relay", `ws://127.0.0.1:${port}`)).toBe(11n)
          expect(connections.length).toBe(1)
        }).pipe(Effect.provide(memoryStack({ config })))
      }),
    { timeout: 60_000 }
  )
})
