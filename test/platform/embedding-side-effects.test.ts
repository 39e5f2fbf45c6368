/**
 * Embedding leaves the host process as it found it: importing `src/index.ts`, building
 * `App.service` on `App.core` (every role, with the owners' API and a Redis publisher) and closing
 * the program's scope neither installs process listeners (signals, `uncaughtException`,
 * `unhandledRejection`, `warning`, `exit`), nor writes the environment, nor sets `exitCode` /
 * `noDeprecation`, nor replaces `fetch`; and once the scope is closed every socket, server, timer
 * and child process it opened is gone (the `pg` pool's sockets finish closing just after its
 * `end()` resolves: bounded polling), so the host can exit on its own.
 *
 * Nothing from `src` is imported statically: the snapshot is taken before the library loads.
 */
import { Effect, Exit, Layer, Option, Redacted, Schedule, Scope, Stream } from "effect"
import { createServer } from "node:http"
import { describe, expect, it } from "vitest"

const EVENTS = [
  "SIGINT",
  "SIGTERM",
  "SIGHUP",
  "uncaughtException",
  "unhandledRejection",
  "warning",
  "exit",
  "beforeExit"
] as const

const globals = () => ({
  listeners: Object.fromEntries(EVENTS.map((e) => [e, process.listenerCount(e)])),
  env: { ...process.env },
  exitCode: process.exitCode,
  noDeprecation: Reflect.get(process, "noDeprecation") as unknown,
  fetch: globalThis.fetch,
  // Effect's runtime keeps its own globals (`effect/…`) once any fiber has run: the host's too
  globalKeys: Object.keys(globalThis).filter((k) => !k.startsWith("effect/")).sort()
})

/** Active resources by type (`process.getActiveResourcesInfo`). */
const resources = (): Record<string, number> => {
  const counts: Record<string, number> = {}
  for (const r of process.getActiveResourcesInfo()) counts[r] = (counts[r] ?? 0) + 1
  return counts
}

/** The resource types whose count grew since `before`. */
const grown = (before: Record<string, number>): Record<string, number> =>
  Object.fromEntries(
    Object.entries(resources()).filter(([k, n]) => n > (before[k] ?? 0)).map(([k, n]) => [k, n - (before[k] ?? 0)])
  )

describe("embedding: no process-wide side effects, nothing left open", () => {
  it("import, build every role, close: globals unchanged and every resource released", async () => {
    const before = globals()
    // the host's stdio handles open lazily on first use (the logger's first line; stdin: the
    // terminal service of @effect/platform-node's NodeHttpServer.layer, the host's choice): open them now
    expect([typeof process.stdin.fd, process.stdout.writable, process.stderr.writable]).toEqual(["number", true, true])
    const resourcesBefore = resources()
    const { App, Lifecycle } = await import("../../src/index.js")
    const { NodeHttpServer } = await import("@effect/platform-node")
    const Db = await import("../support/db.js")
    const { testConfig } = await import("../support/stack.js")
    expect(globals()).toEqual(before)

    const program = Effect.gen(function*() {
      const { url } = yield* Db.freshDatabase
      const config = testConfig({
        DATABASE_URL: Redacted.value(url),
        HEALTH_PORT: "0",
        API_PORT: "0",
        WEBHOOK_ALLOW_INSECURE_DEV: "1",
        JETSTREAM_URL: "ws://127.0.0.1:9/subscribe",
        PLC_DIRECTORY_URL: "http://127.0.0.1:9",
        REDIS_URL: "redis://127.0.0.1:6379",
        SHUTDOWN_TIMEOUT_MS: "5000"
      })
      const health = NodeHttpServer.layer(createServer, { host: "127.0.0.1", port: 0 })
      const api = NodeHttpServer.layer(createServer, { host: "127.0.0.1", port: 0 })
      const scope = yield* Scope.make()
      const context = yield* Layer.buildWithScope(
        App.service(health, { api }).pipe(Layer.provideMerge(App.core(config))),
        scope
      )
      const lifecycle = yield* Effect.provide(Lifecycle.Lifecycle, context)
      // the initial backfill done: every part started
      yield* lifecycle.phases.changes.pipe(
        Stream.takeUntil((p) => p === "live"),
        Stream.runDrain,
        Effect.timeout("30 seconds")
      )
      expect(globals()).toEqual(before)
      yield* Scope.close(scope, Exit.void)
      expect(yield* lifecycle.report).toEqual(Option.some({ clean: true, unclean: [] }))
      expect(globals()).toEqual(before)
      // checked before the test database is dropped (its FORCE would end any connection left open);
      // sockets already ended close within a few event-loop turns (bounded polling: 5 s)
      const left = yield* Effect.suspend(() => {
        const g = grown(resourcesBefore)
        return Object.keys(g).length === 0 ? Effect.succeed(g) : Effect.fail(g)
      }).pipe(Effect.retry({ schedule: Schedule.spaced("50 millis"), times: 100 }), Effect.merge)
      expect(left).toEqual({})
    }).pipe(Effect.scoped)
    await Effect.runPromise(program)
    expect(globals()).toEqual(before)
  }, 60_000)
})
