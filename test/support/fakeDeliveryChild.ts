/**
 * A fake spawner for the delivery child's supervisor (`DeliveryProcess.supervise`), for tests under
 * TestClock: each spawn records a child (pid `firstPid`, `firstPid + 1`, …) whose exit the test
 * decides (`crash`), which answers SIGKILL by dying of it and SIGTERM as `state.onSigterm` says
 * (exit 0 by default), prints `state.lastError` as its last stderr line, answers the health look
 * with the `answer` Ref, and renders a metrics counter whose value is its pid when `metrics` is set
 * (else no metrics).
 */
import { Deferred, Effect, Option, Ref } from "effect"
import type * as ChildProcess from "../../src/services/platform/ChildProcess.js"
import type * as DeliveryProcess from "../../src/services/platform/DeliveryProcess.js"

export type OnSigterm = "exit0" | "exit1" | "ignore"

export interface FakeChild {
  readonly pid: number
  readonly exit: Deferred.Deferred<ChildProcess.ChildExit>
  readonly signals: Array<string>
}

export interface FakeSpawnerOptions {
  /** the pid of the first child */
  readonly firstPid: number
  /** what the health look answers at first */
  readonly answer: Option.Option<DeliveryProcess.HealthAnswer>
  /** whether the children render a metrics counter (`fake_child_total <pid>`) */
  readonly metrics: boolean
}

export const makeFakeSpawner = (options: FakeSpawnerOptions) =>
  Effect.gen(function*() {
    const children: Array<FakeChild> = []
    const answer = yield* Ref.make<Option.Option<DeliveryProcess.HealthAnswer>>(options.answer)
    /** what a child does on SIGTERM, and the one-line error the children print before they exit */
    const state: { onSigterm: OnSigterm; lastError: string } = { onSigterm: "exit0", lastError: "firehook: boom" }
    const spawner: DeliveryProcess.Spawner = {
      spawn: Effect.gen(function*() {
        const child: FakeChild = {
          pid: options.firstPid + children.length,
          exit: yield* Deferred.make<ChildProcess.ChildExit>(),
          signals: []
        }
        children.push(child)
        const handle: ChildProcess.ChildHandle = {
          pid: child.pid,
          exit: Deferred.await(child.exit),
          kill: (signal) =>
            Effect.gen(function*() {
              child.signals.push(signal)
              if (signal === "SIGKILL") yield* Deferred.succeed(child.exit, { code: null, signal: "SIGKILL" })
              else if (state.onSigterm !== "ignore") {
                yield* Deferred.succeed(child.exit, { code: state.onSigterm === "exit0" ? 0 : 1, signal: null })
              }
            }),
          lastError: Effect.sync(() => Option.some(state.lastError))
        }
        // a counter whose value is the child's pid, as the child's own /metrics would render it
        const metrics = Effect.succeed(
          options.metrics
            ? Option.some(
              `# HELP fake_child_total the child\n# TYPE fake_child_total counter\nfake_child_total ${child.pid}\n`
            )
            : Option.none()
        )
        return { handle, health: Ref.get(answer), metrics }
      })
    }
    return {
      children,
      answer,
      spawner,
      state,
      crash: (i: number, code = 1) => Deferred.succeed(children[i]!.exit, { code, signal: null })
    }
  })
