/**
 * Poll `cond` every 25 ms until it holds, at most `timeoutMs` (default 10 s), else die with
 * `never happened: <what>`: waits for real sockets and PostgreSQL; asserts nothing about time.
 */
import { Effect } from "effect"

export const eventually = <E, R>(cond: Effect.Effect<boolean, E, R>, what: string, timeoutMs = 10_000) =>
  Effect.gen(function*() {
    for (let waited = 0; waited < timeoutMs; waited += 25) {
      if (yield* cond) return
      yield* Effect.sleep("25 millis")
    }
    return yield* Effect.dieMessage(`never happened: ${what}`)
  })
