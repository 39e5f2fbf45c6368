/**
 * How the owners' API commands print their answers for people: tables and a delivery's detail.
 * Every value from the service goes through `cell` (no control characters reach the terminal);
 * response excerpts are shortened in tables (`--json` has them whole).
 */
import type { Schema } from "effect"
import type * as SecretLexicon from "../schemas/SecretLexicon.js"
import type * as WebhookLexicon from "../schemas/WebhookLexicon.js"
import { cell, REDACTED_URL, table, terminalJson } from "./Output.js"
import type { TailFrame } from "./OwnerTail.js"

export const REDACTED = REDACTED_URL
/** a response excerpt is shown up to this many characters in a table */
export const EXCERPT_IN_TABLE = 60

type ErrorInfo = typeof WebhookLexicon.ErrorInfo.Type
type GetDelivery = Schema.Schema.Type<typeof WebhookLexicon.getDelivery.output>

const errorText = (e: ErrorInfo | undefined): string | undefined =>
  e === undefined ? undefined : e.httpStatus === undefined ? e.kind : `${e.kind} ${e.httpStatus}`

const short = (s: string | undefined, max: number): string | undefined => {
  if (s === undefined) return undefined
  const one = cell(s).replace(/\s+/g, " ").trim()
  return one.length > max ? `${one.slice(0, max - 1)}…` : one
}

export const statusTable = (webhooks: ReadonlyArray<WebhookLexicon.WebhookView>, showUrls: boolean): string => {
  if (webhooks.length === 0) return "no webhooks known to this firehook service"
  const headers = ["RKEY", "STATE", "CIRCUIT", "PENDING", "DEAD", "OK/24H", "FAILED/24H", "LAST-SUCCESS", "LAST-ERROR"]
  return table(
    showUrls ? [...headers, "URL"] : headers,
    webhooks.map((w) => {
      const state = w.state === "active" || w.stateReason === undefined ? w.state : `${w.state} (${w.stateReason})`
      const r = [
        w.rkey,
        state,
        w.circuit,
        String(w.counts.pending),
        String(w.counts.deadLetters),
        String(w.counts.delivered24h),
        String(w.counts.failed24h),
        w.lastSuccessAt,
        errorText(w.lastError)
      ].map(cell)
      return showUrls ? [...r, cell(w.url)] : r
    })
  )
}

const eventText = (e: WebhookLexicon.DeliveryView["event"]): string => `${e.operation} ${e.collection}/${e.rkey}`

export const deliveriesTable = (deliveries: ReadonlyArray<WebhookLexicon.DeliveryView>): string =>
  table(
    ["ID", "CREATED", "WEBHOOK", "EVENT", "STATUS", "ATTEMPTS", "LAST-ERROR"],
    deliveries.map((d) =>
      [
        d.id,
        d.createdAt,
        d.rkey,
        eventText(d.event),
        d.status,
        String(d.attempts),
        errorText(d.lastError)
      ].map(cell)
    )
  )

export const deliveryDetail = (res: GetDelivery): string => {
  const d = res.delivery
  const fields: ReadonlyArray<readonly [string, string | undefined]> = [
    ["id", d.id],
    ["event id", d.eventId],
    ["webhook", d.rkey],
    ["match", d.match],
    ["event", `${eventText(d.event)}${d.event.cid === undefined ? "" : ` (${d.event.cid})`}`],
    ["record of", d.event.did],
    ["status", d.status],
    ["attempts", String(d.attempts)],
    ["created", d.createdAt],
    ["next attempt", d.nextAttemptAt],
    ["delivered", d.deliveredAt],
    ["last error", errorText(d.lastError)]
  ]
  const lines = fields.filter(([, v]) => v !== undefined).map(([k, v]) => `${`${k}:`.padEnd(14)}${cell(v)}`)
  const attempts = res.attempts.length === 0 ? ["no attempts yet"] : [
    table(
      ["N", "STARTED", "MS", "OUTCOME", "HTTP", "ERROR", "RESPONSE"],
      res.attempts.map((a) =>
        [
          String(a.n),
          a.startedAt,
          String(a.durationMs),
          a.outcome,
          a.httpStatus === undefined ? undefined : String(a.httpStatus),
          a.errorKind,
          short(a.responseExcerpt, EXCERPT_IN_TABLE)
        ].map(cell)
      )
    )
  ]
  const older = res.olderAttempts > 0 ? [`(${res.olderAttempts} older attempts not shown)`] : []
  const payload = res.payload === undefined
    ? ["payload: no longer retained"]
    : ["payload:", terminalJson(res.payload)]
  return [...lines, "", ...attempts, ...older, "", ...payload].join("\n")
}

export const secretsTable = (secrets: ReadonlyArray<SecretLexicon.SecretMeta>): string =>
  table(["NAME", "CREATED", "LAST-ROTATED"], secrets.map((s) => [s.name, s.createdAt, s.lastRotatedAt].map(cell)))

/** The stderr line of `hooks tail` for frames this client lost (dropped by a slow terminal, or invalid). */
export const tailLostLine = (what: "dropped" | "invalid", count: number): string =>
  what === "dropped"
    ? `firehook: ${count} outcome${count === 1 ? "" : "s"} dropped (this terminal was slower than the service)`
    : "firehook: an invalid frame was skipped"

/** One line per frame: time, status, webhook, event, delivery id, and the receiver's status. */
export const tailLine = (frame: TailFrame): string => {
  if (frame.$type.endsWith("#info")) {
    const info = frame as typeof WebhookLexicon.InfoFrame.Type
    return `(the service dropped ${info.dropped} outcome${info.dropped === 1 ? "" : "s"}: this reader was too slow)`
  }
  const o = frame as typeof WebhookLexicon.OutcomeFrame.Type
  const detail = o.httpStatus !== undefined
    ? `${o.httpStatus}${o.errorKind === undefined ? "" : ` ${o.errorKind}`}`
    : o.errorKind
  return [o.at, o.status.padEnd(11), o.rkey, o.event.padEnd(6), o.id, detail].filter((v) => v !== undefined).map(cell)
    .join("  ").trimEnd()
}
