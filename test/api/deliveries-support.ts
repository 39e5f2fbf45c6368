/**
 * Shared pieces of the owners' delivery-log tests (deliveries-*.test.ts): the authors each test's
 * webhooks watch, the environment of the API under test, registering a webhook and posting through
 * the intake's processor, listing deliveries (one page or all, following the cursor), a cursor as a
 * client may send it, and outbox rows written as intake would.
 */
import * as SqlClient from "@effect/sql/SqlClient"
import { expect } from "@effect/vitest"
import { Effect } from "effect"
import { run } from "../delivery/worker-support.js"
import { ev, plc, rev, whEv, whRecordValue } from "../support/stack.js"
import { callAs, type Owner } from "./support.js"

export const W = "dev.firehook.webhook"
/** each test's webhooks watch an author of their own (no test enqueues for another's webhooks) */
export const BOB = plc(2)
export const CAROL = plc(3)
export const DAN = plc(4)
export const ERIN = plc(5)
export const POST = "app.bsky.feed.post"
export const ISO = /^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$/

export const env = {
  WEBHOOK_ALLOW_INSECURE_DEV: "1",
  // a failed attempt is retried an hour later at the earliest: the next attempt is the redeliver's
  DELIVERY_RETRY_BASE_MS: "3600000",
  DELIVERY_RETRY_MAX_MS: "3600000"
}

let n = 100
/** The next repository revision: one counter for every event a test file sends. */
export const nextRev = () => rev(n++)

/** Register `owner`'s webhook `rkey` watching `watched` through the intake's processor. */
export const register = (owner: Owner, rkey: string, watched: string, options: Parameters<typeof whRecordValue>[1]) =>
  run([whEv(owner.did, rkey, whRecordValue(`at://${watched}`, options), { rev: nextRev() })])

/** `author` posts `rkeys`: one delivery per post for every webhook watching them. */
export const post = (author: string, ...rkeys: ReadonlyArray<string>) =>
  run(rkeys.map((r) => ev(author, POST, r, { rev: nextRev() })))

export const list = (owner: Owner, query: string) =>
  Effect.map(callAs(owner, `${W}.listDeliveries`, { query }), (r) => {
    expect(r.status, r.text).toBe(200)
    return r.body as { deliveries: ReadonlyArray<{ readonly [k: string]: unknown }>; cursor?: string }
  })

/** Every page of a listing, following the cursor (bounded). */
export const listAll = (owner: Owner, query: string) =>
  Effect.gen(function*() {
    const ids: Array<string> = []
    let cursor: string | undefined = undefined
    for (let page = 0; page < 50; page++) {
      const c: string | undefined = cursor
      const r: { deliveries: ReadonlyArray<{ readonly [k: string]: unknown }>; cursor?: string } = yield* list(
        owner,
        c === undefined ? query : `${query}&cursor=${encodeURIComponent(c)}`
      )
      for (const d of r.deliveries) ids.push(String(d["id"]))
      if (r.cursor === undefined) return ids
      cursor = r.cursor
    }
    return ids
  })

/** A cursor as a client may send it: base64url of `[createdAt, deliveryId]`. */
export const cursorOf = (createdAt: string, deliveryId: string) =>
  Buffer.from(JSON.stringify([createdAt, deliveryId]), "utf8").toString("base64url")

/** Outbox rows of `owner` created at `times` (ids `whd_t_<tag>_<n>`, n from 1), as intake would write them. */
export const outboxRows = (owner: string, tag: string, times: ReadonlyArray<string>) =>
  Effect.flatMap(SqlClient.SqlClient, (sql) =>
    sql`
    INSERT INTO outbox (delivery_id, event_id, owner_did, webhook_rkey, match_kind, event_did, event_collection,
      event_rkey, event_operation, target_url, signing_mode, fingerprint, next_attempt_at, created_at)
    SELECT 'whd_t_' || ${tag} || '_' || n, 'whe_t_' || ${tag} || '_' || n, ${owner}, 'w1', 'direct', ${BOB},
      ${POST}, 'p', 'create', 'http://127.0.0.1:9/hook', 'none', 'fp', now() + interval '1 day',
      t::timestamptz
    FROM unnest(${times}::text[]) WITH ORDINALITY AS x(t, n)`)
