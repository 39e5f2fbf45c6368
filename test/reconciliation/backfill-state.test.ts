/**
 * The backfill pass state (SPEC §5.2, §6.4) on PostgreSQL and in the memory fake, one script for
 * both: sweeps started by compare-and-swap, pages claimed by compare-and-swap on the frontier,
 * beats and take-overs on the holder and beat, finishing and completing fenced by the sweep's
 * number. And `pickClaim`, the pure choice of a claimed page to take over.
 */
import { describe, expect, it } from "@effect/vitest"
import { Effect, Layer } from "effect"
import { pickClaim, type Sighting } from "../../src/services/reconciliation/BackfillPass.js"
import {
  type PageClaim,
  type PassState,
  ReconcileStore,
  type ReconcileStoreShape,
  type SweepRef
} from "../../src/services/reconciliation/ReconcileStore.js"
import * as ReconcileStoreMod from "../../src/services/reconciliation/ReconcileStore.js"
import * as Db from "../support/db.js"
import { memoryPassState } from "../support/fakeReconcileStore.js"

const [a, b, c] = ["did:plc:a", "did:plc:b", "did:plc:c"] as const

/** The state without its times (the drivers' clocks differ), with whether each is set. */
const shape = (s: PassState | undefined) => {
  if (s === undefined) return undefined
  const { completedAt, startedAt, ...rest } = s
  return { ...rest, started: startedAt instanceof Date, completed: completedAt instanceof Date }
}

const claim = (
  last: string,
  after: string | undefined,
  dids: ReadonlyArray<string>,
  holder: string | undefined,
  beat: number
): PageClaim => ({
  last,
  after,
  dids,
  holder,
  beat
})

type PassOps = Pick<
  ReconcileStoreShape,
  "passState" | "startPass" | "claimPage" | "beatClaim" | "takeClaim" | "finishPage" | "releaseClaim" | "completePass"
>

const script = (store: PassOps) =>
  Effect.gen(function*() {
    const p = "initial"
    const state = Effect.map(store.passState(p), shape)
    expect(yield* state).toBeUndefined()
    // sweep 1: started once, however many start it from the same sight
    expect((yield* store.startPass(p, 0)).started).toBe(true)
    const again = yield* store.startPass(p, 0)
    expect(again.started).toBe(false)
    expect(again.state.sweep).toBe(1)
    const s1: SweepRef = { pass: p, sweep: 1 }
    // claims: a compare-and-swap on the frontier, forward only, in the sweep named
    expect(yield* store.claimPage(s1, undefined, [a, b], "h1")).toBe(true)
    expect(yield* store.claimPage(s1, undefined, [a, b], "h2")).toBe(false)
    expect(yield* store.claimPage({ pass: p, sweep: 2 }, b, [c], "h2")).toBe(false)
    expect(yield* store.claimPage(s1, b, [a], "h2")).toBe(false)
    expect(yield* store.claimPage(s1, b, [c], "h2")).toBe(true)
    expect(yield* state).toEqual({
      pass: p,
      continuation: undefined,
      frontier: c,
      ownersDone: 0,
      sweep: 1,
      claims: [claim(b, undefined, [a, b], "h1", 0), claim(c, b, [c], "h2", 0)],
      started: true,
      completed: false
    })
    // beats: the holder's only; a take-over: only from the holder and beat seen
    expect(yield* store.beatClaim(s1, b, "h2")).toBe(false)
    expect(yield* store.beatClaim(s1, b, "h1")).toBe(true)
    expect(yield* store.takeClaim(s1, claim(b, undefined, [a, b], "h1", 0), "h3")).toBe(false)
    expect(yield* store.takeClaim(s1, claim(b, undefined, [a, b], "h1", 1), "h3")).toBe(true)
    expect(yield* store.beatClaim(s1, b, "h1")).toBe(false)
    // finishing: the holder's only; the page's owners counted, done through its last DID
    expect(yield* store.finishPage(s1, b, "h1")).toBe(false)
    expect(yield* store.finishPage(s1, b, "h3")).toBe(true)
    expect(yield* state).toMatchObject({
      continuation: b,
      frontier: c,
      ownersDone: 2,
      claims: [claim(c, b, [c], "h2", 0)]
    })
    // not complete while a page is claimed, nor from another frontier
    expect(yield* store.completePass(s1, c)).toBe(false)
    expect(yield* store.releaseClaim(s1, c, "h3")).toBe(false)
    expect(yield* store.releaseClaim(s1, c, "h2")).toBe(true)
    expect(yield* store.takeClaim(s1, claim(c, b, [c], undefined, 0), "h4")).toBe(true)
    expect(yield* store.finishPage(s1, c, "h4")).toBe(true)
    expect(yield* store.completePass(s1, b)).toBe(false)
    expect(yield* store.completePass(s1, c)).toBe(true)
    expect(yield* state).toEqual({
      pass: p,
      continuation: undefined,
      frontier: undefined,
      ownersDone: 3,
      sweep: 1,
      claims: [],
      started: true,
      completed: true
    })
    // sweep 2, started only from the sweep seen complete; sweep 1's writes change nothing
    expect((yield* store.startPass(p, 0)).started).toBe(false)
    expect((yield* store.startPass(p, 1)).started).toBe(true)
    const s2: SweepRef = { pass: p, sweep: 2 }
    expect(yield* store.claimPage(s2, undefined, [a], "h5")).toBe(true)
    expect(yield* store.claimPage(s1, a, [b], "h1")).toBe(false)
    expect(yield* store.beatClaim(s1, a, "h5")).toBe(false)
    expect(yield* store.takeClaim(s1, claim(a, undefined, [a], "h5", 0), "h1")).toBe(false)
    expect(yield* store.releaseClaim(s1, a, "h5")).toBe(false)
    expect(yield* store.finishPage(s1, a, "h5")).toBe(false)
    expect(yield* store.finishPage(s2, a, "h5")).toBe(true)
    expect(yield* store.completePass(s1, a)).toBe(false)
    expect(yield* state).toEqual({
      pass: p,
      continuation: a,
      frontier: a,
      ownersDone: 1,
      sweep: 2,
      claims: [],
      started: true,
      completed: false
    })
  })

