/**
 * An embedding program after a shutdown that was not clean: firehook leaves its database pool open
 * (SPEC §6.3: the database may be what hung), but the pool's idle connections do not keep the
 * program alive (`allowExitOnIdle`); before 3 December 2026 (stop 30) they did, until their 60 s
 * idle timeout.
 */
import { describe, expect, it } from "@effect/vitest"
import { Effect, Redacted } from "effect"
import { spawn } from "node:child_process"
import * as Db from "../support/db.js"
import { BUN, ROOT } from "../support/proc.js"

/** Run the child on `url`: its stdout and exit code, or "running" if it still runs at `boundMs`. */
const runChild = (url: string, boundMs: number) =>
  Effect.async<{ readonly stdout: string; readonly exit: number | null | "running" }>((resume) => {
    const child = spawn(BUN, ["test/platform/unclean-exit-child.ts", url], {
      cwd: ROOT,
      stdio: ["ignore", "pipe", "inherit"]
    })
    let stdout = ""
    child.stdout.on("data", (d: Buffer) => (stdout += d.toString("utf8")))
    const bound = setTimeout(() => {
      child.kill("SIGKILL")
      resume(Effect.succeed({ stdout, exit: "running" }))
    }, boundMs)
    child.on("close", (code) => {
      clearTimeout(bound)
      resume(Effect.succeed({ stdout, exit: code }))
    })
  })

describe("Database pool after an unclean shutdown", () => {
  it.scopedLive("idle connections left open do not keep the process alive", () =>
    Effect.gen(function*() {
      const db = yield* Db.freshDatabase
      // the pool's idle timeout is 60 s: a process kept alive by it still runs at this bound
      const result = yield* runChild(Redacted.value(db.url), 30_000)
      expect(result.stdout).toBe("shutdown clean=false\nscope closed\n")
      expect(result.exit).toBe(0)
    }), { timeout: 60_000 })
})
