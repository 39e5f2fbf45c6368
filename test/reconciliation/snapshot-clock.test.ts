/**
 * The snapshot rev of a scan whose PDS does not answer `getLatestCommit` (SPEC §5.3 step 2) is a TID
 * of the scan's start; every live write not newer than it is fenced off. That start is the
 * database's clock (the begin's `now()`), the one every process shares, not the reconciling
 * process's: before, a reconcile process whose machine clock was 2 minutes ahead stored a rev 2
 * minutes in the future, and a webhook the owner created in those 2 minutes after the scan (a
 * genuinely newer live write) was ignored as stale until the owner's next scan.
 * A real PostgreSQL, a fake PLC and PDS (real HTTP servers on loopback).
 */
import { describe, expect, layer } from "@effect/vitest"
import { Effect } from "effect"
import { tidFromMicros, tidToMicros } from "../../src/schemas/Tid.js"
import { Processor } from "../../src/services/matching/Processor.js"
import { Reconciler } from "../../src/services/reconciliation/Reconciler.js"
import { ReconcileStore } from "../../src/services/reconciliation/ReconcileStore.js"
import { didDoc } from "../support/fakeAtproto.js"
import { Fakes, reconcileStack } from "../support/reconcile.js"
import { shiftedClock } from "../support/shiftedClock.js"
import { plc, rev, whEv, whRecordValue } from "../support/stack.js"

const BOB = plc(9_997)
const hook = () => whRecordValue(`at://${BOB}`, { url: "https://receiver.example/hook" })
const LATEST_COMMIT = "/xrpc/com.atproto.sync.getLatestCommit"

describe("the fallback snapshot rev is on the database's clock", () => {
  layer(reconcileStack(), { timeout: "120 seconds", excludeTestServices: true })(
    "a reconcile process 2 min ahead",
    (it) => {
      it.effect("a webhook created right after the scan is applied, not fenced as stale", () =>
        Effect.gen(function*() {
          const did = plc(501)
          const fakes = yield* Fakes
          fakes.docs.set(did, didDoc(did, fakes.pds.url))
          fakes.repos.set(did, { rev: rev(100), records: [{ rkey: "keep", value: hook() }] })
          // the PDS does not answer getLatestCommit: the scan's start is the snapshot rev
          fakes.pds.handler = (req) =>
            req.path === LATEST_COMMIT
              ? { status: 500, body: "{\"error\":\"InternalServerError\"}" }
              : fakes.defaultPds(req)
          const outcome = yield* Effect.flatMap(Reconciler, (r) => r.reconcile(did)).pipe(
            Effect.withClock(shiftedClock(120_000)),
            Effect.ensuring(Effect.sync(() => (fakes.pds.handler = fakes.defaultPds)))
          )
          expect(outcome._tag).toBe("complete")
          const snapshotRev = (yield* Effect.flatMap(ReconcileStore, (s) => s.ownerState(did)))?.snapshotRev
          const snapshotMicros = snapshotRev === undefined ? undefined : tidToMicros(snapshotRev)
          // not ahead of the database's clock (the wall clock here: one machine)
          expect(snapshotMicros).toBeLessThanOrEqual((Date.now() + 5_000) * 1000)

          // the owner creates a webhook now (its PDS's clock, right): newer than the snapshot, applied
          const created = tidFromMicros(Date.now() * 1000)
          const outcomes = yield* Effect.flatMap(
            Processor,
            (p) => p.processEvents([whEv(did, "w", hook(), { rev: created })], { registryWriter: true })
          )
          expect(outcomes.outcomes.map((o) => (o._tag === "no_match" ? o.registry?._tag : o._tag))).toEqual(["active"])
        }))
    }
  )
})
