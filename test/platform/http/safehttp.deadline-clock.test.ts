/**
 * The transport's overall deadline (SPEC §4.6: `timeoutMs` bounds the whole exchange) against two
 * things outside the request: the system clock and the process itself.
 * - A step of the wall clock during a request changes nothing: deadlines run on the Clock's
 *   monotonic time (before, a clock stepped back by a minute kept a hanging request alive a minute).
 * - A process stalled past a request's deadline while the answer arrived (a long pause, a starved
 *   CPU) settles with that answer, not as a timeout: the I/O already waiting is read before the
 *   deadline is enforced (before, the answered request was counted as a timeout and sent again).
 *   The receiver runs in a child process (the stall stops this one), and the stall lasts until the
 *   child has written its answer and the deadline has passed, so the order is fixed, not timed.
 */
import { describe, expect, it } from "@effect/vitest"
import { Clock, Context, Deferred, Effect, Fiber, Layer, Queue } from "effect"
import { spawn } from "node:child_process"
import { existsSync, mkdtempSync, rmSync } from "node:fs"
import type * as Http from "node:http"
import { tmpdir } from "node:os"
import * as Path from "node:path"
import { SafeHttp } from "../../../src/services/platform/http/SafeHttp.js"
import { DEV, post, startServer } from "./safehttp-support.js"

/** The transport for the rest of the test's scope. */
const transport = Effect.map(Layer.build(SafeHttp.layerDefault(DEV)), (ctx) => Context.get(ctx, SafeHttp))

/** A Clock whose wall time (millis) is stepped back by `step` ms once `stepped` holds; its monotonic time is the real one. */
const steppingClock = (real: Clock.Clock, stepped: () => boolean, step: number): Clock.Clock => {
  const wall = () => real.unsafeCurrentTimeMillis() - (stepped() ? step : 0)
  return {
    [Clock.ClockTypeId]: Clock.ClockTypeId,
    unsafeCurrentTimeMillis: wall,
    currentTimeMillis: Effect.sync(wall),
    unsafeCurrentTimeNanos: () => real.unsafeCurrentTimeNanos(),
    currentTimeNanos: real.currentTimeNanos,
    sleep: (d) => real.sleep(d)
  }
}

/**
 * Stall this process from a check-phase callback (so the timers that fell due meanwhile run first
 * at the next turn of the event loop, before its I/O is polled) until `done` holds, at most 20 s.
 */
const stall = (done: () => boolean) =>
  Effect.async<void>((resume) => {
    setImmediate(() => {
      const limit = Date.now() + 20_000
      while (Date.now() < limit && !done()) {
        // busy: this is the stall
      }
      resume(Effect.void)
    })
  })

/**
 * A receiver in a child process: answers 200 after `delayMs`, then creates `marker`; prints its
 * port, then a line for every request it has read (`received` takes one of them).
 */
const childReceiver = (delayMs: number, marker: string) =>
  Effect.acquireRelease(
    Effect.gen(function*() {
      const received = yield* Queue.unbounded<void>()
      return yield* Effect.async<
        { readonly port: number; readonly received: Effect.Effect<void>; readonly kill: () => void },
        Error
      >((resume) => {
        const source = `
        const http = require("node:http"); const fs = require("node:fs")
        const server = http.createServer((req, res) => {
          req.resume()
          req.on("end", () => {
            process.stdout.write("received\\n")
            setTimeout(() => res.end("ok", () => fs.writeFileSync(${JSON.stringify(marker)}, "")), ${delayMs})
          })
        })
        server.listen(0, "127.0.0.1", () => process.stdout.write(String(server.address().port) + "\\n"))`
        const child = spawn(process.execPath, ["-e", source], { stdio: ["ignore", "pipe", "inherit"] })
        let out = ""
        let port: number | undefined
        child.stdout.on("data", (chunk: Buffer) => {
          out += chunk.toString("utf8")
          let nl = out.indexOf("\n")
          while (nl >= 0) {
            const line = out.slice(0, nl).trim()
            out = out.slice(nl + 1)
            nl = out.indexOf("\n")
            if (port === undefined) {
              port = Number(line)
              resume(Effect.succeed({ port, received: Queue.take(received), kill: () => child.kill("SIGKILL") }))
            } else if (line === "received") {
              Queue.unsafeOffer(received, undefined)
            }
          }
        })
        child.on("error", (e) => resume(Effect.fail(e)))
      })
    }),
    (c) => Effect.sync(c.kill)
  )

