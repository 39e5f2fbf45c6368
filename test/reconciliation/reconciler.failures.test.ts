/**
 * Reconciliation of one owner (SPEC §5.3) against a fake PLC and a fake PDS (real HTTP servers on
 * loopback, insecure development mode) and a real PostgreSQL, when it fails: every listed failure
 * fails the owner and keeps its registrations; timeouts, completion in batches, and a scan that
 * dies.
 */
import { describe, expect, layer } from "@effect/vitest"
import { Effect } from "effect"
import { RegistryStore } from "../../src/services/registry/RegistryStore.js"
import { captureLogs } from "../support/captureLogs.js"
import { type FakeResponse, fakeServer, listRecordsRequests } from "../support/fakeAtproto.js"
import { seriesValue } from "../support/metricSeries.js"
import { COMPLETE, Fakes, holdPdsPath, reconcileStack, wrapStore } from "../support/reconcile.js"
import { plc, rev, whEv } from "../support/stack.js"
import {
  hook,
  json,
  live,
  memoryRkeys,
  ownerState,
  page,
  reconcile,
  reconcileServing,
  setup,
  storedRkeys
} from "./reconciler-support.js"

describe("Reconciler", () => {
  layer(reconcileStack(), { timeout: "120 seconds", excludeTestServices: true })(
    "every listed failure fails the owner and keeps its registrations",
    (it) => {
      /** Serve `respond(request index)` for `did`'s listRecords; the default PDS otherwise. */
      const failing = (n: number, kind: string, respond: (i: number, did: string) => FakeResponse) =>
        it.effect(`${kind}`, () =>
          Effect.gen(function*() {
            const did = plc(100 + n)
            yield* live([whEv(did, "known", hook(), { rev: rev(1) })])
            yield* setup(did, [], { rev: rev(100) })
            let i = 0
            const outcome = yield* reconcileServing(did, () => respond(i++, did))
            expect(outcome).toEqual({ _tag: "failed", kind })
            const state = yield* ownerState(did)
            expect(state).toMatchObject({ status: "failed", lastFailureKind: kind, failureCount: 1 })
            // the last known-good registrations are kept (pages already read landed in the database
            // only; nothing was deleted) and memory is unchanged
            expect(yield* storedRkeys(did)).toContain("known")
            expect(yield* memoryRkeys(did)).toEqual(["known"])
          }))

      failing(1, "record_uri", () =>
        json(200, {
          records: [{ uri: `at://${plc(7_777)}/place.wisp.v2.wh/x`, cid: "bafyx", value: hook() }],
          cursor: "x"
        }))
      failing(2, "duplicate_rkey", (i, did) => (i === 0 ? page(did, ["a", "b"], "b") : page(did, ["a"], "a")))
      failing(3, "cursor", (i, did) => (i === 0 ? page(did, ["a"], "c1") : page(did, ["b"], "c1")))
      failing(4, "too_many_pages", (i, did) => page(did, [`k${String(1000 - i).padStart(4, "0")}`], `c${i}`))
      failing(5, "too_many_records", (i, did) =>
        page(
          did,
          Array.from({ length: 100 }, (_, j) => `r${String(i * 100 + j).padStart(5, "0")}`),
          `c${i}`
        ))
      failing(
        6,
        "page_too_large",
        (_, did) => page(did, ["big"], undefined, { ...hook(), padding: "x".repeat(600 * 1024) })
      )
      failing(7, "pds_status", () => json(500, { error: "InternalServerError" }))
      failing(8, "page_invalid", () => ({ status: 200, body: "{not json" }))
      failing(9, "page_records", (_, did) =>
        page(
          did,
          Array.from({ length: 101 }, (_, j) => `r${j}`),
          "c"
        ))
      failing(
        10,
        "record_cid",
        (_, did) =>
          json(200, { records: [{ uri: `at://${did}/place.wisp.v2.wh/a`, cid: "", value: hook() }], cursor: "a" })
      )
      failing(11, "cursor", (_, did) => page(did, ["a"], "x".repeat(2049)))
      failing(12, "pds_status", (i, did) => (i === 0 ? page(did, ["a"], "a") : json(400, { error: "RepoNotFound" })))
      // empty pages with a cursor are followed, and count toward the page bound; their cursors too
      // must never repeat
      failing(13, "too_many_pages", (i) => json(200, { records: [], cursor: `e${i}` }))
      failing(14, "cursor", (i) => json(200, { records: [], cursor: i < 3 ? `e${i}` : "e0" }))
      // a cursor that is not well-formed UTF-16 (a lone surrogate, `\ud800` in the JSON) cannot be
      // put in a URL: the owner fails as `cursor` (it used to die on encodeURIComponent's URIError,
      // leaving the owner `scanning`)
      failing(15, "cursor", (_, did) => page(did, ["a"], "a\ud800"))
      failing(16, "cursor", () => json(200, { records: [], cursor: "\udc00z" }))
      // a cid of 257 characters (SPEC §5.3: 1–256)
      failing(
        17,
        "record_cid",
        (_, did) =>
          json(200, {
            records: [{ uri: `at://${did}/place.wisp.v2.wh/a`, cid: "b".repeat(257), value: hook() }],
            cursor: "a"
          })
      )

      // a cid is 1–256 printable characters: one holding a space is not a cid
      failing(
        18,
        "record_cid",
        (_, did) => json(200, { records: [{ uri: `at://${did}/place.wisp.v2.wh/a`, cid: "bafy a", value: hook() }] })
      )
      // a cursor, if present, is non-empty (SPEC §5.3): "" is not followed as if it were one
      failing(19, "cursor", (i, did) => (i === 0 ? page(did, ["b"], "") : page(did, ["a"])))
      // "repo not found" only in its two authoritative forms (SPEC §5.3): not for another DID,
      // and `InvalidRequest` only as a 400
      failing(
        20,
        "pds_status",
        () => json(400, { error: "InvalidRequest", message: `Could not find repo: ${plc(7_777)}` })
      )
      failing(
        21,
        "pds_status",
        (_, did) => json(404, { error: "InvalidRequest", message: `Could not find repo: ${did}` })
      )

      it.effect("exactly 20 pages are read before too_many_pages", () =>
        Effect.gen(function*() {
          const fakes = yield* Fakes
          const lists = listRecordsRequests(fakes.pds).filter((r) => r.query.get("repo") === plc(104))
          expect(lists).toHaveLength(20)
        }))
    }
  )
})

