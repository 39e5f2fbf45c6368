/**
 * Per-origin circuit breaker (SPEC §4.3), as a pure, synchronous state machine.
 *
 * - closed: attempts go through; transient failures are counted. `threshold` consecutive transient
 *   failures (default 20) open the circuit for `cooldownMs` (default 60 s).
 * - open: `canAttempt` answers `"open"` until the cool-down ends; due rows are rescheduled without an
 *   attempt (in bulk, by the worker's mover: Parking.ts, from `held`).
 * - half-open: the first `canAttempt` after the cool-down answers `"probe"` (exactly one caller gets it);
 *   everyone else still sees `"open"`. The probe's success closes the circuit (and resets the cool-down);
 *   its transient failure re-opens it with the cool-down doubled, up to `maxCooldownMs` (default 30 min).
 *   A probe that never reports back (its worker died) is forgotten after `probeTimeoutMs`, and the next
 *   caller gets a new probe.
 *
 * Time is passed in (`nowMs`, read by the caller from Effect's `Clock`); nothing here sleeps or reads
 * a clock. Instances are mutable but every method is synchronous, so concurrent fibers in one process can
 * share one instance safely.
 *
 * The caller reports `onSuccess` for any attempt that reached the receiver and was not a transient
 * failure (2xx, and also permanent answers such as 4xx: the origin is up), and `onTransientFailure` for
 * retryable transport/HTTP failures (`http_5xx`, `http_429`, `dns`, `timeout`, `network`). Failures that
 * say nothing about the origin (`secret_unavailable`, `subscription_unavailable`, `transform_failed`, …)
 * report nothing.
 *
 * Bounded: at most `maxOrigins` (default 10,000) tracked origins. A closed origin with no failures is
 * not tracked at all. When full, the least recently updated closed entry is evicted first, then the least
 * recently updated open one (losing its protection, never blocking a healthy origin).
 *
 * Idle origins are forgotten (`forgetIdle`, run by the worker's mover every second): an open origin
 * whose cool-down ended, with no probe outstanding, and that nothing has tried to deliver to for
 * `forgetIdleAfterMs` (default 30 min; the worker uses at least `DELIVERY_RETRY_MAX_MS`, since a
 * row waiting out its own retry delay asks only when it is due). An origin with rows asks for its
 * probe as soon as its cool-down ends (its rows were parked to exactly then), so such an origin has
 * no traffic left: its webhook was deleted or changed its URL. Without this, every origin that ever tripped stayed
 * half-open until evicted at `maxOrigins`, and `openCount` (health `delivery.openCircuits`, the
 * `firehook_delivery_open_circuits` gauge) only ever grew with URL churn. Forgetting costs at most
 * `threshold` attempts if the origin's traffic comes back and it is still down.
 *
 * @since 0.1.0
 */
import * as DeliveryConfig from "./DeliveryConfig.js"

/** Breaker settings. */
export interface CircuitBreakerConfig {
  /** Consecutive transient failures that open the circuit (≥ 1). */
  readonly threshold: number
  /** First cool-down, ms. */
  readonly cooldownMs: number
  /** Cool-down ceiling, ms (≥ cooldownMs). */
  readonly maxCooldownMs: number
  /** Tracked origins bound (≥ 1). */
  readonly maxOrigins: number
  /** How long a granted probe may stay unreported before another probe is allowed, ms. */
  readonly probeTimeoutMs: number
  /**
   * An open origin whose cool-down (and probe deadline) ended this long ago without any attempt
   * since is forgotten by `forgetIdle`, ms.
   */
  readonly forgetIdleAfterMs: number
}

/** Defaults of SPEC §4.3. */
export const defaultCircuitBreakerConfig: CircuitBreakerConfig = {
  threshold: DeliveryConfig.delivery.circuitThreshold.default,
  cooldownMs: DeliveryConfig.delivery.circuitCooldownMs.default,
  maxCooldownMs: 1_800_000,
  maxOrigins: 10_000,
  probeTimeoutMs: 60_000,
  forgetIdleAfterMs: 1_800_000
}

/** The state kept for one origin. */
export interface OriginState {
  readonly consecutiveFailures: number
  /** 0 while closed; otherwise the end of the current cool-down (epoch ms). */
  readonly openUntilMs: number
  /** The cool-down that was (or will next be) applied, ms. */
  readonly cooldownMs: number
  /** Whether a probe has been granted and not yet reported. */
  readonly probing: boolean
  /** When the outstanding probe was granted (epoch ms), 0 if none. */
  readonly probeStartedMs: number
}

/** What a caller may do with a due row for this origin. */
export type Admission = "closed" | "probe" | "open"

/** Counts for health. */
export interface CircuitBreakerStats {
  readonly tracked: number
  /** Tripped and still cooling down. */
  readonly open: number
  /** Tripped, cool-down over: waiting for or running a probe. */
  readonly halfOpen: number
}

/** An origin whose rows are kept out of claims until `untilMs` (epoch ms). */
export interface HeldOrigin {
  readonly origin: string
  readonly untilMs: number
}

