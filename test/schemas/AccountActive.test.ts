/**
 * `#account` events carry the account's `active` flag from both sources (Jetstream JSON and relay
 * DAG-CBOR frames): a boolean is taken as is; anything else (absent, another type, a body that is
 * not an object) leaves it undefined and never makes the frame poison. `#identity` events carry
 * none.
 */
import { Either } from "effect"
import { describe, expect, it } from "vitest"
import { decodeJetstreamFrame } from "../../src/schemas/Jetstream.js"
import type { StreamEvent } from "../../src/schemas/RecordEvent.js"
import { decodeRelayFrame } from "../../src/schemas/RelayFrame.js"
import { DID, frame, TIME } from "../intake/frames.js"

const T = 1725911162329308

const jetstream = (body: Record<string, unknown>): StreamEvent | undefined => {
  const r = decodeJetstreamFrame(JSON.stringify({ did: DID, time_us: T, kind: "account", ...body }), {
    stream: "registry",
    relay: "wss://jetstream.test/subscribe",
    maxBytes: 4096
  })
  if (Either.isLeft(r)) throw new Error(`rejected: ${r.left.reason}`)
  return r.right.event
}

const relay = (t: string, body: Record<string, unknown>): StreamEvent | undefined => {
  const r = decodeRelayFrame(frame({ op: 1, t }, { seq: 7, did: DID, time: TIME, ...body }), {
    stream: "relay",
    relay: "wss://relay.test",
    maxBytes: 1 << 20
  })
  if (Either.isLeft(r)) throw new Error(`rejected: ${r.left.reason}`)
  if (r.right.kind !== "events") throw new Error(`not events: ${r.right.kind}`)
  expect(r.right.events.length).toBe(1)
  return r.right.events[0]
}

const activeOf = (e: StreamEvent | undefined) => (e !== undefined && e.kind !== "commit" ? e.active : "none")

describe("#account active", () => {
  it("Jetstream: account.active true or false", () => {
    const on = jetstream({ account: { active: true, did: DID, seq: 1, time: "2024-09-05T06:11:04.870Z" } })
    expect(on).toMatchObject({ kind: "account", did: DID, active: true })
    const off = jetstream({ account: { active: false, status: "deactivated", did: DID, seq: 2 } })
    expect(off).toMatchObject({ kind: "account", did: DID, active: false })
  })

  it("Jetstream: a missing or malformed account body is an account event without active (not poison)", () => {
    for (
      const body of [
        {},
        { account: null },
        { account: "active" },
        { account: [true] },
        { account: {} },
        { account: { active: "true" } },
        { account: { active: 1 } },
        { account: { active: null } }
      ]
    ) {
      const e = jetstream(body)
      expect(e?.kind).toBe("account")
      expect(activeOf(e)).toBeUndefined()
    }
  })

  it("Jetstream: an identity event carries no active flag", () => {
    const r = decodeJetstreamFrame(
      JSON.stringify({ did: DID, time_us: T, kind: "identity", identity: { did: DID, active: true } }),
      { stream: "registry", relay: "wss://jetstream.test/subscribe", maxBytes: 4096 }
    )
    if (Either.isLeft(r)) throw new Error(`rejected: ${r.left.reason}`)
    expect(r.right.event).not.toHaveProperty("active")
  })

  it("relay: #account active true or false", () => {
    expect(relay("#account", { active: true })).toMatchObject({ kind: "account", did: DID, active: true })
    expect(relay("#account", { active: false, status: "takendown" })).toMatchObject({ active: false })
  })

  it("relay: a missing or malformed active is an account event without it (not poison)", () => {
    for (const body of [{}, { active: "true" }, { active: 1 }, { active: null }, { active: { v: true } }]) {
      const e = relay("#account", body)
      expect(e?.kind).toBe("account")
      expect(activeOf(e)).toBeUndefined()
    }
  })

  it("relay: an #identity event carries no active flag", () => {
    expect(relay("#identity", { handle: "alice.test", active: true })).not.toHaveProperty("active")
  })
})