describe("Reconciler: completion in batches and timeouts", () => {
  layer(
    reconcileStack({ limits: { batchSize: 2, tombstoneRetentionMs: 0 } }),
    { timeout: "120 seconds", excludeTestServices: true }
  )("completion in batches", (it) => {
    it.effect("rows beyond one batch are all deleted (tombstoned), and old tombstones beyond one batch all pruned", () =>
      Effect.gen(function*() {
        const did = plc(400)
        const rkeys = ["a", "b", "c", "d", "e"]
        yield* live(rkeys.map((k) => whEv(did, k, hook(), { rev: rev(1) })))
        yield* setup(did, [], { rev: rev(100) })
        expect(yield* reconcile(did)).toMatchObject({ _tag: "complete", deleted: 5 })
        expect(yield* storedRkeys(did)).toEqual([])
        const store = yield* RegistryStore
        for (const k of rkeys) expect((yield* store.get(did, k)).tombstone?.rev).toBe(rev(100))
        // a newer snapshot: the tombstones are older than it and past their retention (0 here)
        yield* setup(did, [], { rev: rev(200) })
        expect(yield* reconcile(did)).toMatchObject({ _tag: "complete", deleted: 0 })
        for (const k of rkeys) expect((yield* store.get(did, k)).tombstone).toBeUndefined()
      }))
  })

  layer(reconcileStack({ limits: { timeoutMs: 300 } }), { timeout: "120 seconds", excludeTestServices: true })(
    "timeouts",
    (it) => {
      it.effect("a PDS that does not answer a page within the timeout fails the owner as pds_timeout", () =>
        Effect.gen(function*() {
          const did = plc(401)
          yield* live([whEv(did, "known", hook(), { rev: rev(1) })])
          yield* setup(did, [], { rev: rev(100) })
          const release = yield* holdPdsPath("/xrpc/com.atproto.repo.listRecords", did)
          const logs = yield* captureLogs
          const outcome = yield* reconcile(did).pipe(Effect.ensuring(Effect.sync(release)), Effect.provide(logs.layer))
          expect(outcome).toEqual({ _tag: "failed", kind: "pds_timeout" })
          expect(yield* ownerState(did)).toMatchObject({ status: "failed", lastFailureKind: "pds_timeout" })
          expect(yield* memoryRkeys(did)).toEqual(["known"])
          // a warning an operator at `info` sees, with the kind and without the DID
          const warned = (yield* logs.lines).filter((l) => l.includes("owner reconciliation failed"))
          expect(warned.map((l) => JSON.parse(l))).toEqual([{
            message: ["owner reconciliation failed"],
            annotations: { kind: "pds_timeout", suppressed: 0 }
          }])
          // another owner failing the same way within the minute is not logged again at warn
          const other = plc(402)
          yield* setup(other, [], { rev: rev(100) })
          const release2 = yield* holdPdsPath("/xrpc/com.atproto.repo.listRecords", other)
          expect(yield* reconcile(other).pipe(Effect.ensuring(Effect.sync(release2)), Effect.provide(logs.layer)))
            .toEqual({ _tag: "failed", kind: "pds_timeout" })
          expect((yield* logs.lines).filter((l) => l.includes("owner reconciliation failed"))).toHaveLength(1)
        }))

      it.effect("a PDS whose getLatestCommit timed out is not asked for it by the next scans: they take the scan-start TID", () =>
        Effect.scoped(Effect.gen(function*() {
          const fakes = yield* Fakes
          const LATEST = "/xrpc/com.atproto.sync.getLatestCommit"
          const never = new Promise<never>(() => undefined)
          /** A PDS of its own whose getLatestCommit never answers (or answers 500). */
          const pdsWith = (latest: "stall" | "500") =>
            fakeServer((req) =>
              req.path !== LATEST ? fakes.defaultPds(req) : latest === "stall" ? never : json(500, {})
            )
          const stalling = yield* pdsWith("stall")
          const erring = yield* pdsWith("500")
          const [first, second, third, fourth] = [plc(411), plc(412), plc(413), plc(414)]
          yield* setup(first, [], { rev: rev(100), pds: stalling.url })
          yield* setup(second, [], { rev: rev(100), pds: stalling.url })
          yield* setup(third, [], { rev: rev(100), pds: erring.url })
          yield* setup(fourth, [], { rev: rev(100), pds: erring.url })
          const asked = (pds: typeof stalling) =>
            pds.requests.filter((r) => r.path === LATEST).map((r) => r.query.get("did"))
          expect(yield* reconcile(first)).toEqual(COMPLETE)
          expect(yield* reconcile(second)).toEqual(COMPLETE)
          // the second scan did not wait for another timeout; both took a TID of their start
          expect(asked(stalling)).toEqual([first])
          for (const did of [first, second]) {
            const snapshotRev = (yield* ownerState(did))?.snapshotRev ?? ""
            expect(snapshotRev).not.toBe(rev(100))
            expect(snapshotRev > rev(100)).toBe(true)
          }
          // an answer that is not a timeout holds nothing: the next owner's scan asks again
          expect(yield* reconcile(third)).toEqual(COMPLETE)
          expect(yield* reconcile(fourth)).toEqual(COMPLETE)
          expect(asked(erring)).toEqual([third, fourth])
          // another PDS is asked as usual, and its rev taken
          const elsewhere = plc(415)
          yield* setup(elsewhere, [], { rev: rev(100) })
          expect(yield* reconcile(elsewhere)).toEqual(COMPLETE)
          expect((yield* ownerState(elsewhere))?.snapshotRev).toBe(rev(100))
        })))
    }
  )
})

