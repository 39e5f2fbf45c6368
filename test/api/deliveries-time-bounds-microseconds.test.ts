/**
 * `since` (inclusive) and `until` (exclusive) of `listDeliveries` and `replay` are lexicon datetimes
 * applied to the microsecond, as `created_at` is kept (the rows of one intake batch share a
 * millisecond): never cut to a millisecond, so no row outside the asked range is listed or
 * replayed, none inside it is left out, and a range inside one millisecond is a valid range. A
 * fraction finer than a microsecond is rounded up; a bound in year 0000 (which the lexicon accepts
 * and PostgreSQL has no year for) is applied as 0001-01-01, never a 500.
 */
import * as SqlClient from "@effect/sql/SqlClient"
import { describe, expect, it, layer } from "@effect/vitest"
import { Effect } from "effect"
import { microsKeyText, timeMicros } from "../../src/services/operator/ListKey.js"
import { sqlServices } from "../support/stack.js"
import { env, list, outboxRows, W } from "./deliveries-support.js"
import { apiLayerWith, callAs, newOwner, type Owner } from "./support.js"

/** Three rows in one millisecond: 10:00:00.000100, .000500 and .000900 (ids `whd_t_<tag>_1..3`). */
const SAME_MS = ["2026-03-01 10:00:00.000100+00", "2026-03-01 10:00:00.000500+00", "2026-03-01 10:00:00.000900+00"]

const ids = (owner: Owner, query: string) =>
  Effect.map(list(owner, query), (p) => p.deliveries.map((d) => String(d["id"])).sort())

describe("since/until to the microsecond", () => {
  layer(apiLayerWith(sqlServices(), { env }), { excludeTestServices: true, timeout: "60 seconds" })((it) => {
    it.effect("listDeliveries: since and until inside one millisecond select exactly the rows asked for", () =>
      Effect.gen(function*() {
        const sql = yield* SqlClient.SqlClient
        const alice = yield* newOwner()
        yield* outboxRows(alice.did, "lm", SAME_MS)
        const got = {
          sinceMid: yield* ids(alice, "since=2026-03-01T10:00:00.000500Z"),
          untilMid: yield* ids(alice, "until=2026-03-01T10:00:00.000500Z"),
          // a range inside the millisecond is a range, not since >= until
          inside: yield* ids(alice, "since=2026-03-01T10:00:00.000400Z&until=2026-03-01T10:00:00.000600Z"),
          // the same instants with an offset
          offset: yield* ids(alice, `since=${encodeURIComponent("2026-03-01T11:00:00.000500+01:00")}`),
          // finer than a microsecond: rounded up (.0005001 is after the .000500 row)
          sinceFine: yield* ids(alice, "since=2026-03-01T10:00:00.0005001Z"),
          untilFine: yield* ids(alice, "until=2026-03-01T10:00:00.0005001Z"),
          // year 0000: the lexicon accepts it, PostgreSQL has no year 0: applied as 0001-01-01
          sinceYear0: yield* ids(alice, "since=0000-06-01T00:00:00Z"),
          untilYear0: yield* ids(alice, "until=0000-06-01T00:00:00Z"),
          rangeYear0: yield* ids(alice, "since=0000-03-01T00:00:00Z&until=0000-06-01T00:00:00Z")
        }
        const empty = yield* callAs(alice, `${W}.listDeliveries`, {
          query: "since=2026-03-01T10:00:00.000500Z&until=2026-03-01T10:00:00.000500Z"
        })
        yield* sql`DELETE FROM outbox WHERE owner_did = ${alice.did}`
        expect(got).toEqual({
          sinceMid: ["whd_t_lm_2", "whd_t_lm_3"],
          untilMid: ["whd_t_lm_1"],
          inside: ["whd_t_lm_2"],
          offset: ["whd_t_lm_2", "whd_t_lm_3"],
          sinceFine: ["whd_t_lm_3"],
          untilFine: ["whd_t_lm_1", "whd_t_lm_2"],
          sinceYear0: ["whd_t_lm_1", "whd_t_lm_2", "whd_t_lm_3"],
          untilYear0: [],
          rangeYear0: []
        })
        // an empty range is still refused
        expect(empty.status, empty.text).toBe(400)
        expect(empty.body["error"]).toBe("InvalidRequest")
      }))

    it.effect("replay: since leaves a dead letter earlier in the same millisecond alone", () =>
      Effect.gen(function*() {
        const sql = yield* SqlClient.SqlClient
        const alice = yield* newOwner()
        yield* outboxRows(alice.did, "rp", SAME_MS)
        const deadLetters = sql`UPDATE outbox SET status = 'dead_letter', last_error_kind = 'http_5xx',
          finished_at = now(), updated_at = now() - interval '1 minute' WHERE owner_did = ${alice.did}`
        yield* deadLetters
        const since = yield* callAs(alice, `${W}.replay`, { body: { since: "2026-03-01T10:00:00.000500Z" } })
        const afterSince = yield* sql<{ delivery_id: string; status: string }>`
          SELECT delivery_id, status FROM outbox WHERE owner_did = ${alice.did} ORDER BY delivery_id`
        yield* deadLetters
        const inside = yield* callAs(alice, `${W}.replay`, {
          body: { since: "2026-03-01T10:00:00.000400Z", until: "2026-03-01T10:00:00.000600Z" }
        })
        const afterInside = yield* sql<{ delivery_id: string; status: string }>`
          SELECT delivery_id, status FROM outbox WHERE owner_did = ${alice.did} ORDER BY delivery_id`
        yield* sql`DELETE FROM outbox WHERE owner_did = ${alice.did}`
        expect(since.status, since.text).toBe(200)
        expect(since.body["replayed"]).toBe(2)
        expect(afterSince.map((x) => [x.delivery_id, x.status])).toEqual([
          ["whd_t_rp_1", "dead_letter"],
          ["whd_t_rp_2", "pending"],
          ["whd_t_rp_3", "pending"]
        ])
        // a range inside one millisecond is accepted and replays only its row
        expect(inside.status, inside.text).toBe(200)
        expect(inside.body["replayed"]).toBe(1)
        expect(afterInside.map((x) => [x.delivery_id, x.status])).toEqual([
          ["whd_t_rp_1", "dead_letter"],
          ["whd_t_rp_2", "pending"],
          ["whd_t_rp_3", "dead_letter"]
        ])
      }))
  })
})