describe("SafeHttp deadlines: the wall clock and a stalled process", () => {
  it.scopedLive("a wall clock stepped back a minute during a request does not keep it alive past its timeout", () =>
    Effect.gen(function*() {
      const arrived = yield* Deferred.make<void>()
      // the server never answers; the clock steps back once the request has arrived
      const server = yield* startServer((_req) => {
        Deferred.unsafeDone(arrived, Effect.void)
      })
      const real = yield* Effect.clock
      let stepped = false
      const clock = steppingClock(real, () => stepped, 60_000)
      const request = yield* Effect.flatMap(
        SafeHttp,
        (http) => http.request(post(`http://127.0.0.1:${server.port}/hang`, { timeoutMs: 300 }))
      ).pipe(Effect.provide(SafeHttp.layerDefault(DEV)), Effect.withClock(clock), Effect.either, Effect.fork)
      yield* Deferred.await(arrived)
      stepped = true
      const outcome = yield* Fiber.join(request).pipe(Effect.timeout("10 seconds"), Effect.option)
      expect(outcome._tag, "the request was still in progress 10 s after its 300 ms timeout").toBe("Some")
      if (outcome._tag === "Some") {
        expect(outcome.value._tag).toBe("Left")
        if (outcome.value._tag === "Left") expect(outcome.value.left.kind).toBe("timeout")
      }
    }))

  it.scopedLive("an answer that arrived while the process was stalled past the deadline settles the request", () =>
    Effect.gen(function*() {
      const dir = mkdtempSync(Path.join(tmpdir(), "firehook-stall-"))
      yield* Effect.addFinalizer(() => Effect.sync(() => rmSync(dir, { recursive: true, force: true })))
      const marker = Path.join(dir, "answered")
      const child = yield* childReceiver(100, marker)
      // a warm-up request: the connection and the child's first answer are not part of the test
      const http = yield* transport
      expect((yield* http.request(post(`http://127.0.0.1:${child.port}/warm`))).status).toBe(200)
      yield* child.received
      rmSync(marker, { force: true })
      const started = Date.now()
      const request = yield* Effect.fork(
        Effect.either(http.request(post(`http://127.0.0.1:${child.port}/stalled`, { timeoutMs: 400 })))
      )
      // once the child has read the request, stall this process until the child has answered and
      // the deadline has passed
      yield* child.received
      yield* stall(() => existsSync(marker) && Date.now() > started + 600)
      expect(existsSync(marker), "the child answered during the stall").toBe(true)
      const outcome = yield* Fiber.join(request)
      expect(outcome._tag === "Right" ? outcome.right.status : outcome.left.kind).toBe(200)
    }))

  it.scopedLive("a request with no answer still times out after a stall (the I/O turn adds no grace)", () =>
    Effect.gen(function*() {
      // the server holds the request, and answers 500 ms after the stall ended: a request still
      // waiting then (a grace after the stall) would settle with 200 instead of timing out
      const arrived = yield* Deferred.make<Http.ServerResponse>()
      const server = yield* startServer((_req, res) => {
        Deferred.unsafeDone(arrived, Effect.succeed(res))
      })
      const http = yield* transport
      const request = yield* Effect.fork(
        Effect.either(http.request(post(`http://127.0.0.1:${server.port}/silent`, { timeoutMs: 300 })))
      )
      const res = yield* Deferred.await(arrived)
      const stallUntil = Date.now() + 600
      yield* stall(() => Date.now() >= stallUntil)
      const answer = setTimeout(() => res.end("late"), 500)
      yield* Effect.addFinalizer(() => Effect.sync(() => clearTimeout(answer)))
      const outcome = yield* Fiber.join(request).pipe(Effect.timeout("5 seconds"))
      expect(outcome._tag === "Left" ? outcome.left.kind : outcome.right.status).toBe("timeout")
    }))
})
