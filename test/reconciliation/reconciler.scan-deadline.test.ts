/**
 * A scan ends before the stale-scan check could take it for a crashed one (Reconciler.ts,
 * `scanDeadlineMs`): the whole scan has a deadline of half `RETRY_SCHEDULER_STALE_SCAN_MS`. Before,
 * a PDS answering each page slowly but within the request timeout (8 s a page here, 10 s allowed,
 * 20 pages allowed) kept the owner `scanning` past the threshold (60 s accepted): the retry
 * scheduler's listing marked it `scan_crashed`, fenced it off (it ended `superseded`), and its retry
 * met the same PDS: the owner never completed. Now such a scan fails as `pds_timeout` within the
 * deadline (retried with backoff, its registrations kept), and one that ends within it completes.
 *
 * Under the TestClock (the deadline, the requests' own timeouts and the PDS's pace); the fake PDS
 * answers a page when the test releases it, the database's calls keep the live clock.
 */
import { describe, expect, layer } from "@effect/vitest"
import { Clock, Effect, TestClock, TestContext } from "effect"
import type { ReconcileOutcome } from "../../src/services/reconciliation/Reconciler.js"
import { listRecordsRequests } from "../support/fakeAtproto.js"
import { Fakes, liveClockStore, reconcileStack, waitFor } from "../support/reconcile.js"
import { plc, rev, whEv } from "../support/stack.js"
import { hook, live, memoryRkeys, ownerState, reconcile, setup } from "./reconciler-support.js"

const STALE_MS = 60_000 // the smallest RETRY_SCHEDULER_STALE_SCAN_MS the configuration accepts
const PAGE_MS = 8_000 // each page answered within the 10 s request timeout
const LIST = "/xrpc/com.atproto.repo.listRecords"

/**
 * Reconcile `did` while its PDS answers `pages` listRecords pages, each `PAGE_MS` of TestClock time
 * after it was asked. Returns the outcome, the TestClock time it took and the pages asked for.
 */
const slowScan = (did: string, pages: number) =>
  Effect.gen(function*() {
    const fakes = yield* Fakes
    const liveClock = Clock.make()
    const held: Array<() => void> = []
    fakes.pds.handler = async (req) => {
      if (req.path !== LIST || req.query.get("repo") !== did) return fakes.defaultPds(req)
      const cursor = req.query.get("cursor")
      const i = cursor === null ? 0 : Number(cursor.slice(1)) + 1
      await new Promise<void>((resolve) => held.push(resolve))
      return {
        status: 200,
        body: JSON.stringify({
          records: [{ uri: `at://${did}/place.wisp.v2.wh/k${i}`, cid: `bafyk${i}`, value: hook() }],
          ...(i === pages - 1 ? {} : { cursor: `c${i}` })
        })
      }
    }
    const started = yield* Clock.currentTimeMillis
    let outcome: ReconcileOutcome | undefined
    let endedAt = 0
    yield* Effect.fork(
      reconcile(did).pipe(
        Effect.tap((o) =>
          Effect.map(Clock.currentTimeMillis, (now) => {
            endedAt = now
            outcome = o
          })
        )
      )
    )
    // each page: once asked, PAGE_MS pass, then it is answered (at most `pages` + 1 rounds)
    for (let released = 0; released <= pages; released++) {
      yield* Effect.withClock(waitFor(() => outcome !== undefined || held.length > released, 20_000), liveClock)
      if (outcome !== undefined) break
      yield* TestClock.adjust(PAGE_MS)
      held[released]?.()
    }
    yield* Effect.withClock(waitFor(() => outcome !== undefined, 20_000), liveClock)
    for (const release of held) release()
    fakes.pds.handler = fakes.defaultPds
    return {
      outcome,
      tookMs: endedAt - started,
      asked: listRecordsRequests(fakes.pds).filter((r) => r.query.get("repo") === did).length
    }
  }).pipe(Effect.provide(TestContext.TestContext))

describe("Reconciler: a scan's deadline", () => {
  layer(
    reconcileStack({ env: { RETRY_SCHEDULER_STALE_SCAN_MS: String(STALE_MS) }, wrapStore: liveClockStore }),
    { timeout: "120 seconds", excludeTestServices: true }
  )("scan deadline", (it) => {
    it.effect("a slow (but answering) PDS: the scan fails as pds_timeout at half the stale threshold, not left scanning", () =>
      Effect.gen(function*() {
        const did = plc(901)
        yield* live([whEv(did, "known", hook(), { rev: rev(1) })])
        yield* setup(did, [], { rev: rev(100) })
        // 9 pages of 8 s: 72 s, past the 60 s threshold
        const { outcome, tookMs, asked } = yield* slowScan(did, 9)
        expect(outcome).toStrictEqual({ _tag: "failed", kind: "pds_timeout" })
        // ended (and marked) at the deadline, long before the stale-scan check could list it
        expect(tookMs).toBeGreaterThanOrEqual(30_000)
        expect(tookMs).toBeLessThan(STALE_MS / 2 + PAGE_MS)
        expect(asked).toBe(4)
        expect(yield* ownerState(did)).toMatchObject({ status: "failed", lastFailureKind: "pds_timeout" })
        expect(yield* memoryRkeys(did)).toEqual(["known"])
      }))

    it.effect("a scan that ends within the deadline completes", () =>
      Effect.gen(function*() {
        const did = plc(902)
        yield* setup(did, [], { rev: rev(100) })
        // 3 pages of 8 s: 24 s
        const { outcome, asked } = yield* slowScan(did, 3)
        expect(outcome).toMatchObject({ _tag: "complete", records: 3, pages: 3 })
        expect(asked).toBe(3)
        expect(yield* ownerState(did)).toMatchObject({ status: "complete" })
        expect(yield* memoryRkeys(did)).toEqual(["k0", "k1", "k2"])
      }))
  })
})
