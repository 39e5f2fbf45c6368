/**
 * A receiver's HTTP status outside 100–599 in the owners' views (SPEC §8.5). Node's and Bun's HTTP
 * clients accept any three digits (LinkedIn's `999 Request denied` is a real one); firehook
 * classifies such a status `http_5xx` and stores it as it came (docs/decisions.md), but the
 * lexicon's `httpStatus` is 100–599, so the views leave it out and the error kind says it:
 * - end to end (a receiver answering 999, the worker, PostgreSQL): `getDelivery`, `listDeliveries`
 *   and `list` answer 200 with `http_5xx` and no status (before: 500, every page holding the row);
 * - the live tail: the outcome's frame arrives without a status (before: skipped, and the owner got
 *   neither the frame nor an `#info`); a frame the lexicon still refuses (a bug) is counted in the
 *   connection's `#info`, so the owner knows an outcome is missing.
 * The notifications between processes: test/delivery/outcomes-rows.test.ts.
 */
import * as SqlClient from "@effect/sql/SqlClient"
import { describe, expect, layer } from "@effect/vitest"
import { Effect, TestClock } from "effect"
import * as DeliveryOutcomes from "../../src/services/delivery/DeliveryOutcomes.js"
import { eventually, receiver, startWorker } from "../delivery/worker-support.js"
import { sqlServices } from "../support/stack.js"
import { CAROL, env, post, register, W } from "./deliveries-support.js"
import { apiLayer, apiLayerWith, callAs, mint, newOwner, serverPort } from "./support.js"
import { close, openTailOrDie, outcome, until } from "./tailClient.js"

const NSID = "dev.firehook.webhook.subscribeDeliveries"
const HIGH = { limit: 1_000_000, perMs: 60_000 }

describe("a receiver's status outside 100–599 in the owners' API", () => {
  layer(apiLayerWith(sqlServices(), { env }), { excludeTestServices: true, timeout: "60 seconds" })((it) => {
    it.effect("getDelivery, listDeliveries and list answer 200: the kind http_5xx, no status", () =>
      Effect.gen(function*() {
        const sql = yield* SqlClient.SqlClient
        const rx = yield* receiver({ reply: () => ({ status: 999, body: "Request denied" }) })
        const alice = yield* newOwner()
        yield* register(alice, "hook", CAROL, { url: `${rx.url}/in` })
        yield* startWorker()
        yield* post(CAROL, "odd")
        const [row] = yield* sql<{ delivery_id: string }>`
          SELECT delivery_id FROM outbox WHERE owner_did = ${alice.did}`
        const id = row?.delivery_id ?? ""
        yield* eventually(
          "the first attempt",
          sql<{ n: number }>`SELECT count(*)::int AS n FROM delivery_attempts WHERE delivery_id = ${id}`,
          (r) => r[0]?.n === 1
        )
        // stored as it came (the audit keeps the real value)
        const stored = yield* sql<{ s: number | null; a: number | null }>`
          SELECT o.last_http_status AS s, a.http_status AS a
          FROM outbox o JOIN delivery_attempts a USING (delivery_id) WHERE o.delivery_id = ${id}`
        expect(stored[0]).toEqual({ s: 999, a: 999 })

        const shown = yield* callAs(alice, `${W}.getDelivery`, { query: `id=${id}` })
        const listed = yield* callAs(alice, `${W}.listDeliveries`, { query: "" })
        const hooks = yield* callAs(alice, `${W}.list`)
        expect({ getDelivery: shown.status, listDeliveries: listed.status, list: hooks.status }).toEqual({
          getDelivery: 200,
          listDeliveries: 200,
          list: 200
        })
        expect(shown.text).not.toContain("httpStatus")
        expect(listed.text).not.toContain("httpStatus")
        expect(hooks.text).not.toContain("httpStatus")
        const delivery = shown.body["delivery"] as { readonly [k: string]: unknown }
        expect(delivery["lastError"]).toEqual({ kind: "http_5xx" })
        const [attempt] = shown.body["attempts"] as ReadonlyArray<{ readonly [k: string]: unknown }>
        expect(attempt).toMatchObject({ n: 1, outcome: "retry", errorKind: "http_5xx" })
        expect(attempt).not.toHaveProperty("httpStatus")
        const [listedOne] = listed.body["deliveries"] as ReadonlyArray<{ readonly [k: string]: unknown }>
        expect(listedOne?.["lastError"]).toEqual({ kind: "http_5xx" })
        const [hook] = hooks.body["webhooks"] as ReadonlyArray<{ readonly [k: string]: unknown }>
        expect(hook?.["lastError"]).toEqual({ kind: "http_5xx" })
      }).pipe(Effect.scoped))
  })
})

describe("a receiver's status outside 100–599 on the live tail", () => {
  layer(apiLayer({ api: { limits: { callsPerCaller: HIGH, failedAuthPerAddress: HIGH } } }))((it) => {
    it.effect("the outcome's frame arrives, without a status", () =>
      Effect.gen(function*() {
        yield* Effect.suspend(() => TestClock.setTime(Date.now()))
        const a = yield* newOwner()
        const tail = yield* openTailOrDie(yield* serverPort, yield* mint(a, NSID))
        const odd = outcome(a.did, { status: "dead_letter", httpStatus: 799, errorKind: "http_5xx" })
        const marker = outcome(a.did, { id: "01MARKER" })
        const outcomes = yield* DeliveryOutcomes.DeliveryOutcomes
        yield* outcomes.publish(odd)
        yield* outcomes.publish(marker)
        yield* until("the marker", () => tail.frames.some((f) => f["id"] === "01MARKER"))
        expect(tail.frames.map((f) => f["id"] ?? f["$type"])).toEqual([odd.id, "01MARKER"])
        expect(tail.frames[0]).toMatchObject({ status: "dead_letter", errorKind: "http_5xx" })
        expect(tail.frames[0]).not.toHaveProperty("httpStatus")
        expect(tail.frames[1]).toMatchObject({ httpStatus: 200 })
        yield* close(tail)
      }))

    it.effect("a frame the lexicon refuses is counted in an #info, not lost silently", () =>
      Effect.gen(function*() {
        yield* Effect.suspend(() => TestClock.setTime(Date.now()))
        const a = yield* newOwner()
        const tail = yield* openTailOrDie(yield* serverPort, yield* mint(a, NSID))
        // a delivery id is printable ASCII: one with a space cannot be a frame
        const refused = outcome(a.did, { id: "01 REFUSED" })
        const marker = outcome(a.did, { id: "01MARKER2" })
        const outcomes = yield* DeliveryOutcomes.DeliveryOutcomes
        yield* outcomes.publish(refused)
        yield* outcomes.publish(marker)
        const isInfo = (f: { readonly [k: string]: unknown }) =>
          f["$type"] === "dev.firehook.webhook.subscribeDeliveries#info"
        yield* until("the marker and an #info", () =>
          tail.frames.some((f) => f["id"] === "01MARKER2") && tail.frames.some(isInfo))
        expect(tail.frames.filter((f) =>
          f["id"] === "01 REFUSED"
        )).toEqual([])
        expect(tail.frames.filter(isInfo)).toEqual([{
          $type: "dev.firehook.webhook.subscribeDeliveries#info",
          name: "DeliveriesDropped",
          message: "the connection's buffer was full",
          dropped: 1
        }])
        yield* close(tail)
      }))
  })
})
