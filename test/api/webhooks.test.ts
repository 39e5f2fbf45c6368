/**
 * The owner's webhooks (SPEC §8.5 `list`, `resume`) over the real stores on PostgreSQL: every field
 * of `list` (state, reason and time of `gone` / `autoDisabled` / `disabled`, the derived circuit,
 * bounded counts, last success and failure), the caller's refused records as `rejected`, `resume`
 * clearing the state and replaying the parked rows with their ids, and isolation between owners.
 */
import * as SqlClient from "@effect/sql/SqlClient"
import { describe, expect, it, layer } from "@effect/vitest"
import { Effect, TestClock } from "effect"
import { circuitOf, stateOf } from "../../src/services/api/WebhookMethods.js"
import { RejectedStore } from "../../src/services/registry/RejectedStore.js"
import { insertDelivery, insertWebhook } from "../support/webhookRows.js"
import { apiLayer, callAs, newOwner } from "./support.js"

const W = "dev.firehook.webhook"
/** the TestClock set to the wall clock now (the verifier library reads the wall clock) */
const wallClock = Effect.suspend(() => TestClock.setTime(Date.now()))
const ISO = /^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$/

type View = { readonly [k: string]: unknown }
const byRkey = (body: { readonly [k: string]: unknown }): Map<string, View> =>
  new Map((body["webhooks"] as ReadonlyArray<View>).map((w) => [w["rkey"] as string, w]))

