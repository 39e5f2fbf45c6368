/**
 * The snapshot's rev (SPEC §5.3 step 2; Snapshot.ts) with fake scan dependencies: getLatestCommit's
 * rev is taken only from a 2xx answer; otherwise (another status, a body without a TID, a rev more
 * than 5 min ahead) the rev is a TID of the scan's start, exactly; the rev is stored before any
 * page is read, and a scan whose rev (or a page) was fenced reads no further page. A PDS address
 * the transport refuses fails the owner as `pds_unsafe`.
 */
import { describe, expect, it } from "@effect/vitest"
import { Effect, Either } from "effect"
import { tidFromMicros } from "../../src/schemas/Tid.js"
import { SafeHttpError, type SafeResponse } from "../../src/services/platform/http/SafeHttp.js"
import type { IdentityShape } from "../../src/services/reconciliation/Identity.js"
import * as PdsCooldown from "../../src/services/reconciliation/PdsCooldown.js"
import { defaultLimits } from "../../src/services/reconciliation/Reconciler.js"
import { scan, type ScanDeps } from "../../src/services/reconciliation/Snapshot.js"
import { fakeReconcileStore } from "../support/fakeReconcileStore.js"
import { plc } from "../support/stack.js"

const PDS = "https://pds.test"
const DID = plc(1)
const START = 1_700_000_000_000_000
const TOKEN = 7

const response = (status: number, value: unknown): SafeResponse => ({
  status,
  headers: {},
  body: new TextEncoder().encode(JSON.stringify(value)),
  truncated: false
})

/** A scan of an empty repo whose getLatestCommit answers `commit`; what it asked and stored. */
const run = (
  commit: SafeResponse,
  options: {
    readonly fenced?: boolean
    readonly pageFenced?: boolean
    readonly listError?: SafeHttpError["kind"]
  } = {}
) => {
  const paths: Array<string> = []
  const saved: Array<string> = []
  const identity: IdentityShape = {
    resolvePds: () => Effect.succeed(PDS),
    resolveSigningKey: () => Effect.succeed(undefined),
    invalidate: () => Effect.void,
    stats: Effect.succeed({ entries: 0, hits: 0, misses: 0, refreshes: 0, failures: 0 })
  }
  const deps: ScanDeps = {
    identity,
    store: fakeReconcileStore({
      saveSnapshotRev: (_did, _token, rev) => Effect.sync(() => saved.push(rev)).pipe(Effect.as(!options.fenced)),
      applyPage: () => Effect.succeed({ fenced: options.pageFenced === true, written: 0 }),
      deleteOlder: () => Effect.succeed({ fenced: false, deleted: 0 }),
      pruneTombstones: () => Effect.succeed({ fenced: false, pruned: 0 }),
      complete: () => Effect.succeed(true)
    }),
    limits: defaultLimits,
    validateOpts: { allowInsecureDev: false },
    get: (url) =>
      Effect.suspend(() => {
        const path = new URL(url).pathname
        paths.push(path)
        if (path.endsWith("getLatestCommit")) return Effect.succeed(commit)
        if (options.listError !== undefined) return Effect.fail(new SafeHttpError({ kind: options.listError }))
        // a first page with a cursor, then the last page
        return Effect.succeed(
          response(200, paths.length === 2 ? { records: [], cursor: "next" } : { records: [] })
        )
      }),
    swap: () => Effect.void,
    cooldown: PdsCooldown.make(),
    commitStalls: PdsCooldown.make()
  }
  return Effect.map(
    Effect.either(scan(deps, DID, TOKEN, START)),
    (result) => ({
      outcome: Either.isRight(result)
        ? result.right
        : { failed: result.left._tag === "OwnerFailure" ? result.left.kind : "store" },
      paths,
      saved
    })
  )
}

const FALLBACK = tidFromMicros(START)
const GOOD = tidFromMicros(START - 60_000_000)

describe("the snapshot's rev", () => {
  it.effect("a 2xx getLatestCommit's rev is the snapshot's, stored before any page is read", () =>
    Effect.gen(function*() {
      const r = yield* run(response(200, { cid: "bafycommit", rev: GOOD }))
      expect(r.saved).toEqual([GOOD])
      expect(r.outcome).toMatchObject({ _tag: "complete", pages: 2 })
      expect(r.paths).toEqual([
        "/xrpc/com.atproto.sync.getLatestCommit",
        "/xrpc/com.atproto.repo.listRecords",
        "/xrpc/com.atproto.repo.listRecords"
      ])
    }))

  it.effect("a non-2xx answer is not a rev, whatever its body: a TID of the scan's start", () =>
    Effect.gen(function*() {
      for (const status of [302, 404, 500]) {
        const r = yield* run(response(status, { cid: "bafycommit", rev: GOOD }))
        expect(r.saved).toEqual([FALLBACK])
      }
    }))

  it.effect("a rev more than 5 min ahead of the scan's start is not trusted; 5 min ahead is", () =>
    Effect.gen(function*() {
      const ahead = tidFromMicros(START + 5 * 60 * 1_000_000)
      expect((yield* run(response(200, { cid: "bafycommit", rev: ahead }))).saved).toEqual([ahead])
      const beyond = tidFromMicros(START + 5 * 60 * 1_000_000 + 1)
      expect((yield* run(response(200, { cid: "bafycommit", rev: beyond }))).saved).toEqual([FALLBACK])
      expect((yield* run(response(200, { cid: "bafycommit", rev: "not-a-tid" }))).saved).toEqual([FALLBACK])
    }))

  it.effect("a scan whose rev was fenced (a newer scan began) is superseded before reading any page", () =>
    Effect.gen(function*() {
      const r = yield* run(response(200, { cid: "bafycommit", rev: GOOD }), { fenced: true })
      expect(r.outcome).toEqual({ _tag: "superseded" })
      expect(r.paths).toEqual(["/xrpc/com.atproto.sync.getLatestCommit"])
    }))

  it.effect("a page whose write was fenced supersedes the scan: no further page is read", () =>
    Effect.gen(function*() {
      const r = yield* run(response(200, { cid: "bafycommit", rev: GOOD }), { pageFenced: true })
      expect(r.outcome).toEqual({ _tag: "superseded" })
      expect(r.paths).toEqual(["/xrpc/com.atproto.sync.getLatestCommit", "/xrpc/com.atproto.repo.listRecords"])
    }))

  it.effect("a PDS address the transport refuses fails the owner as pds_unsafe, not as a network failure", () =>
    Effect.gen(function*() {
      for (const kind of ["blocked_target", "invalid_target"] as const) {
        const r = yield* run(response(200, { cid: "bafycommit", rev: GOOD }), { listError: kind })
        expect(r.outcome).toEqual({ failed: "pds_unsafe" })
      }
      expect((yield* run(response(200, {}), { listError: "network" })).outcome).toEqual({ failed: "pds_network" })
    }))
})
