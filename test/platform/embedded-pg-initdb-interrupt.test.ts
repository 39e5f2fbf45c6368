/**
 * An interrupted `initdb` (a Ctrl-C during a first start) is stopped and waited for: its
 * interruption ends only once the process has exited (SIGTERM; SIGKILL after
 * INITDB_STOP_TIMEOUT when it does not end). Before, the SIGTERM was sent and not waited for:
 * firehook exited while `initdb` still ran (it removes its half-made data directory on the way
 * out), and a start right after could find `PG_VERSION` and run a half-made cluster. A stand-in
 * `initdb` (a shell script) records when it started and when its SIGTERM handler finished.
 */
import { describe, expect, it } from "@effect/vitest"
import { Duration, Effect, Fiber, TestClock, TestServices } from "effect"
import * as Fs from "node:fs"
import * as Os from "node:os"
import * as Path from "node:path"
import { INITDB_STOP_TIMEOUT, runInitdb } from "../../src/services/platform/EmbeddedPgProcess.js"

/** A bin dir whose `bin/initdb` marks `started` in its --pgdata, then waits; `onTerm`: its SIGTERM trap. */
const fakeInitdb = (onTerm: string) =>
  Effect.acquireRelease(
    Effect.sync(() => {
      const root = Fs.mkdtempSync(Path.join(Os.tmpdir(), "firehook-initdb-"))
      Fs.mkdirSync(Path.join(root, "bin"))
      const script = Path.join(root, "bin", "initdb")
      Fs.writeFileSync(
        script,
        `#!/bin/sh
for a; do case "$a" in --pgdata=*) D="\${a#--pgdata=}";; esac; done
trap '${onTerm}' TERM
mkdir -p "$D" && : > "$D/started"
i=0
while [ $i -lt 1200 ]; do sleep 0.05; i=$((i+1)); done
`
      )
      Fs.chmodSync(script, 0o755)
      return { root, pgDir: Path.join(root, "data") }
    }),
    ({ root }) => Effect.sync(() => Fs.rmSync(root, { recursive: true, force: true }))
  )

/** until `file` exists (the live clock: waits for the child process only) */
const whenExists = (file: string) =>
  Effect.gen(function*() {
    for (let i = 0; i < 400 && !Fs.existsSync(file); i++) yield* TestServices.provideLive(Effect.sleep("25 millis"))
    expect(Fs.existsSync(file)).toBe(true)
  })

describe("an interrupted initdb", () => {
  it.scoped("is waited for: the interruption ends after initdb's own SIGTERM handling has finished", () =>
    Effect.gen(function*() {
      // like initdb's: clean up (here: take a while, then leave a mark), then exit
      const { root, pgDir } = yield* fakeInitdb(`sleep 0.3; : > "$D/cleaned"; exit 1`)
      const fiber = yield* Effect.fork(runInitdb(root, pgDir, "/dev/null", undefined))
      yield* whenExists(Path.join(pgDir, "started"))
      yield* Fiber.interrupt(fiber)
      expect(Fs.existsSync(Path.join(pgDir, "cleaned"))).toBe(true)
    }))

  it.scoped("one that ignores SIGTERM is killed after INITDB_STOP_TIMEOUT, and that end waited for", () =>
    Effect.gen(function*() {
      const { root, pgDir } = yield* fakeInitdb("")
      const fiber = yield* Effect.fork(runInitdb(root, pgDir, "/dev/null", undefined))
      yield* whenExists(Path.join(pgDir, "started"))
      const interrupting = yield* Effect.fork(Fiber.interrupt(fiber))
      // SIGTERM sent, its bound waited for on the TestClock
      for (let i = 0; i < 400 && (yield* TestClock.sleeps()).length === 0; i++) {
        yield* TestServices.provideLive(Effect.sleep("25 millis"))
      }
      // ignored: still waiting just before the bound; killed at it, and the interruption ends
      yield* TestClock.adjust(Duration.toMillis(INITDB_STOP_TIMEOUT) - 1)
      expect(interrupting.unsafePoll()).toBeNull()
      expect(Fs.existsSync(Path.join(pgDir, "started"))).toBe(true)
      yield* TestClock.adjust(1)
      yield* Fiber.join(interrupting).pipe(Effect.timeout("5 seconds"), TestServices.provideLive)
    }))
})