describe("Reconciler: a PDS that asks for time", () => {
  layer(reconcileStack(), { timeout: "120 seconds", excludeTestServices: true })(
    "Retry-After",
    (it) => {
      const LIST = "/xrpc/com.atproto.repo.listRecords"
      const limited = (status: number, headers: Record<string, string>): FakeResponse => ({
        ...json(status, { error: "RateLimitExceeded" }),
        headers
      })
      /** A PDS of its own (so that no answer cools another's host) answering `did`'s listRecords so. */
      const answered = (n: number, status: number, headers: Record<string, string>) =>
        Effect.scoped(Effect.gen(function*() {
          const did = plc(500 + n)
          const fakes = yield* Fakes
          const pds = yield* fakeServer((req) => (req.path === LIST ? limited(status, headers) : fakes.defaultPds(req)))
          yield* setup(did, [], { rev: rev(100), pds: pds.url })
          return yield* reconcile(did)
        }))

      it.effect("a 429 or 503 with Retry-After fails the owner with the delay it asked for; other answers carry none", () =>
        Effect.gen(function*() {
          expect(yield* answered(1, 429, { "retry-after": "120" }))
            .toStrictEqual({ _tag: "failed", kind: "pds_status", retryAfterMs: 120_000 })
          expect(yield* answered(2, 503, { "retry-after": "7" }))
            .toStrictEqual({ _tag: "failed", kind: "pds_status", retryAfterMs: 7_000 })
          // a 500 with the header, a 429 without it or with a value that is not one: no delay
          expect(yield* answered(3, 500, { "retry-after": "120" })).toStrictEqual({
            _tag: "failed",
            kind: "pds_status"
          })
          expect(yield* answered(4, 429, {})).toStrictEqual({ _tag: "failed", kind: "pds_status" })
          expect(yield* answered(5, 429, { "retry-after": "soon" })).toStrictEqual({
            _tag: "failed",
            kind: "pds_status"
          })
          expect(yield* ownerState(plc(501))).toMatchObject({ status: "failed", lastFailureKind: "pds_status" })
        }))

      it.effect("a PDS that asked for time is asked nothing for any owner until it has passed; other PDSes are", () =>
        Effect.scoped(Effect.gen(function*() {
          const fakes = yield* Fakes
          const [first, second, elsewhere] = [plc(511), plc(512), plc(513)]
          const busy = yield* fakeServer((req) =>
            req.path === LIST && req.query.get("repo") === first
              ? limited(429, { "retry-after": "120" })
              : fakes.defaultPds(req)
          )
          yield* live([whEv(second, "known", hook(), { rev: rev(1) })])
          yield* setup(first, [], { rev: rev(100), pds: busy.url })
          yield* setup(second, [], { rev: rev(100), pds: busy.url })
          yield* setup(elsewhere, [], { rev: rev(100) })
          expect(yield* reconcile(first)).toStrictEqual({ _tag: "failed", kind: "pds_status", retryAfterMs: 120_000 })
          const asked = busy.requests.length
          const counted = yield* seriesValue("firehook_reconcile_failures_total", { kind: "pds_cooling" })
          // the second owner's scan does not ask the PDS (it would answer 200): it fails with the
          // time left, keeps its registrations, and its failure is counted by kind
          const cooling = yield* reconcile(second)
          expect(cooling).toMatchObject({ _tag: "failed", kind: "pds_cooling" })
          const left = cooling._tag === "failed" ? cooling.retryAfterMs ?? 0 : 0
          expect(left).toBeGreaterThan(60_000)
          expect(left).toBeLessThanOrEqual(120_000)
          expect(busy.requests.length).toBe(asked)
          expect(yield* ownerState(second)).toMatchObject({ status: "failed", lastFailureKind: "pds_cooling" })
          expect(yield* memoryRkeys(second)).toEqual(["known"])
          expect(yield* seriesValue("firehook_reconcile_failures_total", { kind: "pds_cooling" })).toBe(counted + 1)
          // an owner on another PDS is scanned as usual
          expect(yield* reconcile(elsewhere)).toEqual(COMPLETE)
        })))

      it.effect("a 429 without Retry-After does not cool its PDS down for the other owners", () =>
        Effect.scoped(Effect.gen(function*() {
          const fakes = yield* Fakes
          const [first, second] = [plc(521), plc(522)]
          const pds = yield* fakeServer((req) =>
            req.path === LIST && req.query.get("repo") === first ? limited(429, {}) : fakes.defaultPds(req)
          )
          yield* setup(first, [], { rev: rev(100), pds: pds.url })
          yield* setup(second, [], { rev: rev(100), pds: pds.url })
          expect(yield* reconcile(first)).toStrictEqual({ _tag: "failed", kind: "pds_status" })
          expect(yield* reconcile(second)).toEqual(COMPLETE)
          expect(listRecordsRequests(pds).map((r) => r.query.get("repo"))).toEqual([first, second])
        })))
    }
  )
})

