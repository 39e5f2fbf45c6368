/**
 * A LIVE embedded PostgreSQL that does not answer within 5 s (here frozen
 * with SIGSTOP: a stalled host, swap, or a postmaster still starting and not yet listening) has its
 * postmaster.pid kept by the next start on the same data directory (a replica sharing it): its pid
 * is a postgres, so it is taken for the server as before (the start then fails to use it, not to
 * own the data). Found by the review of stop 56's stale-lock-file change, which removed it:
 * PostgreSQL shuts down a server whose lock file is gone.
 */
import { Effect, Exit, Logger, Scope } from "effect"
import * as Fs from "node:fs"
import * as Os from "node:os"
import * as Path from "node:path"
import { afterAll, expect, it } from "vitest"
import * as EmbeddedPg from "../../src/services/platform/EmbeddedPg.js"

const STALE = "stale postmaster.pid (no server answers); starting the embedded PostgreSQL"
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

it("a live server's lock file is never removed by a second start", async () => {
  const options = { dataDir: tmp("fh-live-"), sharedDir: tmp("fh-live-shared-"), stopTimeout: "20 seconds" as const }
  const scope = await Effect.runPromise(Scope.make())
  const db = await Effect.runPromise(EmbeddedPg.start(options).pipe(Scope.extend(scope)))
  const pidFile = Path.join(db.pgDir, "postmaster.pid")
  const text = Fs.readFileSync(pidFile, "utf8")
  const pid = Number(text.split("\n")[0])
  const messages: Array<string> = []
  const layer = Logger.replace(
    Logger.defaultLogger,
    Logger.make(({ message }) => void messages.push(Array.isArray(message) ? message.join(" ") : String(message)))
  )
  process.kill(pid, "SIGSTOP")
  let stillThere = false
  try {
    const exit = await Effect.runPromiseExit(
      Effect.scoped(EmbeddedPg.start(options).pipe(Effect.provide(layer), Effect.timeout("60 seconds")))
    )
    stillThere = Fs.existsSync(pidFile) && Fs.readFileSync(pidFile, "utf8") === text
    // taken for the server: the start fails on the frozen server, it never starts a second one
    expect(Exit.isSuccess(exit)).toBe(false)
  } finally {
    process.kill(pid, "SIGCONT")
    await Effect.runPromise(Scope.close(scope, Exit.void))
  }
  // the live server's lock file is kept, and it is not taken for a crash's
  expect(stillThere).toBe(true)
  expect(messages).not.toContain(STALE)
}, 180_000)
