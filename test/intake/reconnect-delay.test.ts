/**
 * The wait before the next session (SPEC §3.3): the reconnect backoff as it is for the relay's
 * failures, at least the poison backoff after a poison frame, and at most 30 s after a session
 * that failed on firehook's side (its batches could not be committed: a database outage), so that
 * intake resumes within 30 s of the database's return instead of after up to the 5 min cap.
 */
import { Duration } from "effect"
import { describe, expect, it } from "vitest"
import { reconnectDelay, STORE_BACKOFF_CAP } from "../../src/services/intake/StreamRunner.js"

const tuning = { poisonBackoff: Duration.seconds(10) }
const ms = (d: Duration.Duration) => Duration.toMillis(d)

describe("reconnectDelay", () => {
  it("a failed commit (handler) waits at most 30 s, however long the backoff has grown", () => {
    expect(ms(STORE_BACKOFF_CAP)).toBe(30_000)
    expect(ms(reconnectDelay("handler", Duration.minutes(4), tuning))).toBe(30_000)
    expect(ms(reconnectDelay("handler", Duration.seconds(3), tuning))).toBe(3_000)
  })

  it("the relay's failures keep the whole backoff; a poison frame waits at least the poison backoff", () => {
    expect(ms(reconnectDelay("connect", Duration.minutes(4), tuning))).toBe(240_000)
    expect(ms(reconnectDelay("closed", Duration.minutes(4), tuning))).toBe(240_000)
    expect(ms(reconnectDelay("protocol", Duration.seconds(1), tuning))).toBe(10_000)
    expect(ms(reconnectDelay("protocol", Duration.minutes(4), tuning))).toBe(240_000)
  })
})