describe("Reconciler: a scan that dies", () => {
  /** `deleteOlder` dies (a bug's defect) for the DIDs listed. */
  const dying = new Set<string>()
  layer(
    reconcileStack({
      wrapStore: (real) =>
        wrapStore(
          real,
          (op, eff) => Effect.suspend(() => (op === "deleteOlder" && dying.size > 0 ? Effect.dieMessage("a bug") : eff))
        )
    }),
    { timeout: "120 seconds", excludeTestServices: true }
  )("defects", (it) => {
    it.effect("fails its owner (internal) instead of leaving it scanning; its registrations are kept", () =>
      Effect.gen(function*() {
        const did = plc(300)
        yield* live([whEv(did, "known", hook(), { rev: rev(1) })])
        yield* setup(did, [], { rev: rev(100) })
        dying.add(did)
        const outcome = yield* reconcile(did).pipe(Effect.ensuring(Effect.sync(() => dying.clear())))
        expect(outcome).toEqual({ _tag: "failed", kind: "internal" })
        expect(yield* ownerState(did)).toMatchObject({ status: "failed", lastFailureKind: "internal", failureCount: 1 })
        expect(yield* memoryRkeys(did)).toEqual(["known"])
        // the retry completes
        expect((yield* reconcile(did))._tag).toBe("complete")
        expect(yield* ownerState(did)).toMatchObject({ status: "complete" })
      }))
  })
})
