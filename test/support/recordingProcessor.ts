/**
 * A Processor stand-in for the intake tests: it records the batches it commits, and can be held
 * shut (`gate`) or made to fail its next `failures` calls.
 */
import { Deferred, Effect, Layer } from "effect"
import type { StreamEvent } from "../../src/schemas/RecordEvent.js"
import { Processor, type ProcessorShape } from "../../src/services/matching/Processor.js"
import { StoreError } from "../../src/services/platform/Persistence.js"

export interface Recorder {
  readonly batches: Array<ReadonlyArray<StreamEvent>>
  gate: Deferred.Deferred<void> | undefined
  failures: number
  calls: number
}

export const newRecorder = (): Recorder => ({ batches: [], gate: undefined, failures: 0, calls: 0 })

export const recordingProcessor = (rec: Recorder) =>
  Layer.succeed(
    Processor,
    {
      processEvents: (batch, options) =>
        Effect.gen(function*() {
          rec.calls++
          if (rec.gate !== undefined) yield* Deferred.await(rec.gate)
          if (rec.failures > 0) {
            rec.failures--
            return yield* Effect.fail(new StoreError({ op: "test", code: "XX000" }))
          }
          if (options.finalize !== undefined) yield* options.finalize
          rec.batches.push(batch)
          return { outcomes: [], inserted: 0, duplicates: 0, quarantined: 0 }
        }),
      reload: Effect.void,
      stats: Effect.succeed({ tooComplex: 0, priorRefsRefused: 0, priorRefKeys: 0, priorRefIndexComplete: true })
    } satisfies ProcessorShape
  )