describe("ListKey time bounds", () => {
  it("reads an RFC 3339 time to the microsecond, rounding a finer fraction up", () => {
    const at = (s: string) => {
      const us = timeMicros(s)
      return us === undefined ? undefined : microsKeyText(us)
    }
    expect(at("2026-03-01T10:00:00.0005Z")).toBe("2026-03-01T10:00:00.000500Z")
    expect(at("2026-03-01T10:00:00.000500000Z")).toBe("2026-03-01T10:00:00.000500Z")
    expect(at("2026-03-01T10:00:00.0005001Z")).toBe("2026-03-01T10:00:00.000501Z")
    expect(at("2026-12-31T23:59:59.9999991Z")).toBe("2027-01-01T00:00:00.000000Z")
    expect(at("2026-03-01T00:30:00.25-01:00")).toBe("2026-03-01T01:30:00.250000Z")
    expect(at("0099-03-01T10:00:00Z")).toBe("0099-03-01T10:00:00.000000Z")
    // year 0000 compares as itself, and is written as the first instant PostgreSQL has
    expect(timeMicros("0000-03-01T00:00:00Z")).toBe(-62_162_035_200_000_000n)
    expect(timeMicros("0000-06-01T00:00:00Z")).toBe(-62_154_086_400_000_000n)
    expect(at("0000-06-01T00:00:00Z")).toBe("0001-01-01T00:00:00.000000Z")
    for (
      const bad of ["2026-02-30T00:00:00Z", "2026-03-01T24:00:00Z", "2026-03-01T10:00:60Z", "2026-03-01 10:00:00Z"]
    ) {
      expect(timeMicros(bad), bad).toBeUndefined()
    }
    expect(timeMicros("9999-12-31T23:30:00-01:00")).toBeUndefined()
  })
})
