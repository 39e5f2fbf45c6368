/**
 * The owner's webhooks (SPEC §8.5): `dev.firehook.webhook.list` and `dev.firehook.webhook.resume`,
 * for the caller only.
 *
 * - `list` → every registration of the caller (operator/WebhookState: the record's fields, the
 *   delivery state of SPEC §4.3, bounded counts) and the caller's refused records
 *   (registry/RejectedStore, the newest 100: state `rejected`, the refusal as `stateReason`). A
 *   stored row refused for an admission limit (by a reconciliation's swap) is listed once: its
 *   record's fields with state `rejected` and the limit.
 *   `state`: `disabled` when the record says `enabled: false`, else `gone` (a 410) or
 *   `autoDisabled` (with the failure kind that disabled it as `stateReason`), else `disabled`
 *   (reason `inactive`) when it is not active, else `active`: gone and auto-disabled come first
 *   because `resume` is what the owner can do about them.
 * - `circuit` is derived from the stored failure streak, so that every replica (an API-only one
 *   too) answers the same: `open` while the webhook has failed at least `DELIVERY_CIRCUIT_THRESHOLD`
 *   attempts in a row and the last failure is younger than `DELIVERY_CIRCUIT_COOLDOWN_MS`, else
 *   `closed`. The workers' breakers are per process and per URL origin; this is the owner's view
 *   of the same signal (never `probing`: which replica holds the probe is not stored).
 * - `resume {rkey, replay?}` → `{state, replayed, truncated?}`: clears `gone` / `autoDisabled`
 *   (SPEC §4.3); `replay: true` also replays the rows parked meanwhile, at most
 *   {@link WebhookLexicon.REPLAY_MAX} per call (`truncated: true` when more are left). An rkey the
 *   caller has no webhook under is `NotFound`.
 */
import { Clock, Effect, Option } from "effect"
import * as WebhookLexicon from "../../schemas/WebhookLexicon.js"
import { WH_COLLECTION } from "../../schemas/WhRecord.js"
import { reportableStatus } from "../../schemas/XrpcContract.js"
import type { SigningMode } from "../matching/WebhookIndex.js"
import type { WebhookState } from "../operator/WebhookState.js"
import { WebhookStateStore } from "../operator/WebhookState.js"
import { FirehookConfig } from "../platform/Config.js"
import type { StoreError } from "../platform/Persistence.js"
import { REJECTED_LIMITS, type RejectedRecord, RejectedStore } from "../registry/RejectedStore.js"
import { recurringWarning } from "./ApiLog.js"
import { method } from "./Methods.js"
import { declared, internal, type XrpcFailure } from "./XrpcError.js"

type View = WebhookLexicon.WebhookView
type State = View["state"]

const SIGNING: { readonly [M in SigningMode]: View["signing"] } = {
  none: "none",
  record_secret: "inline",
  secret_id: "secretId"
}

const OPERATIONS: ReadonlySet<string> = new Set(WebhookLexicon.OPERATIONS)
const isOperation = (s: string): s is View["events"][number] => OPERATIONS.has(s)

const uriOf = (ownerDid: string, rkey: string) => `at://${ownerDid}/${WH_COLLECTION}/${rkey}`
const NO_COUNTS: View["counts"] = { pending: 0, deadLetters: 0, delivered24h: 0, failed24h: 0 }

/** The state an owner sees, with its reason and time. */
export const stateOf = (
  w: Pick<WebhookState, "enabled" | "active" | "goneAt" | "autoDisabledAt" | "lastFailureKind">
): { readonly state: State; readonly reason?: string; readonly since?: Date } => {
  if (!w.enabled) return { state: "disabled", reason: "record_disabled" }
  if (w.goneAt !== undefined) return { state: "gone", reason: "gone", since: w.goneAt }
  if (w.autoDisabledAt !== undefined) {
    return { state: "autoDisabled", reason: w.lastFailureKind ?? "failing", since: w.autoDisabledAt }
  }
  if (!w.active) return { state: "disabled", reason: "inactive" }
  return { state: "active" }
}

/** The circuit as derived from the failure streak (see the module documentation). */
export const circuitOf = (
  w: Pick<WebhookState, "failedAttempts" | "lastFailureAt" | "failingSince">,
  nowMs: number,
  threshold: number,
  cooldownMs: number
): View["circuit"] =>
  w.failingSince !== undefined && w.failedAttempts >= threshold && w.lastFailureAt !== undefined &&
    nowMs - w.lastFailureAt.getTime() < cooldownMs
    ? "open"
    : "closed"

