/**
 * The late failure marks (FailureMarks.ts) keep the newer scan's mark of an owner: with the
 * database down, a scan (token 1) superseded by a newer one (token 2) may end after it and defer
 * its own mark. Written, the older mark is fenced (a no-op) and the owner would stay `scanning`
 * until the stale-scan check; so the mark of the higher token waits, whichever came last.
 */
import { describe, expect, it } from "@effect/vitest"
import { Duration, Effect, Random, TestClock } from "effect"
import { StoreError } from "../../src/services/platform/Persistence.js"
import * as FailureMarks from "../../src/services/reconciliation/FailureMarks.js"
import { fakeReconcileStore } from "../support/fakeReconcileStore.js"
import { settle } from "../support/settle.js"
import { plc } from "../support/stack.js"

/** A store whose marks fail while `down.value`; `written` holds the marks it took. */
const world = () => {
  const down = { value: true }
  const written: Array<readonly [string, number, string]> = []
  const store = fakeReconcileStore({
    markFailed: (did, token, kind) =>
      Effect.suspend(() => {
        if (down.value) return Effect.fail(new StoreError({ op: "test", code: "57P01" }))
        written.push([did, token, kind])
        return Effect.succeed(true)
      })
  })
  return { down, written, store }
}

const options = { baseMs: 1_000, capMs: 1_000, giveUpAfterMs: 60_000, maxPending: 4 }

describe("FailureMarks: the newer scan's mark waits", () => {
  it.scoped("an older scan's mark deferred after a newer scan's does not replace it", () => {
    const w = world()
    const A = plc(11)
    return Effect.gen(function*() {
      const marks = yield* FailureMarks.make(w.store, options)
      // T2 (token 2) superseded T1 and failed first; T1 ends afterwards, the database still down
      yield* marks.defer(A, 2, "database_error")
      yield* settle
      yield* marks.defer(A, 1, "interrupted")
      yield* settle
      expect(yield* marks.pending).toBe(1)
      w.down.value = false
      yield* TestClock.adjust(Duration.seconds(2))
      yield* settle
      // the newer scan's mark is the one written: the owner leaves `scanning`
      expect(w.written).toEqual([[A, 2, "database_error"]])
      expect(yield* marks.pending).toBe(0)
    }).pipe(Effect.withRandom(Random.fixed([0.5])))
  })

  it.scoped("once the newer mark is written, a later scan's mark of the owner waits again", () => {
    const w = world()
    const A = plc(12)
    return Effect.gen(function*() {
      const marks = yield* FailureMarks.make(w.store, options)
      yield* marks.defer(A, 2, "database_error")
      yield* marks.defer(A, 1, "interrupted")
      w.down.value = false
      yield* TestClock.adjust(Duration.seconds(2))
      yield* settle
      expect(w.written).toEqual([[A, 2, "database_error"]])
      // a same-token mark (the same scan) and a newer scan's still replace the waiting one
      w.down.value = true
      yield* marks.defer(A, 3, "interrupted")
      yield* marks.defer(A, 3, "database_error")
      yield* marks.defer(A, 4, "internal")
      yield* settle
      expect(yield* marks.pending).toBe(1)
      w.down.value = false
      yield* TestClock.adjust(Duration.seconds(2))
      yield* settle
      expect(w.written).toEqual([[A, 2, "database_error"], [A, 4, "internal"]])
    }).pipe(Effect.withRandom(Random.fixed([0.5])))
  })
})
