/**
 * Webhook and outbox rows written straight to the database, for tests of what reads them (the
 * owners' `list` / `resume`, the operator's `webhooks resume`): no registry, no matching.
 */
import * as SqlClient from "@effect/sql/SqlClient"
import { Effect } from "effect"

export interface WebhookRowOptions {
  readonly url?: string
  readonly enabled?: boolean
  readonly active?: boolean
  readonly fingerprint?: string
  /** SQL expressions for the state columns of migration 0006 and `gone_at` */
  readonly state?: Readonly<Record<string, string>>
}

/** One `webhooks` row of `ownerDid` under `rkey`. */
export const insertWebhook = (ownerDid: string, rkey: string, o: WebhookRowOptions = {}) =>
  Effect.gen(function*() {
    const sql = yield* SqlClient.SqlClient
    const url = o.url ?? "https://receiver.example/hook"
    const record = {
      $type: "place.wisp.v2.wh",
      scope: { aturi: `at://${ownerDid}`, backlinks: true },
      url,
      events: ["create", "update"],
      secretId: "main",
      enabled: o.enabled ?? true,
      createdAt: "2026-01-01T00:00:00.000Z"
    }
    yield* sql`
      INSERT INTO webhooks (owner_did, rkey, rev, generation, cid, record, scope_uri, scope_did, backlinks, url, events,
        enabled, active, signing_mode, secret_id, fingerprint)
      VALUES (${ownerDid}, ${rkey}, '3l2aaaaaaaa22', 1, 'bafyreicid', ${JSON.stringify(record)}::jsonb,
        ${`at://${ownerDid}`}, ${ownerDid}, true, ${url}, ARRAY['create', 'update'], ${o.enabled ?? true},
        ${o.active ?? o.enabled ?? true}, 'secret_id', 'main', ${o.fingerprint ?? `fp-${rkey}`})`
    const state = Object.entries(o.state ?? {})
    if (state.length > 0) {
      yield* sql.unsafe(
        `UPDATE webhooks SET ${state.map(([k, v]) => `${k} = ${v}`).join(", ")} WHERE owner_did = $1 AND rkey = $2`,
        [ownerDid, rkey]
      )
    }
  }).pipe(Effect.orDie)

export interface OutboxRowOptions {
  readonly status: "pending" | "leased" | "delivered" | "dead_letter" | "cancelled"
  readonly errorKind?: string
  readonly httpStatus?: number
  /** finished this long ago (terminal rows) */
  readonly finishedAgo?: string
  readonly fingerprint?: string
}

/** One `outbox` row of the webhook `ownerDid`/`rkey` (with its event body). */
export const insertDelivery = (ownerDid: string, rkey: string, id: string, o: OutboxRowOptions) =>
  Effect.gen(function*() {
    const sql = yield* SqlClient.SqlClient
    const terminal = o.status === "delivered" || o.status === "dead_letter" || o.status === "cancelled"
    yield* sql`INSERT INTO delivery_events (event_id, body, body_sha256) VALUES (${`ev-${id}`}, '{}', 'x')
      ON CONFLICT DO NOTHING`
    yield* sql`
      INSERT INTO outbox (delivery_id, event_id, owner_did, webhook_rkey, match_kind, event_did, event_collection,
        event_rkey, event_operation, target_url, signing_mode, secret_id, fingerprint, status, attempt_count,
        last_error_kind, last_http_status, finished_at)
      VALUES (${id}, ${`ev-${id}`}, ${ownerDid}, ${rkey}, 'direct', ${ownerDid}, 'app.bsky.feed.post', 'p1', 'create',
        'https://receiver.example/hook', 'secret_id', 'main', ${o.fingerprint ?? `fp-${rkey}`}, ${o.status},
        ${terminal && o.errorKind !== "webhook_disabled" ? 1 : 0}, ${o.errorKind ?? null}, ${o.httpStatus ?? null},
        ${terminal ? sql`now() - ${o.finishedAgo ?? "1 minute"}::interval` : null})`
  }).pipe(Effect.orDie)
