/**
 * The deadlines of the transport's requests in progress (SafeHttp), enforced by one ticker fiber.
 *
 * @since 0.1.0
 */
import { Clock, Duration, Effect, Queue } from "effect"
import type { Scope } from "effect"

/**
 * One request in progress, as the deadline ticker sees it: the overall deadline and, while the
 * connection to one of several addresses is being made, that address's connect deadline.
 */
export interface Pending {
  readonly deadline: number
  connectDeadline: number | undefined
  /** Called by the ticker when a deadline has passed. */
  readonly expire: (now: number) => void
}

/**
 * Deadlines of the requests in progress, enforced by ONE fiber per transport instead of a timer
 * race per request (`Effect.timeout` forks two fibers per call). While any request is in progress,
 * the fiber wakes every {@link DEADLINE_TICK_MS} (Effect `Clock`, so `TestClock` drives it) and
 * expires the requests whose deadline has passed; while none is, it sleeps until one starts.
 */
export interface Deadlines {
  readonly add: (p: Pending) => void
  readonly remove: (p: Pending) => void
}

/** Granularity of request deadlines: a request times out at most this much after its deadline. */
export const DEADLINE_TICK_MS = 20

/**
 * The clock of request deadlines, in milliseconds: the Clock's monotonic nanoseconds (the default
 * Clock's are `process.hrtime`'s, anchored at the wall clock once; `TestClock`'s follow its time),
 * so a step of the system clock (NTP, a VM restored) neither expires requests early nor keeps a
 * hanging one alive past its timeout.
 */
export const deadlineNow = (clock: Clock.Clock): number => Number(clock.unsafeCurrentTimeNanos() / 1_000_000n)

/**
 * One turn of the event loop for the I/O already waiting (a zero sleep is a timer: the loop polls
 * I/O before it fires; `TestClock` ends it at once): a request whose answer arrived while the
 * process was stalled (a long pause, a starved CPU) past its deadline settles before it is expired,
 * instead of being counted as a timeout and sent again.
 */
const ioTurn = Effect.sleep(Duration.zero)

export const makeDeadlines: Effect.Effect<Deadlines, never, Scope.Scope> = Effect.gen(function*() {
  const pending = new Set<Pending>()
  const wake = yield* Queue.sliding<void>(1)
  const tick = Effect.gen(function*() {
    if (pending.size === 0) {
      yield* Queue.take(wake)
      return
    }
    yield* Effect.sleep(Duration.millis(DEADLINE_TICK_MS))
    const clock = yield* Effect.clock
    const now = deadlineNow(clock)
    const due = (p: Pending) => now >= p.deadline || (p.connectDeadline !== undefined && now >= p.connectDeadline)
    let any = false
    for (const p of pending) any ||= due(p)
    if (!any) return
    yield* ioTurn
    // those still in progress (a settled request has removed itself) and still due
    for (const p of pending) if (due(p)) p.expire(now)
  })
  yield* Effect.forkScoped(Effect.forever(tick))
  return {
    add: (p) => {
      pending.add(p)
      if (pending.size === 1) Queue.unsafeOffer(wake, undefined)
    },
    remove: (p) => {
      pending.delete(p)
    }
  }
})
