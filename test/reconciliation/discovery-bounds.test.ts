/**
 * Relay discovery's bounds (SPEC §5.2; Discovery.ts) with a fake transport and a fake store: the
 * `limit` asked for, a page holding more repos than asked for, a cursor seen before or too long, a
 * non-2xx answer (a redirect is not followed) each end discovery with a reason; only canonical
 * DIDs are recorded, page by page.
 */
import { describe, expect, it } from "@effect/vitest"
import { Effect, Either } from "effect"
import { SafeHttp, type SafeRequest, type SafeResponse } from "../../src/services/platform/http/SafeHttp.js"
import { discoverPages } from "../../src/services/reconciliation/Discovery.js"
import { fakeReconcileStore } from "../support/fakeReconcileStore.js"
import { plc } from "../support/stack.js"

const RELAY = "https://relay.test"

const response = (status: number, value: unknown): SafeResponse => ({
  status,
  headers: {},
  body: new TextEncoder().encode(JSON.stringify(value)),
  truncated: false
})

/** Discovery against pages answered in order (the last one repeats); what it asked and recorded. */
const run = (pages: ReadonlyArray<{ readonly status?: number; readonly body: unknown }>, pageLimit = 3) => {
  const urls: Array<URL> = []
  const recorded: Array<ReadonlyArray<string>> = []
  const http: typeof SafeHttp.Service = {
    request: (req: SafeRequest) =>
      Effect.sync(() => {
        urls.push(new URL(req.url))
        const page = pages[Math.min(urls.length, pages.length) - 1]
        return response(page?.status ?? 200, page?.body ?? {})
      })
  }
  const store = fakeReconcileStore({ addOwners: (dids) => Effect.sync(() => void recorded.push(dids)) })
  return Effect.map(
    Effect.either(discoverPages(http, store, RELAY, { maxPages: 10, pageLimit })),
    (result) => ({
      result: Either.isRight(result) ? "ok" : result.left._tag === "DiscoveryFailure" ? result.left.reason : "store",
      found: Either.getOrUndefined(result),
      urls,
      recorded
    })
  )
}

const repos = (...dids: ReadonlyArray<string>) => dids.map((did) => ({ did }))

describe("relay discovery bounds", () => {
  it.effect("asks for pageLimit repos a page; a page with more than that is invalid", () =>
    Effect.gen(function*() {
      const over = yield* run([{ body: { repos: repos(plc(1), plc(2), plc(3), plc(4)), cursor: "c1" } }])
      expect(over.result).toBe("invalid")
      expect(over.urls).toHaveLength(1)
      expect(over.urls[0]?.searchParams.get("limit")).toBe("3")
      expect(over.urls[0]?.searchParams.get("collection")).toBe("place.wisp.v2.wh")
      expect(over.recorded).toEqual([])
    }))

  it.effect("a cursor seen before ends discovery as a failure (no loop to maxPages)", () =>
    Effect.gen(function*() {
      const r = yield* run([
        { body: { repos: repos(plc(1)), cursor: "c1" } },
        { body: { repos: repos(plc(2)), cursor: "c1" } }
      ])
      expect(r.result).toBe("cursor")
      expect(r.urls).toHaveLength(2)
      expect(r.recorded).toEqual([[plc(1)], [plc(2)]])
    }))

  it.effect("a cursor of 2,048 characters is followed; one of 2,049 is a failure", () =>
    Effect.gen(function*() {
      const ok = yield* run([
        { body: { repos: repos(plc(1)), cursor: "x".repeat(2_048) } },
        { body: { repos: repos(plc(2)) } }
      ])
      expect(ok.result).toBe("ok")
      expect(ok.urls[1]?.searchParams.get("cursor")).toBe("x".repeat(2_048))
      const long = yield* run([{ body: { repos: repos(plc(1)), cursor: "x".repeat(2_049) } }])
      expect(long.result).toBe("cursor")
      expect(long.urls).toHaveLength(1)
    }))

  it.effect("a 3xx (not followed) is a failure even with a page as its body; non-canonical DIDs are not recorded", () =>
    Effect.gen(function*() {
      const moved = yield* run([{ status: 301, body: { repos: repos(plc(1)) } }])
      expect(moved.result).toBe("status")
      expect(moved.recorded).toEqual([])
      const mixed = yield* run([{ body: { repos: repos(plc(1), "did:web:Example.com", "did:plc:short") } }])
      expect(mixed.result).toBe("ok")
      expect(mixed.recorded).toEqual([[plc(1)]])
    }))

  it.effect("a listing longer than maxPages ends there, truncated; one that ends says it is whole", () =>
    Effect.gen(function*() {
      let n = 0
      const endless = Array.from({ length: 12 }, () => ({ body: { repos: repos(plc(++n)), cursor: `c${n}` } }))
      const long = yield* run(endless)
      expect(long.result).toBe("ok")
      expect(long.found).toEqual({ pages: 10, truncated: true })
      expect(long.urls).toHaveLength(10)
      const whole = yield* run([{ body: { repos: repos(plc(1)), cursor: "c1" } }, { body: { repos: repos(plc(2)) } }])
      expect(whole.found).toEqual({ pages: 2, truncated: false })
    }))
})
