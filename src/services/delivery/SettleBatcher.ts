/**
 * The settle batcher of the `DeliveryStore` SQL driver (DeliveryStoreSql.ts): concurrent settles
 * are collected and applied by ONE statement per batch (`run`), at most `SETTLE_BATCH_MAX` at a
 * time by `SETTLE_FLUSHERS` flushers. A batch starts as soon as a flusher is free (no added
 * delay); batches grow while a statement runs. Each settle completes with whether its guarded
 * update applied (its lease token is among those `run` returns).
 *
 * A batch whose statement failed (a connection reset, a server restart) is run again, at most
 * `SETTLE_RETRIES` more times, `SETTLE_RETRY_BASE` apart and doubling, unless it timed out (a
 * statement bound is 15 s: its retries would hold the flusher for a minute; the settle path runs
 * it again while the lease lasts, see below). This is safe because every settle
 * is guarded by its lease token: when the server committed the first statement before the failure
 * reached us, the second one applies nothing (the token was cleared), and its settles answer
 * "not applied". Without it, one dropped connection left every row of the batch leased, forgotten
 * by the worker, until its lease expired: each was sent again a lease later (60 s), although its
 * receiver had already answered, and that answer was never recorded. A longer outage (a restart, a
 * failover) outlasts these retries: the settle path then queues the settle again, with backoff,
 * while the row's lease lasts (Settlement.ts), so a batch never holds the flusher for longer than
 * its retries here, and settles queued meanwhile join the next batch.
 *
 * When the store's scope closes, the settles of a batch still running, those still queued and any
 * queued later are answered with the error `shutdown` at once (the settle path does not run those
 * again).
 */
import { Cause, Effect, Exit, Option, Queue, Schedule, type Scope } from "effect"
import { StoreError } from "../platform/Persistence.js"
import { SETTLE_BATCH_MAX, SETTLE_FLUSHERS, SETTLE_RETRIES, SETTLE_RETRY_BASE } from "./DeliveryStore.js"

/** The retry of a failed settle statement (see the module documentation); made when a batcher is. */
const retryFailed = () => ({
  times: SETTLE_RETRIES,
  schedule: Schedule.exponential(SETTLE_RETRY_BASE),
  while: (e: StoreError) => e.code !== "timeout"
})

/** Queue a settle for the next batch; completes with whether the guarded update applied. */
export type SettleOne<I> = (item: I) => Effect.Effect<boolean, StoreError>

/** The batcher over `run`; its flushers run (and queued settles are answered) in the caller's scope. */
export const makeSettleBatcher = <I extends { readonly token: string }>(
  run: (items: ReadonlyArray<I>) => Effect.Effect<ReadonlyArray<{ readonly lease_token: string }>, StoreError>
): Effect.Effect<SettleOne<I>, never, Scope.Scope> =>
  Effect.gen(function*() {
    type Waiter = { readonly item: I; readonly resume: (result: Effect.Effect<boolean, StoreError>) => void }
    const queue: Array<Waiter> = []
    const work = yield* Queue.sliding<void>(1)
    const retry = retryFailed()
    const APPLIED = Effect.succeed(true)
    const NOT_APPLIED = Effect.succeed(false)
    const SHUT_DOWN = Effect.fail(new StoreError({ op: "delivery.settle", code: "shutdown" }))
    let closed = false
    const flusher = Effect.gen(function*() {
      while (true) {
        if (queue.length === 0) {
          yield* Queue.take(work)
          continue
        }
        const batch = queue.splice(0, SETTLE_BATCH_MAX)
        // more work left: let another flusher take it while this one runs (no yield point between
        // taking the batch and running it, so that an interruption finds it answered below)
        if (queue.length > 0) work.unsafeOffer(undefined)
        // every outcome, even a defect, completes every waiter of the batch
        const items = batch.map((b) => b.item)
        // a batch still running when the store's scope closes is answered too
        const result = yield* Effect.exit(Effect.retry(run(items), retry)).pipe(
          Effect.onInterrupt(() =>
            Effect.sync(() => {
              for (const b of batch) b.resume(SHUT_DOWN)
            })
          )
        )
        if (Exit.isSuccess(result)) {
          const applied = new Set(result.value.map((r) => r.lease_token))
          for (const b of batch) b.resume(applied.has(b.item.token) ? APPLIED : NOT_APPLIED)
        } else {
          const error = Effect.fail(
            Option.getOrElse(Cause.failureOption(result.cause), () =>
              new StoreError({ op: "delivery.settle", code: "defect" }))
          )
          for (const b of batch) {
            b.resume(error)
          }
        }
      }
    })
    for (let i = 0; i < SETTLE_FLUSHERS; i++) {
      yield* Effect.forkScoped(flusher)
    }
    // settles still queued when the store's scope closes are answered, not left waiting; so is any
    // settle queued after (no flusher would take it)
    yield* Effect.addFinalizer(() =>
      Effect.sync(() => {
        closed = true
        const left = queue.splice(0, queue.length)
        for (const b of left) {
          b.resume(SHUT_DOWN)
        }
      })
    )

    const settle: SettleOne<I> = (item) =>
      Effect.async<boolean, StoreError>((resume) => {
        if (closed) {
          return resume(SHUT_DOWN)
        }
        queue.push({ item, resume })
        work.unsafeOffer(undefined)
      })
    return settle
  })