describe("the backfill pass state", () => {
  it.scopedLive("on PostgreSQL", () =>
    Effect.flatMap(ReconcileStore, script).pipe(
      Effect.provide(ReconcileStoreMod.layerSql.pipe(Layer.provideMerge(Db.layer())))
    ), 60_000)

  it.effect("in the memory fake", () => script(memoryPassState()))
})

describe("pickClaim (which claimed page to take over)", () => {
  const page = (last: string, holder: string | undefined, beat: number) => claim(last, undefined, [last], holder, beat)
  const none = new Map<string, Sighting>()
  const never = () => false

  it("a page given back, or one an ended pass of this replica holds, at once", () => {
    expect(pickClaim([page(a, "x", 3), page(b, undefined, 4)], none, 0, 30_000, never).take).toEqual({
      claim: page(b, undefined, 4),
      reason: "given_back"
    })
    expect(pickClaim([page(a, "x", 3), page(b, "mine", 4)], none, 0, 30_000, (h) => h === "mine").take).toEqual({
      claim: page(b, "mine", 4),
      reason: "own"
    })
  })

  it("another holder's page once its beat has not moved for the bound, by this replica's clock", () => {
    const first = pickClaim([page(a, "x", 3)], none, 1_000, 30_000, never)
    expect(first.take).toBeUndefined()
    expect(first.seen.get(a)).toEqual({ holder: "x", beat: 3, since: 1_000 })
    expect(pickClaim([page(a, "x", 3)], first.seen, 30_999, 30_000, never).take).toBeUndefined()
    expect(pickClaim([page(a, "x", 3)], first.seen, 31_000, 30_000, never).take).toEqual({
      claim: page(a, "x", 3),
      reason: "abandoned"
    })
    // a beat, or another holder (a take-over), starts the wait again
    const beat = pickClaim([page(a, "x", 4)], first.seen, 31_000, 30_000, never)
    expect(beat.take).toBeUndefined()
    expect(beat.seen.get(a)).toEqual({ holder: "x", beat: 4, since: 31_000 })
    expect(pickClaim([page(a, "y", 3)], first.seen, 31_000, 30_000, never).take).toBeUndefined()
  })

  it("forgets pages no longer claimed", () => {
    const first = pickClaim([page(a, "x", 3), page(b, "x", 1)], none, 0, 30_000, never)
    expect([...pickClaim([page(b, "x", 1)], first.seen, 10, 30_000, never).seen.keys()]).toEqual([b])
  })
})