describe("webhook methods", () => {
  layer(apiLayer())((it) => {
    it.effect("list: every field of SPEC §8.5, rejected records, the caller's own only", () =>
      Effect.gen(function*() {
        yield* wallClock
        const a = yield* newOwner()
        const b = yield* newOwner()
        yield* insertWebhook(a.did, "ok", { state: { last_success_at: "now() - interval '1 hour'" } })
        yield* insertWebhook(a.did, "down", {
          state: {
            auto_disabled_at: "now() - interval '1 minute'",
            failing_since: "now() - interval '6 days'",
            failed_attempts: "40",
            last_failure_at: "now() - interval '1 minute'",
            last_failure_kind: "'http_5xx'",
            last_failure_http: "503",
            last_success_at: "now() - interval '7 days'"
          }
        })
        yield* insertWebhook(a.did, "gone", { state: { gone_at: "now() - interval '2 minutes'" } })
        yield* insertWebhook(a.did, "off", { enabled: false })
        yield* insertWebhook(b.did, "theirs")
        // counts of "ok": 2 pending (one leased), 1 delivered today, 1 delivered two days ago, 1 failed
        // today, 1 parked (a dead letter, not a failure)
        yield* insertDelivery(a.did, "ok", "d1", { status: "pending" })
        yield* insertDelivery(a.did, "ok", "d2", { status: "leased" })
        yield* insertDelivery(a.did, "ok", "d3", { status: "delivered", httpStatus: 200 })
        yield* insertDelivery(a.did, "ok", "d4", { status: "delivered", httpStatus: 200, finishedAgo: "2 days" })
        yield* insertDelivery(a.did, "ok", "d5", { status: "dead_letter", errorKind: "http_4xx", httpStatus: 400 })
        yield* insertDelivery(a.did, "ok", "d6", { status: "dead_letter", errorKind: "webhook_disabled" })
        yield* insertDelivery(b.did, "theirs", "d7", { status: "pending" })
        const rejected = yield* RejectedStore
        yield* rejected.record({
          ownerDid: a.did,
          rkey: "bad",
          rev: "3l2aaaaaaab22",
          cid: "bafyreibad",
          reason: "url",
          source: "stream"
        })

        const listed = yield* callAs(a, `${W}.list`)
        expect(listed.status).toBe(200)
        const hooks = byRkey(listed.body)
        expect([...hooks.keys()].sort()).toEqual(["bad", "down", "gone", "off", "ok"])

        const ok = hooks.get("ok") ?? {}
        expect(ok).toMatchObject({
          uri: `at://${a.did}/place.wisp.v2.wh/ok`,
          rkey: "ok",
          cid: "bafyreicid",
          scope: { aturi: `at://${a.did}`, backlinks: true },
          events: ["create", "update"],
          enabled: true,
          signing: "secretId",
          url: "https://receiver.example/hook",
          state: "active",
          circuit: "closed",
          counts: { pending: 2, deadLetters: 2, delivered24h: 1, failed24h: 1 }
        })
        expect(ok["lastSuccessAt"]).toMatch(ISO)
        expect(ok["stateReason"]).toBeUndefined()
        expect(ok["lastError"]).toBeUndefined()

        const down = hooks.get("down") ?? {}
        expect(down).toMatchObject({
          state: "autoDisabled",
          stateReason: "http_5xx",
          lastError: { kind: "http_5xx", httpStatus: 503 },
          circuit: "open",
          counts: { pending: 0, deadLetters: 0, delivered24h: 0, failed24h: 0 }
        })
        expect(down["stateSince"]).toMatch(ISO)
        expect(down["lastFailureAt"]).toMatch(ISO)
        expect(Date.parse(down["lastSuccessAt"] as string)).toBeLessThan(Date.now() - 6 * 86_400_000)

        expect(hooks.get("gone")).toMatchObject({ state: "gone", stateReason: "gone", circuit: "closed" })
        expect(hooks.get("gone")?.["stateSince"]).toMatch(ISO)
        expect(hooks.get("off")).toMatchObject({ state: "disabled", enabled: false })
        expect(hooks.get("bad")).toMatchObject({
          uri: `at://${a.did}/place.wisp.v2.wh/bad`,
          cid: "bafyreibad",
          state: "rejected",
          stateReason: "url",
          url: "",
          counts: { pending: 0, deadLetters: 0, delivered24h: 0, failed24h: 0 }
        })
        expect(hooks.get("bad")?.["stateSince"]).toMatch(ISO)

        // isolation: B sees its own webhook only, and none of A's counts
        const theirs = yield* callAs(b, `${W}.list`)
        expect([...byRkey(theirs.body).keys()]).toEqual(["theirs"])
        expect(byRkey(theirs.body).get("theirs")?.["counts"]).toEqual({
          pending: 1,
          deadLetters: 0,
          delivered24h: 0,
          failed24h: 0
        })
        expect(theirs.text).not.toContain(a.did)
        // an owner with nothing
        const nobody = yield* newOwner()
        expect((yield* callAs(nobody, `${W}.list`)).body).toEqual({ webhooks: [] })
      }))

    it.effect("list: a stored webhook refused for an admission limit is listed once, as rejected, with its record's fields", () =>
      Effect.gen(function*() {
        yield* wallClock
        const a = yield* newOwner()
        yield* insertWebhook(a.did, "first")
        yield* insertWebhook(a.did, "over")
        const rejected = yield* RejectedStore
        // as a reconciliation's swap records the row it refused (SwapRefusals), and a stream refusal
        // of another key that has no row
        yield* rejected.record({
          ownerDid: a.did,
          rkey: "over",
          rev: "3l2aaaaaaab22",
          cid: "bafyreicid",
          reason: "limit_owner",
          source: "reconciliation"
        })
        yield* rejected.record({
          ownerDid: a.did,
          rkey: "never",
          rev: "3l2aaaaaaab23",
          cid: "bafyreinever",
          reason: "limit_total",
          source: "stream"
        })
        const listed = yield* callAs(a, `${W}.list`)
        expect(listed.status).toBe(200)
        const rkeys = (listed.body["webhooks"] as ReadonlyArray<View>).map((w) => w["rkey"])
        expect([...rkeys].sort()).toEqual(["first", "never", "over"])
        const hooks = byRkey(listed.body)
        expect(hooks.get("first")).toMatchObject({ state: "active" })
        expect(hooks.get("over")).toMatchObject({
          state: "rejected",
          stateReason: "limit_owner",
          url: "https://receiver.example/hook",
          scope: { aturi: `at://${a.did}` }
        })
        expect(hooks.get("over")?.["stateSince"]).toMatch(ISO)
        expect(hooks.get("never")).toMatchObject({ state: "rejected", stateReason: "limit_total", url: "" })
      }))

    it.effect("list: the signing mode as the owner names it (inline), backlinksOnly, and the circuit at its default threshold and cooldown", () =>
      Effect.gen(function*() {
        yield* wallClock
        const a = yield* newOwner()
        yield* insertWebhook(a.did, "inline", {
          state: {
            signing_mode: "'record_secret'",
            record: "jsonb_set(record, '{scope,backlinksOnly}', 'true')"
          }
        })
        // DELIVERY_CIRCUIT_THRESHOLD 20 and DELIVERY_CIRCUIT_COOLDOWN_MS 60 s (the defaults)
        const failing = (attempts: number, ago: string) => ({
          failing_since: "now() - interval '1 hour'",
          failed_attempts: String(attempts),
          last_failure_at: `now() - interval '${ago}'`,
          last_failure_kind: "'timeout'"
        })
        yield* insertWebhook(a.did, "twenty", { state: failing(20, "10 seconds") })
        yield* insertWebhook(a.did, "nineteen", { state: failing(19, "10 seconds") })
        yield* insertWebhook(a.did, "cooled", { state: failing(40, "90 seconds") })
        // no failure streak (the last attempt succeeded): closed whatever the other columns say
        yield* insertWebhook(a.did, "recovered", {
          state: { failed_attempts: "40", last_failure_at: "now() - interval '10 seconds'" }
        })
        const hooks = byRkey((yield* callAs(a, `${W}.list`)).body)
        expect(hooks.get("inline")).toMatchObject({
          signing: "inline",
          scope: { aturi: `at://${a.did}`, backlinks: true, backlinksOnly: true }
        })
        expect(["twenty", "nineteen", "cooled", "recovered"].map((k) => [k, hooks.get(k)?.["circuit"]])).toEqual([
          ["twenty", "open"],
          ["nineteen", "closed"],
          ["cooled", "closed"],
          ["recovered", "closed"]
        ])
      }))

    it.effect("test: an auto-disabled webhook is refused (its row would be parked unsent) until it is resumed", () =>
      Effect.gen(function*() {
        yield* wallClock
        const sql = yield* SqlClient.SqlClient
        const a = yield* newOwner()
        yield* insertWebhook(a.did, "down", {
          state: { auto_disabled_at: "now()", failing_since: "now() - interval '5 days'", failed_attempts: "25" }
        })
        const refused = yield* callAs(a, `${W}.test`, { body: { rkey: "down" } })
        expect([refused.status, refused.body["error"]]).toEqual([400, "InvalidRequest"])
        expect(refused.body["message"]).toContain("resume it first")
        const queued = () =>
          sql<{ n: number }>`SELECT count(*)::int AS n FROM outbox WHERE owner_did = ${a.did}`.pipe(
            Effect.map((r) => r[0]?.n)
          )
        expect(yield* queued()).toBe(0)
        expect((yield* callAs(a, `${W}.resume`, { body: { rkey: "down" } })).status).toBe(200)
        const sent = yield* callAs(a, `${W}.test`, { body: { rkey: "down" } })
        expect([sent.status, typeof sent.body["id"]]).toEqual([200, "string"])
        expect(yield* queued()).toBe(1)
      }))

    it.effect("test: an enabled webhook that is not active (refused by an admission limit) is refused as disabled, nothing queued", () =>
      Effect.gen(function*() {
        yield* wallClock
        const sql = yield* SqlClient.SqlClient
        const a = yield* newOwner()
        yield* insertWebhook(a.did, "over", { enabled: true, active: false })
        const refused = yield* callAs(a, `${W}.test`, { body: { rkey: "over" } })
        expect([refused.status, refused.body["error"], refused.body["message"]]).toEqual([
          400,
          "InvalidRequest",
          "the webhook is disabled"
        ])
        const queued = yield* sql<{ n: number }>`SELECT count(*)::int AS n FROM outbox WHERE owner_did = ${a.did}`
        expect(queued[0]?.n).toBe(0)
      }))

    it.effect("resume: clears autoDisabled and gone, replays the parked rows with their ids; NotFound across owners", () =>
      Effect.gen(function*() {
        yield* wallClock
        const sql = yield* SqlClient.SqlClient
        const a = yield* newOwner()
        const b = yield* newOwner()
        const disabled = {
          auto_disabled_at: "now()",
          failing_since: "now() - interval '5 days'",
          failed_attempts: "25",
          parked: "2",
          last_failure_kind: "'timeout'"
        }
        yield* insertWebhook(a.did, "down", { state: disabled })
        yield* insertWebhook(a.did, "gone", { state: { gone_at: "now()" } })
        yield* insertDelivery(a.did, "down", "p1", { status: "dead_letter", errorKind: "webhook_disabled" })
        yield* insertDelivery(a.did, "down", "p2", { status: "dead_letter", errorKind: "webhook_disabled" })
        // a dead letter of another kind is not a parked row: resume leaves it
        yield* insertDelivery(a.did, "down", "x1", { status: "dead_letter", errorKind: "http_4xx", httpStatus: 400 })

        // B cannot resume A's webhook: the same NotFound as an unknown rkey; nothing changes
        const foreign = yield* callAs(b, `${W}.resume`, { body: { rkey: "down", replay: true } })
        expect([foreign.status, foreign.body["error"]]).toEqual([400, "NotFound"])
        const unknown = yield* callAs(a, `${W}.resume`, { body: { rkey: "nope" } })
        expect([unknown.status, unknown.body["error"]]).toEqual([400, "NotFound"])
        expect(foreign.body["message"]).toBe(unknown.body["message"])
        expect(byRkey((yield* callAs(a, `${W}.list`)).body).get("down")?.["state"]).toBe("autoDisabled")

        const resumed = yield* callAs(a, `${W}.resume`, { body: { rkey: "down", replay: true } })
        expect([resumed.status, resumed.body]).toEqual([200, { state: "active", replayed: 2 }])
        const rows = yield* sql<{ delivery_id: string; status: string; attempt_count: number }>`
          SELECT delivery_id, status, attempt_count FROM outbox WHERE owner_did = ${a.did} ORDER BY delivery_id`
        expect(rows.map((r) => [r.delivery_id, r.status, r.attempt_count])).toEqual([
          ["p1", "pending", 0],
          ["p2", "pending", 0],
          ["x1", "dead_letter", 1]
        ])
        const state = yield* sql<{ auto: Date | null; failed_attempts: number; parked: number }>`
          SELECT auto_disabled_at AS auto, failed_attempts, parked FROM webhooks
          WHERE owner_did = ${a.did} AND rkey = 'down'`
        expect(state[0]).toEqual({ auto: null, failed_attempts: 0, parked: 0 })

        // gone, without replay
        const gone = yield* callAs(a, `${W}.resume`, { body: { rkey: "gone" } })
        expect([gone.status, gone.body]).toEqual([200, { state: "active", replayed: 0 }])
        const after = byRkey((yield* callAs(a, `${W}.list`)).body)
        expect([after.get("down")?.["state"], after.get("gone")?.["state"]]).toEqual(["active", "active"])
      }))
  })
})