/** The last failure; a stored status outside 100–599 (a receiver's 999: `http_5xx`) is left out. */
const errorOf = (kind: string, stored: number | undefined): NonNullable<View["lastError"]> => {
  const httpStatus = reportableStatus(stored)
  return httpStatus === undefined ? { kind } : { kind, httpStatus }
}

const viewOf = (w: WebhookState, circuit: View["circuit"]): View => {
  const s = stateOf(w)
  const scope = w.record.scope
  return {
    uri: uriOf(w.ownerDid, w.rkey),
    rkey: w.rkey,
    cid: w.cid ?? "",
    scope: {
      aturi: scope.aturi,
      ...(scope.backlinks === undefined ? {} : { backlinks: scope.backlinks }),
      ...(scope.backlinksOnly === undefined ? {} : { backlinksOnly: scope.backlinksOnly })
    },
    events: w.events.filter(isOperation),
    enabled: w.enabled,
    signing: SIGNING[w.signingMode],
    url: w.url,
    state: s.state,
    ...(s.reason === undefined ? {} : { stateReason: s.reason }),
    ...(s.since === undefined ? {} : { stateSince: s.since.toISOString() }),
    circuit,
    counts: w.counts,
    ...(w.lastSuccessAt === undefined ? {} : { lastSuccessAt: w.lastSuccessAt.toISOString() }),
    ...(w.lastFailureAt === undefined ? {} : { lastFailureAt: w.lastFailureAt.toISOString() }),
    ...(w.lastFailureKind === undefined ? {} : { lastError: errorOf(w.lastFailureKind, w.lastFailureHttp) })
  }
}

/** A refused record: what firehook knows of it (never its body, URL or secret). */
const rejectedView = (r: RejectedRecord): View => ({
  uri: uriOf(r.ownerDid, r.rkey),
  rkey: r.rkey,
  cid: r.cid ?? "",
  scope: { aturi: "" },
  events: [],
  enabled: false,
  signing: "none",
  url: "",
  state: "rejected",
  stateReason: r.reason.slice(0, 64),
  stateSince: r.lastSeenAt.toISOString(),
  circuit: "closed",
  counts: NO_COUNTS
})

const storeFailure = (e: StoreError): Effect.Effect<never, XrpcFailure> =>
  recurringWarning("api: the webhook state store failed", { op: e.op, code: e.code }).pipe(
    Effect.zipRight(Effect.fail(internal()))
  )

export const list = method(WebhookLexicon.list, ({ caller }) =>
  Effect.gen(function*() {
    const config = yield* FirehookConfig
    const states = yield* WebhookStateStore
    const rejected = yield* RejectedStore
    const rows = yield* states.list(caller)
    const refused = yield* rejected.list(caller, REJECTED_LIMITS.perOwner)
    const now = yield* Clock.currentTimeMillis
    const d = config.delivery
    // a stored row that a reconciliation's swap refused for an admission limit receives nothing: it
    // is listed once, as `rejected` with the limit, and with its record's fields
    const limited = new Map(refused.filter((r) => r.reason.startsWith("limit_")).map((r) => [r.rkey, r]))
    const views = rows.map((w): View => {
      const view = viewOf(w, circuitOf(w, now, d.circuitThreshold, d.circuitCooldownMs))
      const r = limited.get(w.rkey)
      if (r === undefined) return view
      return { ...view, state: "rejected", stateReason: r.reason.slice(0, 64), stateSince: r.lastSeenAt.toISOString() }
    })
    const stored = new Set(rows.map((w) => w.rkey))
    return {
      webhooks: [...views, ...refused.filter((r) => !(stored.has(r.rkey) && limited.has(r.rkey))).map(rejectedView)]
    }
  }).pipe(Effect.catchTag("StoreError", storeFailure)))

export const resume = method(WebhookLexicon.resume, ({ caller, input }) =>
  Effect.gen(function*() {
    const states = yield* WebhookStateStore
    const result = yield* states.resume(caller, input.rkey, {
      replay: input.replay === true,
      by: "owner",
      max: WebhookLexicon.REPLAY_MAX
    })
    if (Option.isNone(result)) return yield* Effect.fail(declared("NotFound", "no webhook with this rkey"))
    const r = result.value
    const state: State = !r.enabled || !r.active ? "disabled" : "active"
    return { state, replayed: r.replayed, ...(r.truncated || !r.complete ? { truncated: true } : {}) }
  }).pipe(
    Effect.catchTags({
      StoreError: storeFailure,
      InvalidArgument: () => Effect.fail(internal())
    })
  ))

/** The webhook methods, as the API serves them. */
export const WEBHOOK_METHODS = [list, resume] as const
