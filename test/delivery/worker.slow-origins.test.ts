/**
 * Slow receivers cannot starve the other origins of request slots (SPEC §4.1: a pool of 64 with a
 * per-target cap of 4 "so one slow receiver cannot starve the others").
 *
 * Defaults: concurrency 64, per-origin cap 4 → the hold is 4 × 64 = 256 rows, at most 8 × 4 = 32
 * rows per origin. Eight slow origins with a backlog (receivers that hang until the request timeout,
 * or answer 200 after a long while: the circuit breaker never trips for either) fill the whole hold
 * with only 8 × 4 = 32 requests in flight; seven hold 224 rows, and the 32 rows of room left were
 * below the claim's minimum batch (64). Before the fix no claim ran in either case, and a ninth
 * origin's due row waited for the slow receivers although 32 request slots were idle. Now a worker
 * with half its request slots idle always claims: within the hold when there is room, or else a
 * start-only claim (rows of origins below their cap, no more than the idle slots) up to
 * `START_HOLD_FACTOR × concurrency` rows beyond it (Admission.claimPlan).
 */
import { describe, expect, it } from "@effect/vitest"
import { Effect, Queue } from "effect"
import * as Admission from "../../src/services/delivery/Admission.js"
import { makeCircuitBreaker } from "../../src/services/delivery/CircuitBreaker.js"
import type { ClaimedRow } from "../../src/services/delivery/DeliveryStore.js"
import { CLAIM_BATCH_MAX } from "../../src/services/delivery/Worker.js"
import { makeState, type WorkerEnv } from "../../src/services/delivery/WorkerState.js"
import { ev, plc, rev, sqlStack, whEv, whRecordValue } from "../support/stack.js"
import { copyDueRows, countWhere, eventually, receiver, type Reply, run, startWorker } from "./worker-support.js"

const BOB = plc(2)
const CAROL = plc(3)
const POST = "app.bsky.feed.post"

/** The defaults: 64 request slots, a cap of 4 per origin. */
const CONCURRENCY = 64
const PER_ORIGIN = 4
const MAX_HELD = Admission.HOLD_FACTOR * CONCURRENCY
const MIN_BATCH = MAX_HELD / 4
/** what a worker holds at most, start-only claims included */
const HELD_BOUND = (Admission.HOLD_FACTOR + Admission.START_HOLD_FACTOR) * CONCURRENCY

describe("slow receivers do not starve the other origins (PostgreSQL)", () => {
  it.scopedLive.each<[number, string, Reply]>([
    [8, "hang until the timeout", "hang"],
    [7, "hang until the timeout", "hang"],
    [8, "answer 200 after 25 s", { status: 200, body: "ok", delayMs: 25_000 }]
  ])(
    "%i slow origins (%s) with a backlog: a healthy origin's new row is sent while their rows wait",
    ([SLOW, _what, reply]) =>
      Effect.gen(function*() {
        const slow = yield* Effect.all(Array.from({ length: SLOW }, () => receiver({ reply: () => reply })))
        const healthy = yield* receiver()
        yield* run([
          ...slow.map((rx, i) =>
            whEv(plc(1), `slow${i}`, whRecordValue(`at://${BOB}`, { url: `${rx.url}/in` }), { rev: rev(1) })
          ),
          whEv(plc(1), "healthy", whRecordValue(`at://${CAROL}`, { url: `${healthy.url}/in` }), { rev: rev(1) })
        ])
        // a backlog of 32 older rows for each slow origin (one event, copied)
        yield* run([ev(BOB, POST, "s0", { rev: rev(10) })])
        for (let i = 0; i < SLOW; i++) yield* copyDueRows(`slow${i}`, 31)
        expect(yield* countWhere("outbox", "status = 'pending'")).toBe(SLOW * 32)

        const worker = yield* startWorker()
        // every slow origin has its cap of requests in flight, and its 32 rows held
        yield* eventually(
          "slow requests in flight",
          Effect.sync(() => slow.reduce((n, rx) => n + rx.received.length, 0)),
          (n) => n >= SLOW * PER_ORIGIN,
          20_000
        )
        const before = yield* worker.delivery.stats
        expect({ held: before.held, inFlight: before.inFlight }).toEqual({
          held: SLOW * 32,
          inFlight: SLOW * PER_ORIGIN
        })

        // one row for the healthy origin, due at once (its enqueue notifies the worker)
        yield* run([ev(CAROL, POST, "h0", { rev: rev(11) })])
        // the old code never claimed it (no request in 15 s); now it goes out at the next claim
        const delivered = yield* Effect.either(
          eventually("healthy row delivered", Effect.sync(() => healthy.received.length), (n) => n >= 1, 10_000)
        )
        const after = yield* worker.delivery.stats
        expect({ healthyRequests: healthy.received.length, delivered: delivered._tag }, JSON.stringify(after)).toEqual({
          healthyRequests: 1,
          delivered: "Right"
        })
        expect(after.held).toBeLessThanOrEqual(HELD_BOUND)
        // the slow origins still get no more than their cap
        expect(slow.map((rx) => rx.received.length)).toEqual(slow.map(() => PER_ORIGIN))
      }).pipe(
        Effect.scoped,
        Effect.provide(
          sqlStack({
            env: {
              WEBHOOK_ALLOW_INSECURE_DEV: "1",
              // a slow receiver: its requests run for the longest timeout allowed
              DELIVERY_TIMEOUT_MS: "30000"
            }
          })
        )
      ),
    120_000
  )
})

/**
 * The claim decision (Admission.claimPlan, claimOptions) in process, with the default settings:
 * when a claim runs, how many rows it may take, and which rows.
 */
