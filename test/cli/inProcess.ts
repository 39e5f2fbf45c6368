/**
 * A command of the CLI run in-process (through @effect/cli, as `src/cli/main.ts` runs it), its
 * failure described as `main.ts` describes it (code 2 for invalid arguments, 1 for an operation
 * that could not be done), with what it writes to stdout and stderr captured. Faster than
 * spawning the CLI (test/cli/cli.test.ts does that), for options' checks and outputs.
 */
import { type CliApp, Command } from "@effect/cli"
import * as NodeContext from "@effect/platform-node/NodeContext"
import { ConfigProvider, Effect, Exit } from "effect"
import { vi } from "vitest"
import { describeFailure } from "../../src/cli/Failure.js"

export interface InProcessRun {
  readonly code: number
  readonly line: string
  readonly stdout: string
  readonly stderr: string
}

/** Text of a chunk given to `write`. */
const text = (chunk: unknown): string => typeof chunk === "string" ? chunk : Buffer.from(chunk as Uint8Array).toString()

/** `firehook <args>` of `command`, with `config` as its whole environment (Effect's Config). */
export const runInProcess = <Name extends string, E, A>(
  command: Command.Command<Name, CliApp.CliApp.Environment, E, A>,
  args: ReadonlyArray<string>,
  config: Readonly<Record<string, string>>
): Effect.Effect<InProcessRun> =>
  Effect.acquireUseRelease(
    Effect.sync(() => {
      const stdout: Array<string> = []
      const stderr: Array<string> = []
      const out = vi.spyOn(process.stdout, "write").mockImplementation((chunk: unknown) => {
        stdout.push(text(chunk))
        return true
      })
      const err = vi.spyOn(process.stderr, "write").mockImplementation((chunk: unknown) => {
        stderr.push(text(chunk))
        return true
      })
      return { stdout, stderr, restore: () => [out, err].forEach((s) => s.mockRestore()) }
    }),
    (captured) =>
      Command.run(command, { name: "firehook", version: "0" })(["bun", "firehook", ...args]).pipe(
        Effect.provide(NodeContext.layer),
        Effect.withConfigProvider(ConfigProvider.fromMap(new Map(Object.entries(config)))),
        Effect.exit,
        Effect.map((exit) => {
          const { code, line } = Exit.isSuccess(exit) ? { code: 0, line: "" } : describeFailure(exit.cause)
          return { code, line, stdout: captured.stdout.join(""), stderr: captured.stderr.join("") }
        })
      ),
    (captured) => Effect.sync(captured.restore)
  )