describe("webhook views (units)", () => {
  const at = new Date("2026-01-01T00:00:00.000Z")
  const streak = { failingSince: at, failedAttempts: 20, lastFailureAt: at }

  it("circuit: open from the threshold's failure on, while the last failure is younger than the cooldown", () => {
    const t = at.getTime()
    expect(circuitOf(streak, t + 59_999, 20, 60_000)).toBe("open")
    expect(circuitOf(streak, t + 60_000, 20, 60_000)).toBe("closed")
    expect(circuitOf({ ...streak, failedAttempts: 19 }, t, 20, 60_000)).toBe("closed")
    expect(circuitOf({ ...streak, failingSince: undefined }, t, 20, 60_000)).toBe("closed")
    expect(circuitOf({ ...streak, lastFailureAt: undefined }, t, 20, 60_000)).toBe("closed")
  })

  it("state: a record that says enabled: false is disabled, whatever else the webhook is", () => {
    const base = { enabled: false, active: true, goneAt: at, autoDisabledAt: at, lastFailureKind: "http_5xx" }
    expect(stateOf(base)).toEqual({ state: "disabled", reason: "record_disabled" })
    expect(stateOf({ ...base, enabled: true })).toEqual({ state: "gone", reason: "gone", since: at })
    expect(stateOf({ ...base, enabled: true, goneAt: undefined })).toEqual({
      state: "autoDisabled",
      reason: "http_5xx",
      since: at
    })
    expect(stateOf({ ...base, enabled: true, goneAt: undefined, lastFailureKind: undefined })).toMatchObject({
      reason: "failing"
    })
  })
})
