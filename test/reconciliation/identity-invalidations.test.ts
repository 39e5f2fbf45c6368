/**
 * `#identity`/`#account` events reach every process's identity cache (SPEC §5.1, §6.4, issue 16):
 * the intake side's publisher batches the DIDs into `pg_notify('firehook_identity', …)` and every
 * process with an identity cache invalidates them, on a real PostgreSQL database.
 */
import { describe, expect, it } from "@effect/vitest"
import { Effect, Fiber, Queue } from "effect"
import * as TestServices from "effect/TestServices"
import * as IdentityInvalidations from "../../src/services/reconciliation/IdentityInvalidations.js"
import * as Db from "../support/db.js"
import { plc } from "../support/stack.js"

/** Until the follower's LISTEN is in place. */
const listening = Db.listening(IdentityInvalidations.CHANNEL)

describe("IdentityInvalidations", () => {
  it("payloads: space-separated, each under the byte bound; parsing keeps canonical DIDs only", () => {
    const dids = Array.from({ length: 10 }, (_, i) => plc(i + 1))
    const out = IdentityInvalidations.payloads(dids, 100)
    expect(out.every((p) => p.length <= 100)).toBe(true)
    expect(out.flatMap((p) => p.split(" "))).toEqual(dids)
    expect(IdentityInvalidations.parsePayload(`${plc(1)} not-a-did  did:web:example.com ${plc(2)}`)).toEqual([
      plc(1),
      "did:web:example.com",
      plc(2)
    ])
  })

  it("payloads: a DID that would pass the byte bound by one starts the next payload; the default bound keeps each under NOTIFY's 8,000 bytes", () => {
    // plc DIDs are 32 characters: three with their two spaces are 98 bytes
    const dids = Array.from({ length: 9 }, (_, i) => plc(i + 1))
    expect(IdentityInvalidations.payloads(dids, 98).map((p) => p.split(" ").length)).toEqual([3, 3, 3])
    expect(IdentityInvalidations.payloads(dids, 97).map((p) => p.split(" ").length)).toEqual([2, 2, 2, 2, 1])
    const many = Array.from({ length: 400 }, (_, i) => plc(i + 1))
    const out = IdentityInvalidations.payloads(many)
    expect(out.flatMap((p) => p.split(" "))).toEqual(many)
    expect(Math.max(...out.map((p) => p.length))).toBeLessThanOrEqual(7_000)
    expect(out[0]?.length).toBeGreaterThan(6_900)
  })

  it("parsePayload keeps at most BATCH_MAX (256) DIDs of a notification", () => {
    const dids = Array.from({ length: 300 }, (_, i) => plc(i + 1))
    expect(IdentityInvalidations.BATCH_MAX).toBe(256)
    expect(IdentityInvalidations.parsePayload(dids.join(" "))).toEqual(dids.slice(0, 256))
  })

  it.layer(Db.layer(), { timeout: 60_000 })("on PostgreSQL", (it) => {
    it.scoped("DIDs offered by intake are invalidated by another process's follower", () =>
      Effect.gen(function*() {
        const invalidated = yield* Queue.unbounded<string>()
        const follower = yield* Effect.fork(
          IdentityInvalidations.follow({ invalidate: (did) => Queue.offer(invalidated, did).pipe(Effect.asVoid) })
        )
        yield* listening
        const offer = yield* IdentityInvalidations.publisher
        // offered again every 500 ms until seen: the follower's LISTEN may not be in place yet when the
        // first offer is sent (best effort by design)
        const offering = yield* Effect.fork(
          Effect.forEach([plc(1), plc(2), plc(1), plc(3)], offer, { discard: true }).pipe(
            Effect.zipRight(TestServices.provideLive(Effect.sleep("500 millis"))),
            Effect.repeat({ times: 100 })
          )
        )
        const got = new Set<string>()
        while (got.size < 3) got.add(yield* Queue.take(invalidated))
        yield* Fiber.interrupt(offering)
        expect([...got].sort()).toEqual([plc(1), plc(2), plc(3)].sort())
        yield* Fiber.interrupt(follower)
      }))
  })
})
