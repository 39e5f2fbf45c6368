/**
 * A PLC directory that asks for time (429 with Retry-After) is asked once, not once per owner: the
 * reconciler's scan of the owner whose lookup met it fails as `identity_unavailable` carrying the
 * wait (for the retry scheduler), and the scans of the other owners on that directory ask it nothing
 * and fail at once as `identity_cooling`, with the time left; their registrations are kept and their
 * PDS is not asked. Against a fake PLC and PDS (real HTTP on loopback) and a real PostgreSQL.
 */
import { describe, expect, layer } from "@effect/vitest"
import { Effect } from "effect"
import { listRecordsRequests } from "../support/fakeAtproto.js"
import { seriesValue } from "../support/metricSeries.js"
import { Fakes, reconcileStack } from "../support/reconcile.js"
import { plc, rev, whEv } from "../support/stack.js"
import { hook, live, memoryRkeys, ownerState, reconcile, setup } from "./reconciler-support.js"

describe("Reconciler: a PLC directory's Retry-After", () => {
  layer(reconcileStack(), { timeout: "120 seconds", excludeTestServices: true })("plc 429", (it) => {
    it.effect("a sweep over owners of a rate-limited directory asks it once, and every owner carries its wait", () =>
      Effect.gen(function*() {
        const fakes = yield* Fakes
        const owners = [plc(801), plc(802), plc(803), plc(804), plc(805)]
        for (const did of owners) yield* setup(did, [], { rev: rev(100) })
        yield* live([whEv(plc(802), "known", hook(), { rev: rev(1) })])
        const plcDefault = fakes.plc.handler
        fakes.plc.handler = () => ({
          status: 429,
          body: JSON.stringify({ message: "Too Many Requests" }),
          headers: { "retry-after": "300" }
        })
        const asked = fakes.plc.requests.length
        const pdsAsked = listRecordsRequests(fakes.pds).length
        const cooling = yield* seriesValue("firehook_reconcile_failures_total", { kind: "identity_cooling" })
        const outcomes = []
        for (const did of owners) outcomes.push(yield* reconcile(did))
        fakes.plc.handler = plcDefault
        // the directory said "not for 300 s": asked once, not once per owner
        expect(fakes.plc.requests.length - asked).toBe(1)
        expect(listRecordsRequests(fakes.pds).length).toBe(pdsAsked)
        // its wait reaches the retry scheduler, whole for the owner that met it …
        expect(outcomes[0]).toStrictEqual({ _tag: "failed", kind: "identity_unavailable", retryAfterMs: 300_000 })
        // … and what is left of it for the others
        for (const outcome of outcomes.slice(1)) {
          expect(outcome).toMatchObject({ _tag: "failed", kind: "identity_cooling" })
          const left = outcome._tag === "failed" ? outcome.retryAfterMs ?? 0 : 0
          expect(left).toBeGreaterThan(240_000)
          expect(left).toBeLessThanOrEqual(300_000)
        }
        expect(yield* ownerState(plc(802))).toMatchObject({ status: "failed", lastFailureKind: "identity_cooling" })
        expect(yield* memoryRkeys(plc(802))).toEqual(["known"])
        expect(yield* seriesValue("firehook_reconcile_failures_total", { kind: "identity_cooling" })).toBe(cooling + 4)
      }))
  })
})
