/**
 * A batching reader with a freshness guarantee: every `get(key)` is answered by a lookup that
 * STARTED after `get` was called, so it sees every change committed before the call. Calls made
 * while a lookup is running are collected and answered together by the next lookup (one lookup in
 * flight at a time; at most `maxBatch` keys per lookup, equal keys looked up once).
 *
 * The delivery worker uses it for the per-attempt subscription check (SPEC §4.2 step 1): each
 * attempt still reads the current subscription right before its request, but concurrent attempts
 * share one query instead of two each. A waiter costs no fiber; the one lookup fiber belongs to the
 * calling scope. A lookup failure fails every waiter of that batch (the caller retries the attempt
 * as transient); when the scope closes, waiters are interrupted.
 */
import { Effect, Exit, Queue } from "effect"
import type { Scope } from "effect"

export interface FreshReader<K, A, E> {
  /** The value of `key` as read by a lookup that started after this call. */
  readonly get: (key: K) => Effect.Effect<A, E>
  /** Lookups run so far (for tests and benchmarks). */
  readonly lookups: () => number
}

export interface FreshReaderOptions<K, A, E> {
  /** Answers one value per key, in the order of `keys` (distinct keys). */
  readonly lookup: (keys: ReadonlyArray<K>) => Effect.Effect<ReadonlyArray<A>, E>
  /** Identity of a key (equal identities are looked up once per batch). */
  readonly keyOf: (key: K) => string
  /** Distinct keys per lookup at most. */
  readonly maxBatch: number
}

interface Waiter<K, A, E> {
  readonly key: K
  readonly resume: (effect: Effect.Effect<A, E>) => void
}

export const make = <K, A, E>(
  options: FreshReaderOptions<K, A, E>
): Effect.Effect<FreshReader<K, A, E>, never, Scope.Scope> =>
  Effect.gen(function*() {
    const maxBatch = Math.max(1, Math.floor(options.maxBatch))
    const wake = yield* Queue.sliding<void>(1)
    let pending: Array<Waiter<K, A, E>> = []
    let running: ReadonlyArray<Waiter<K, A, E>> = []
    let lookups = 0

    /** Takes waiters until `maxBatch` distinct keys; answers the keys and each waiter's index. */
    const take = () => {
      const index = new Map<string, number>()
      const keys: Array<K> = []
      const slots: Array<number> = []
      let i = 0
      for (; i < pending.length; i++) {
        const w = pending[i]
        if (w === undefined) break
        const id = options.keyOf(w.key)
        let at = index.get(id)
        if (at === undefined) {
          if (keys.length >= maxBatch) break
          at = keys.length
          index.set(id, at)
          keys.push(w.key)
        }
        slots.push(at)
      }
      const batch = pending.slice(0, i)
      pending = i >= pending.length ? [] : pending.slice(i)
      return { batch, keys, slots }
    }

    const loop = Effect.gen(function*() {
      while (true) {
        if (pending.length === 0) {
          yield* Queue.take(wake)
          continue
        }
        // everything pending now was asked for before this lookup starts
        const { batch, keys, slots } = take()
        running = batch
        lookups++
        const result = yield* Effect.exit(options.lookup(keys))
        running = []
        if (Exit.isSuccess(result)) {
          const values = result.value
          for (let j = 0; j < batch.length; j++) {
            const w = batch[j]
            const slot = slots[j]
            if (w === undefined || slot === undefined) continue
            w.resume(
              slot < values.length
                ? Effect.succeed(values[slot] as A)
                : Effect.die(new Error("FreshReader: the lookup answered too few values"))
            )
          }
        } else {
          const cause = result.cause
          for (const w of batch) w.resume(Effect.failCause(cause))
        }
      }
    })

    const interruptAll = Effect.sync(() => {
      const left = [...running, ...pending]
      running = []
      pending = []
      for (const w of left) w.resume(Effect.interrupt)
    })

    yield* Effect.forkScoped(Effect.ensuring(loop, interruptAll))

    const get = (key: K): Effect.Effect<A, E> =>
      Effect.async<A, E>((resume) => {
        pending.push({ key, resume })
        wake.unsafeOffer(undefined)
      })

    const reader: FreshReader<K, A, E> = { get, lookups: () => lookups }
    return reader
  })