/** The breaker. */
export interface CircuitBreaker {
  readonly canAttempt: (origin: string, nowMs: number) => Admission
  readonly onSuccess: (origin: string) => void
  readonly onTransientFailure: (origin: string, nowMs: number) => void
  /** Origins that are not closed (open or half-open). */
  readonly openCount: (nowMs: number) => number
  readonly stats: (nowMs: number) => CircuitBreakerStats
  /** The state of one origin (undefined = closed with no recorded failures). */
  readonly get: (origin: string) => OriginState | undefined
  /**
   * The origins none of whose rows may be attempted now, with until when: open (cooling down: the
   * cool-down's end) and half-open with a probe outstanding (the probe's deadline). A half-open
   * origin waiting for its probe is not listed (its next row is the probe). At most `maxOrigins`.
   */
  readonly held: (nowMs: number) => ReadonlyArray<HeldOrigin>
  /**
   * Forgets the open origins idle for `forgetIdleAfterMs` since their cool-down ended (and their
   * probe's deadline passed) and answers how many. O(open origins).
   */
  readonly forgetIdle: (nowMs: number) => number
}

interface MutableState {
  consecutiveFailures: number
  openUntilMs: number
  cooldownMs: number
  probing: boolean
  probeStartedMs: number
}

/** Creates a breaker with all origins closed. */
export const makeCircuitBreaker = (config: Partial<CircuitBreakerConfig> = {}): CircuitBreaker => {
  const cfg: CircuitBreakerConfig = { ...defaultCircuitBreakerConfig, ...config }
  const threshold = Math.max(1, Math.floor(cfg.threshold))
  const baseCooldown = Math.max(0, cfg.cooldownMs)
  const maxCooldown = Math.max(baseCooldown, cfg.maxCooldownMs)
  const maxOrigins = Math.max(1, Math.floor(cfg.maxOrigins))

  // Two insertion-ordered maps: re-inserting on update makes the first key the least recently updated.
  const counting = new Map<string, MutableState>() // closed, 1..threshold-1 failures
  const tripped = new Map<string, MutableState>() // open or half-open

  const lookup = (origin: string): MutableState | undefined => tripped.get(origin) ?? counting.get(origin)

  const evictOne = (): void => {
    const victim = counting.keys().next()
    if (victim.done !== true) {
      counting.delete(victim.value)
      return
    }
    const openVictim = tripped.keys().next()
    if (openVictim.done !== true) tripped.delete(openVictim.value)
  }

  const store = (origin: string, state: MutableState): void => {
    counting.delete(origin)
    tripped.delete(origin)
    while (counting.size + tripped.size >= maxOrigins) evictOne()
    if (state.openUntilMs > 0) tripped.set(origin, state)
    else counting.set(origin, state)
  }

  const trip = (state: MutableState, nowMs: number, cooldownMs: number): void => {
    state.cooldownMs = cooldownMs
    state.openUntilMs = nowMs + cooldownMs
    state.probing = false
    state.probeStartedMs = 0
  }

  const canAttempt = (origin: string, nowMs: number): Admission => {
    const s = tripped.get(origin)
    if (s === undefined) return "closed"
    if (nowMs < s.openUntilMs) return "open"
    if (s.probing && nowMs - s.probeStartedMs < cfg.probeTimeoutMs) return "open"
    s.probing = true
    s.probeStartedMs = nowMs
    return "probe"
  }

  const onSuccess = (origin: string): void => {
    counting.delete(origin)
    tripped.delete(origin)
  }

  const onTransientFailure = (origin: string, nowMs: number): void => {
    const existing = lookup(origin)
    const s: MutableState = existing ?? {
      consecutiveFailures: 0,
      openUntilMs: 0,
      cooldownMs: baseCooldown,
      probing: false,
      probeStartedMs: 0
    }
    s.consecutiveFailures += 1
    if (s.openUntilMs === 0) {
      if (s.consecutiveFailures >= threshold) trip(s, nowMs, baseCooldown)
    } else if (nowMs >= s.openUntilMs) {
      // cool-down over: this is the probe's failure (or a straggler's, which proves the same): back off more
      trip(s, nowMs, Math.min(maxCooldown, s.cooldownMs * 2))
    }
    // a failure reported while still cooling down came from an attempt started before the trip: counted only
    store(origin, s)
  }

  const stats = (nowMs: number): CircuitBreakerStats => {
    let open = 0
    for (const s of tripped.values()) if (nowMs < s.openUntilMs) open++
    return { tracked: counting.size + tripped.size, open, halfOpen: tripped.size - open }
  }

  const snapshot = (s: MutableState): OriginState => ({ ...s })

  const held = (nowMs: number): ReadonlyArray<HeldOrigin> => {
    const out: Array<HeldOrigin> = []
    for (const [origin, s] of tripped) {
      if (nowMs < s.openUntilMs) out.push({ origin, untilMs: s.openUntilMs })
      else if (s.probing && nowMs - s.probeStartedMs < cfg.probeTimeoutMs) {
        out.push({ origin, untilMs: s.probeStartedMs + cfg.probeTimeoutMs })
      }
    }
    return out
  }

  /** when the origin was last asked for (its cool-down's end, or its last probe's deadline) */
  const lastAskedMs = (s: MutableState): number =>
    s.probing ? Math.max(s.openUntilMs, s.probeStartedMs + cfg.probeTimeoutMs) : s.openUntilMs

  const forgetIdle = (nowMs: number): number => {
    let forgotten = 0
    for (const [origin, s] of tripped) {
      if (nowMs - lastAskedMs(s) >= cfg.forgetIdleAfterMs) {
        tripped.delete(origin)
        forgotten++
      }
    }
    return forgotten
  }

  return {
    canAttempt,
    onSuccess,
    onTransientFailure,
    openCount: (_nowMs: number) => tripped.size,
    stats,
    get: (origin) => {
      const s = lookup(origin)
      return s === undefined ? undefined : snapshot(s)
    },
    held,
    forgetIdle
  }
}
