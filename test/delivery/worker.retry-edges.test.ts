/**
 * The edges of the retry schedule (SPEC §4.3) through real answers of real receivers on 127.0.0.1:
 * `Retry-After` as an HTTP-date (future and past), out of range and malformed; a final status that
 * carries one; answers cut off after their status line or inside their head.
 */
import { describe, expect, it } from "@effect/vitest"
import { Effect } from "effect"
import { ev, plc, rev, sqlStack, whEv, whRecordValue } from "../support/stack.js"
import { eventually, loopbackServer, outboxRows, receiver, type Reply, run, startWorker } from "./worker-support.js"

const OWNER = plc(1)
const BOB = plc(2)
const POST = "app.bsky.feed.post"

/** webhook rkey → the answer of its receiver (an HTTP-date is computed when the request arrives) */
const ANSWERS: Record<string, (now: number) => Reply> = {
  // 90 s ahead (an HTTP-date has whole seconds: 89–90 s)
  dateAhead: (now) => ({ status: 503, headers: { "retry-after": new Date(now + 90_000).toUTCString() } }),
  // a day in the past: due at once
  datePast: (now) => ({ status: 503, headers: { "retry-after": new Date(now - 86_400_000).toUTCString() } }),
  // far beyond every bound: capped at 1 h (the cap, DELIVERY_RETRY_MAX_MS, is 2 h here)
  huge: () => ({ status: 429, headers: { "retry-after": "99999999999999999999999" } }),
  // not delay-seconds: ignored, the jittered backoff applies
  negative: () => ({ status: 503, headers: { "retry-after": "-5" } }),
  fraction: () => ({ status: 503, headers: { "retry-after": "1.5" } }),
  // a final answer: its Retry-After changes nothing
  gone: () => ({ status: 410, headers: { "retry-after": "5" } }),
  moved: () => ({ status: 301, headers: { location: "https://example.com/", "retry-after": "5" } })
}

/** A server that answers a status line (and maybe part of a head or body), then stalls. */
const stalling = loopbackServer((req, res) => {
  req.resume()
  if (req.url === "/head503") {
    res.writeHead(503, { "retry-after": "7", "content-length": "100" })
    res.write("x")
  } else if (req.url === "/head200") {
    res.writeHead(200, { "content-length": "100" })
    res.write("x")
  } else {
    // a status line and a header, never the end of the head
    req.socket.write("HTTP/1.1 200 OK\r\nX-A: b\r\n")
  }
})

describe("retry edges through real answers", () => {
  it.scopedLive(
    "Retry-After dates, bounds and malformed values; final statuses; answers cut off after the status line or in the head",
    () =>
      Effect.gen(function*() {
        const rx = yield* receiver({
          reply: (path) => ANSWERS[path.slice(1)]?.(Date.now()) ?? { status: 200 }
        })
        const cut = yield* stalling
        yield* run([
          ...Object.keys(ANSWERS).map((rkey) =>
            whEv(OWNER, rkey, whRecordValue(`at://${BOB}`, { url: `${rx.url}/${rkey}` }), { rev: rev(1) })
          ),
          ...["head503", "head200", "nohead"].map((rkey) =>
            whEv(OWNER, rkey, whRecordValue(`at://${BOB}`, { url: `${cut.url}/${rkey}` }), { rev: rev(1) })
          )
        ])
        yield* startWorker({ options: { pollIntervalMs: 50 } })
        yield* run([ev(BOB, POST, "p1", { rev: rev(10) })])
        const rows = yield* eventually(
          "every delivery settled or rescheduled",
          outboxRows,
          (rs) =>
            rs.length === 10 &&
            rs.every((r) => r.lease_token === null && r.attempt_count >= 1) &&
            rs.find((r) => r.webhook_rkey === "datePast")?.status === "dead_letter",
          30_000
        )
        const row = (rkey: string) => rows.find((r) => r.webhook_rkey === rkey)
        const state = (rkey: string) => {
          const r = row(rkey)
          return [r?.status, r?.last_error_kind, r?.last_http_status]
        }
        // an HTTP-date ahead: that long, exactly (no jitter)
        expect(state("dateAhead")).toEqual(["pending", "http_5xx", 503])
        expect(row("dateAhead")?.delay_s).toBeGreaterThan(88.9)
        expect(row("dateAhead")?.delay_s).toBeLessThan(90.1)
        // a date in the past is "now": every attempt at once, the budget (12) spent within seconds
        // (docs/decisions.md: Retry-After replaces the computed delay, also when shorter)
        expect(state("datePast")).toEqual(["dead_letter", "http_5xx", 503])
        expect(row("datePast")?.attempt_count).toBe(12)
        expect(rx.received.filter((q) => q.path === "/datePast")).toHaveLength(12)
        // capped at 1 h before the configured cap (2 h)
        expect(state("huge")).toEqual(["pending", "http_429", 429])
        expect(row("huge")?.delay_s).toBeGreaterThan(3599.9)
        expect(row("huge")?.delay_s).toBeLessThan(3600.1)
        // malformed: the backoff of attempt 1, equal jitter on the 600 s base: [300, 600] s
        for (const rkey of ["negative", "fraction"]) {
          expect(state(rkey)).toEqual(["pending", "http_5xx", 503])
          expect(row(rkey)?.delay_s).toBeGreaterThanOrEqual(299.9)
          expect(row(rkey)?.delay_s).toBeLessThanOrEqual(600.1)
        }
        // final: one request each
        expect(state("gone")).toEqual(["dead_letter", "gone", 410])
        expect(state("moved")).toEqual(["dead_letter", "redirect", 301])
        // the status line arrived, the body stalled past the timeout: the status classifies, with its Retry-After
        expect(state("head503")).toEqual(["pending", "http_5xx", 503])
        expect(row("head503")?.delay_s).toBeGreaterThan(6.9)
        expect(row("head503")?.delay_s).toBeLessThan(7.1)
        expect(state("head200")).toEqual(["delivered", null, 200])
        // the head never ended: a timeout (retried)
        expect(state("nohead")).toEqual(["pending", "timeout", null])
        expect(row("nohead")?.attempt_count).toBe(1)
      }).pipe(
        Effect.provide(
          sqlStack({
            env: {
              WEBHOOK_ALLOW_INSECURE_DEV: "1",
              DELIVERY_TIMEOUT_MS: "2000",
              DELIVERY_RETRY_BASE_MS: "600000",
              DELIVERY_RETRY_MAX_MS: "7200000"
            }
          })
        )
      ),
    60_000
  )
})
