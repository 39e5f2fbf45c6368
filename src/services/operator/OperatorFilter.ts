/**
 * The filter of `listDeliveries` and `replayDeadLetters` (Operator.ts): its checks, and its WHERE
 * conditions, with the time bounds to the microsecond.
 */
import type * as SqlClient from "@effect/sql/SqlClient"
import type { Fragment } from "@effect/sql/Statement"
import { Effect } from "effect"
import { isCanonicalDid, isRkey } from "../../schemas/AtUri.js"
import type { DeliveryStatus } from "../matching/OutboxStatus.js"
import { dateMicros, microsKeyText, timeMicros } from "./ListKey.js"
import { InvalidArgument, type ReplayFilter } from "./Operator.js"

/** The time bounds of a checked filter, as key text (`ListKey.microsKeyText`) for `::timestamptz`. */
export interface TimeRange {
  readonly since: string | undefined
  readonly until: string | undefined
}

const boundMicros = (t: Date | string): bigint | undefined => typeof t === "string" ? timeMicros(t) : dateMicros(t)

/**
 * The filter checked, with its time bounds to the microsecond: `since < until` is compared on the
 * times as given (a time in year 0000 is only then written as 0001-01-01), so a range inside one millisecond is
 * accepted and an empty one refused.
 */
export const checkFilter = (f: ReplayFilter): Effect.Effect<TimeRange, InvalidArgument> => {
  if (f.owner !== undefined && !isCanonicalDid(f.owner)) {
    return Effect.fail(new InvalidArgument({ field: "owner", rule: "must be a canonical DID (did:plc or did:web)" }))
  }
  if (f.webhook !== undefined && !isRkey(f.webhook)) {
    return Effect.fail(new InvalidArgument({ field: "webhook", rule: "must be a record key" }))
  }
  const since = f.since === undefined ? undefined : boundMicros(f.since)
  const until = f.until === undefined ? undefined : boundMicros(f.until)
  if (f.since !== undefined && since === undefined) {
    return Effect.fail(new InvalidArgument({ field: "since", rule: "must be a valid time" }))
  }
  if (f.until !== undefined && until === undefined) {
    return Effect.fail(new InvalidArgument({ field: "until", rule: "must be a valid time" }))
  }
  if (since !== undefined && until !== undefined && since >= until) {
    return Effect.fail(new InvalidArgument({ field: "since", rule: "must be earlier than until" }))
  }
  return Effect.succeed({
    since: since === undefined ? undefined : microsKeyText(since),
    until: until === undefined ? undefined : microsKeyText(until)
  })
}

/** The WHERE conditions of a filter, with its checked time bounds (bound as text: every microsecond kept). */
export const filterConditions = (
  sql: SqlClient.SqlClient,
  f: ReplayFilter & { readonly status?: DeliveryStatus },
  range: TimeRange
): ReadonlyArray<Fragment> => {
  const out: Array<Fragment> = []
  if (f.owner !== undefined) out.push(sql`owner_did = ${f.owner}`)
  if (f.webhook !== undefined) out.push(sql`webhook_rkey = ${f.webhook}`)
  if (f.status !== undefined) out.push(sql`status = ${f.status}`)
  if (f.errorKind !== undefined) out.push(sql`last_error_kind = ${f.errorKind}`)
  if (range.since !== undefined) out.push(sql`created_at >= ${range.since}::timestamptz`)
  if (range.until !== undefined) out.push(sql`created_at < ${range.until}::timestamptz`)
  return out
}