describe("the claim decision with slow origins holding rows", () => {
  const planFor = (held: number, inFlight: number) =>
    Admission.claimPlan(
      { state: { ...makeState(), held, inFlight }, concurrency: CONCURRENCY, maxHeld: MAX_HELD, minBatch: MIN_BATCH },
      CLAIM_BATCH_MAX
    )

  const admissionEnv = Effect.gen(function*() {
    const env = {
      concurrency: CONCURRENCY,
      perOrigin: PER_ORIGIN,
      perOriginHold: Admission.ORIGIN_HOLD_FACTOR * PER_ORIGIN,
      maxHeld: MAX_HELD,
      minBatch: MIN_BATCH,
      state: makeState(),
      breaker: makeCircuitBreaker(),
      clock: yield* Effect.clock,
      snapshotMaxAgeMs: 0,
      traced: false,
      wake: yield* Queue.sliding<void>(1),
      runInRows: () => Effect.runFork(Effect.void)
    } as unknown as WorkerEnv
    /** `count` rows of `origin`, claimed and admitted (the first `perOrigin` start) */
    const hold = (origin: string, count: number) => {
      for (let i = 0; i < count; i++) {
        const token = `${origin}#${i}`
        const row = { deliveryId: token, leaseToken: token, origin, reclaimed: false, crashCount: 0 }
        Admission.dispatch(env, row as unknown as ClaimedRow, 0, 0)
      }
      Admission.pumpNow(env)
    }
    return { env, hold }
  })

  it.effect("8 slow origins fill the hold with 32 requests in flight: a start-only claim of the 32 idle slots", () =>
    Effect.gen(function*() {
      const { env, hold } = yield* admissionEnv
      for (let i = 0; i < 8; i++) hold(`https://slow${i}.example`, 32)
      expect({ held: env.state.held, inFlight: env.state.inFlight }).toEqual({ held: 256, inFlight: 32 })
      expect(Admission.claimPlan(env, CLAIM_BATCH_MAX)).toEqual({ limit: 32, startOnly: true })
      // it takes no row of an origin at its cap, and at most the cap of any other origin
      const options = Admission.claimOptions(env, true)
      expect(options.fullOrigins).toHaveLength(8)
      expect(options.rooms).toEqual([])
      expect(options.defaultRoom).toBe(PER_ORIGIN)
      // a normal claim (the hold not used up) keeps the per-origin hold as it was
      expect(Admission.claimOptions(env).defaultRoom).toBe(Admission.ORIGIN_HOLD_FACTOR * PER_ORIGIN)
    }))

  it.effect("a start-only claim gives an origin below its cap only the room up to its cap", () =>
    Effect.gen(function*() {
      const { env, hold } = yield* admissionEnv
      for (let i = 0; i < 8; i++) hold(`https://slow${i}.example`, 32)
      hold("https://healthy.example", 1)
      expect(Admission.claimOptions(env, true).rooms).toEqual([{ origin: "https://healthy.example", room: 3 }])
    }))

  it.effect("7 slow origins: the 32 rows of room left are claimed while request slots are idle", () =>
    Effect.gen(function*() {
      const { env, hold } = yield* admissionEnv
      for (let i = 0; i < 7; i++) hold(`https://slow${i}.example`, 32)
      expect({ held: env.state.held, inFlight: env.state.inFlight }).toEqual({ held: 224, inFlight: 28 })
      expect(Admission.claimPlan(env, CLAIM_BATCH_MAX)).toEqual({ limit: 32, startOnly: false })
    }))

  it("every request slot busy: claims only in batches of at least a quarter of the hold, as before", () => {
    expect(planFor(MAX_HELD - MIN_BATCH + 1, CONCURRENCY)).toBeUndefined()
    expect(planFor(MAX_HELD, CONCURRENCY)).toBeUndefined()
    expect(planFor(MAX_HELD - MIN_BATCH, CONCURRENCY)).toEqual({ limit: MIN_BATCH, startOnly: false })
    expect(planFor(0, 0)).toEqual({ limit: CLAIM_BATCH_MAX, startOnly: false })
  })

  it("half the request slots idle always get a claim until the bound; held never passes (HOLD_FACTOR + START_HOLD_FACTOR) × concurrency", () => {
    const wrong: Array<string> = []
    let claimsAtIdle = 0
    for (let inFlight = 0; inFlight <= CONCURRENCY; inFlight++) {
      for (let held = inFlight; held <= HELD_BOUND + 8; held++) {
        const plan = planFor(held, inFlight)
        const at = `held ${held}, in flight ${inFlight}: ${JSON.stringify(plan)}`
        if (plan !== undefined) {
          if (plan.limit <= 0 || held + plan.limit > HELD_BOUND) wrong.push(`past the bound at ${at}`)
          // beyond the hold only rows for the idle slots
          if (plan.startOnly ? plan.limit > CONCURRENCY - inFlight : held + plan.limit > MAX_HELD) {
            wrong.push(`past the hold at ${at}`)
          }
        }
        if ((CONCURRENCY - inFlight) * 2 >= CONCURRENCY && held < HELD_BOUND) {
          if (plan === undefined) wrong.push(`no claim at ${at}`)
          else claimsAtIdle++
        }
        // fewer slots idle, the hold nearly used up: no small claim at every wake-up (batching)
        if (inFlight * 2 > CONCURRENCY && held >= CONCURRENCY && MAX_HELD - held < MIN_BATCH && plan !== undefined) {
          wrong.push(`a small claim of a busy worker at ${at}`)
        }
      }
    }
    expect(wrong.slice(0, 5)).toEqual([])
    expect(claimsAtIdle).toBeGreaterThan(0)
  })
})
