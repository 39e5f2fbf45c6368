/**
 * The embedded PostgreSQL dying under the running service (killed, out of disk): the process that
 * started it is told once, with a one-line cause (the service then stops with exit 1, src/main.ts);
 * a stop by the scope's own close is not reported. Before the audit of 6 December 2026 nothing
 * noticed: the service logged refused connections for good and `/live` stayed 200.
 */
import { Deferred, Effect, Exit, Scope } from "effect"
import * as Fs from "node:fs"
import * as Os from "node:os"
import * as Path from "node:path"
import { afterAll, describe, expect, it } from "vitest"
import * as EmbeddedPg from "../../src/services/platform/EmbeddedPg.js"

const dirs: Array<string> = []
const tmp = (prefix: string) => {
  const d = Fs.mkdtempSync(Path.join(Os.tmpdir(), prefix))
  Fs.chmodSync(d, 0o755)
  dirs.push(d)
  return d
}
afterAll(() => {
  for (const d of dirs) Fs.rmSync(d, { recursive: true, force: true })
})

const serverPid = (pgDir: string) => Number(Fs.readFileSync(Path.join(pgDir, "postmaster.pid"), "utf8").split("\n")[0])

describe("the embedded PostgreSQL exits under the service", () => {
  it("is reported once with its cause when it dies; a stop by the scope's close is not", async () => {
    const options = { dataDir: Path.join(tmp("firehook-exit-"), "data"), sharedDir: tmp("firehook-exit-shared-") }
    const reported: Array<string> = []
    const onUnexpectedExit = (line: string) => Effect.sync(() => void reported.push(line))

    // started and stopped by its scope: nothing reported
    await Effect.runPromise(Effect.scoped(Effect.asVoid(EmbeddedPg.start({ ...options, onUnexpectedExit }))))
    expect(reported).toEqual([])

    // started again, then killed under it
    const scope = Effect.runSync(Scope.make())
    try {
      const died = Effect.runSync(Deferred.make<string>())
      const db = await Effect.runPromise(
        EmbeddedPg.start({
          ...options,
          onUnexpectedExit: (line) => Effect.zipRight(onUnexpectedExit(line), Deferred.succeed(died, line))
        }).pipe(Scope.extend(scope))
      )
      expect(db.owned).toBe(true)
      process.kill(serverPid(db.pgDir), "SIGKILL")
      const line = await Effect.runPromise(
        Deferred.await(died).pipe(Effect.timeoutFail({ duration: "20 seconds", onTimeout: () => "not reported" }))
      )
      expect(line).toMatch(/^embedded PostgreSQL exited unexpectedly \(SIGKILL: .+\)$/)
      expect(reported).toHaveLength(1)
    } finally {
      await Effect.runPromise(Scope.close(scope, Exit.void))
    }
    expect(reported).toHaveLength(1)
  }, 180_000)
})
