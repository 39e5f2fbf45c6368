/**
 * A claim whose second statement (the origin walk) failed after its first had leased rows answers
 * those rows with the failure (DeliveryStoreSql.ts). The worker sends the rows, and handles the
 * failure as a failed claim's: the claim connection, which holds its liveness mark, may have been
 * lost for a moment, so every held lease is renewed at the next mark confirmation (seconds), not at
 * the next heartbeat (a third of a lease). Real PostgreSQL, a receiver that keeps the row in flight.
 */
import { describe, expect, it } from "@effect/vitest"
import { Effect, Layer } from "effect"
import { DeliveryStore, makeSql } from "../../src/services/delivery/DeliveryStore.js"
import { StoreError } from "../../src/services/platform/Persistence.js"
import { ev, plc, rev, sqlStack, whEv, whRecordValue } from "../support/stack.js"
import { eventually, receiver, run, startWorker } from "./worker-support.js"

const OWNER = plc(1)
const BOB = plc(2)
const ENV = { WEBHOOK_ALLOW_INSECURE_DEV: "1", DELIVERY_TIMEOUT_MS: "30000" }

describe("a claim answered with its walk's failure", () => {
  it.scopedLive(
    "the rows are sent, and their leases are renewed at the next mark confirmation",
    () =>
      Effect.gen(function*() {
        const rx = yield* receiver({ reply: () => "hang" })
        yield* run([whEv(OWNER, "w", whRecordValue(`at://${BOB}`, { url: `${rx.url}/in` }), { rev: rev(1) })])
        const renewed: Array<string> = []
        let failed = false
        const store = Layer.scoped(
          DeliveryStore,
          Effect.map(makeSql, (s) => ({
            ...s,
            claim: (...args: Parameters<typeof s.claim>) =>
              Effect.map(s.claim(...args), (r) => {
                if (r.rows.length === 0 || failed) return r
                failed = true
                return { ...r, failure: new StoreError({ op: "delivery.claim", code: "connection" }) }
              }),
            heartbeatMany: (...args: Parameters<typeof s.heartbeatMany>) =>
              Effect.tap(
                s.heartbeatMany(...args),
                () => Effect.sync(() => renewed.push(...args[0].map((l) => l.deliveryId)))
              )
          }))
        )
        yield* startWorker({ options: { pollIntervalMs: 50 }, store })
        yield* run([ev(BOB, "app.bsky.feed.post", "p1", { rev: rev(10) })])
        // the row claimed with the failure is sent
        yield* eventually("sent", Effect.sync(() => rx.received.length), (n) => n === 1)
        expect(failed).toBe(true)
        // the heartbeat would renew it a third of a lease (20 s) after its claim; the mark
        // confirmation (every 2 s) renews it once the claim connection's failure is known
        yield* eventually(
          "renewed",
          Effect.sync(() => renewed.length),
          (n) => n >= 1,
          8_000
        )
      }).pipe(Effect.scoped, Effect.provide(sqlStack({ env: ENV }))),
    30_000
  )
})
