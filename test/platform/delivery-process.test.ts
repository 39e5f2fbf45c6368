/**
 * The delivery child's supervisor (issue 16 item 2) with a fake spawner under TestClock: the
 * restart policy (backoff, window, give-up), the shutdown drain (SIGTERM, exit code, SIGKILL at
 * the deadline), a child that stops on its own during the parent's shutdown, and the health
 * sections. The real process side (`ChildProcess.spawn`) with a real `node` child.
 */
import { describe, expect, it } from "@effect/vitest"
import { ConfigProvider, Deferred, Duration, Effect, Either, Exit, Fiber, Option, Ref, Scope, TestClock } from "effect"
import * as Http from "node:http"
import * as ChildProcess from "../../src/services/platform/ChildProcess.js"
import * as DeliveryChild from "../../src/services/platform/DeliveryChild.js"
import * as DeliveryProcess from "../../src/services/platform/DeliveryProcess.js"
import * as DeliveryProcessConfig from "../../src/services/platform/DeliveryProcessConfig.js"
import * as Health from "../../src/services/platform/Health.js"
import * as Lifecycle from "../../src/services/platform/Lifecycle.js"
import * as RolesConfig from "../../src/services/platform/RolesConfig.js"
import { makeFakeSpawner } from "../support/fakeDeliveryChild.js"
import { settle } from "../support/settle.js"

const READY: DeliveryProcess.HealthAnswer = {
  ready: true,
  sections: { delivery: { pending: 3, leased: 1 }, redis: { configured: false } }
}

const makeFake = makeFakeSpawner({ firstPid: 1000, answer: Option.some(READY), metrics: true })

const setup = (pollInterval: Duration.DurationInput = "1 second") =>
  Effect.gen(function*() {
    const lifecycle = yield* Lifecycle.make({ shutdownTimeout: "10 seconds" })
    const health = yield* Health.makeWith({}).pipe(Effect.provideService(Lifecycle.Lifecycle, lifecycle))
    const gaveUp = yield* Deferred.make<string>()
    const fake = yield* makeFake
    yield* DeliveryProcess.supervise({
      spawner: fake.spawner,
      pollInterval,
      onGiveUp: (line) => Effect.asVoid(Deferred.succeed(gaveUp, line))
    }).pipe(
      Effect.provideService(Lifecycle.Lifecycle, lifecycle),
      Effect.provideService(Health.Health, health)
    )
    yield* lifecycle.setPhase("live")
    yield* settle
    const section = Effect.map(health.report, (r) => r.body["deliveryProcess"])
    return { lifecycle, health, gaveUp, fake, section }
  })

describe("DeliveryProcessConfig", () => {
  const load = (env: Record<string, string>) =>
    Effect.runSync(
      DeliveryProcessConfig.load.pipe(
        Effect.withConfigProvider(ConfigProvider.fromMap(new Map(Object.entries(env)))),
        Effect.either
      )
    )
  const all = RolesConfig.ROLES

  it("DELIVERY_PROCESS: auto by default; inline, child; anything else is a startup error", () => {
    expect(load({})).toEqual(Either.right({ mode: "auto", isChild: false }))
    expect(load({ DELIVERY_PROCESS: "inline", FIREHOOK_DELIVERY_CHILD: "1" })).toEqual(
      Either.right({ mode: "inline", isChild: true })
    )
    const bad = load({ DELIVERY_PROCESS: "worker" })
    expect(Either.isLeft(bad) && bad.left.message).toBe(
      "invalid configuration: DELIVERY_PROCESS must be one of auto, inline, child"
    )
  })

  it("auto: a child with ≥ 2 cores and delivery beside another role; never in a child or without delivery", () => {
    const auto = { mode: "auto", isChild: false } as const
    expect(DeliveryProcessConfig.runsChild(auto, all, 2)).toBe(true)
    expect(DeliveryProcessConfig.runsChild(auto, all, 1)).toBe(false)
    expect(DeliveryProcessConfig.runsChild(auto, ["intake", "delivery"], 8)).toBe(true)
    expect(DeliveryProcessConfig.runsChild(auto, ["delivery"], 8)).toBe(false)
    expect(DeliveryProcessConfig.runsChild(auto, ["intake", "api"], 8)).toBe(false)
    expect(DeliveryProcessConfig.runsChild({ mode: "child", isChild: false }, ["delivery"], 1)).toBe(true)
    expect(DeliveryProcessConfig.runsChild({ mode: "child", isChild: true }, all, 8)).toBe(false)
    expect(DeliveryProcessConfig.runsChild({ mode: "inline", isChild: false }, all, 8)).toBe(false)
  })

  it("the child's environment: delivery only, inline, the marker, loopback health, the parent's database", () => {
    expect(DeliveryChild.childEnv({ healthPort: 4567, databaseUrl: "postgresql://u@127.0.0.1:5/db" })).toEqual({
      FIREHOOK_ROLES: "delivery",
      DELIVERY_PROCESS: "inline",
      FIREHOOK_DELIVERY_CHILD: "1",
      HEALTH_HOST: "127.0.0.1",
      HEALTH_PORT: "4567",
      DATABASE_URL: "postgresql://u@127.0.0.1:5/db"
    })
  })
})

describe("DeliveryProcess.decide", () => {
  const policy = DeliveryProcess.defaultPolicy
  it("backs off 1, 2, 4, 8, 16 s and gives up at the sixth exit within 10 minutes", () => {
    let earlier: ReadonlyArray<number> = []
    const delays: Array<number> = []
    for (let i = 0; i < 5; i++) {
      const d = DeliveryProcess.decide(policy, earlier, 1_000_000 + i * 1000)
      if (d._tag !== "Restart") throw new Error("expected a restart")
      delays.push(d.delayMs)
      earlier = d.recent
    }
    expect(delays).toEqual([1000, 2000, 4000, 8000, 16000])
    expect(DeliveryProcess.decide(policy, earlier, 1_000_000 + 599_999)._tag).toBe("GiveUp")
  })

  it("a child that could not reach the database: 1, 2, 4 … 30 s by its exits in a row, never a give-up", () => {
    const earlier = [0, 1000, 2000, 3000, 4000]
    expect(DeliveryProcess.decideUnreachable(policy, earlier, 5000, 0)).toEqual(
      DeliveryProcess.Decision.Restart({ delayMs: 1000, recent: earlier })
    )
    expect(DeliveryProcess.decideUnreachable(policy, earlier, 600_500, 9)).toEqual(
      DeliveryProcess.Decision.Restart({ delayMs: 30000, recent: [1000, 2000, 3000, 4000] })
    )
  })

  it("forgets exits older than the window", () => {
    const earlier = [0, 1000, 2000, 3000, 4000]
    const d = DeliveryProcess.decide(policy, earlier, 600_500)
    expect(d).toEqual(DeliveryProcess.Decision.Restart({ delayMs: 16000, recent: [1000, 2000, 3000, 4000, 600_500] }))
    const later = DeliveryProcess.decide(policy, earlier, 700_000)
    expect(later).toEqual(DeliveryProcess.Decision.Restart({ delayMs: 1000, recent: [700_000] }))
  })
})

// SPEC §6.3 (shutdown: exit 0 only when every part stopped cleanly): a child that exits 0, or
// dies of SIGTERM or SIGINT (a Ctrl-C to the process group while it was still loading its modules,
// so it had started nothing), stopped cleanly; any other end leaves the shutdown unclean
describe("DeliveryProcess.stoppedCleanly", () => {
  it("exit 0, SIGTERM and SIGINT are clean; another code or signal is not", () => {
    expect(DeliveryProcess.stoppedCleanly({ code: 0, signal: null })).toBe(true)
    expect(DeliveryProcess.stoppedCleanly({ code: null, signal: "SIGTERM" })).toBe(true)
    expect(DeliveryProcess.stoppedCleanly({ code: null, signal: "SIGINT" })).toBe(true)
    expect(DeliveryProcess.stoppedCleanly({ code: 1, signal: null })).toBe(false)
    expect(DeliveryProcess.stoppedCleanly({ code: null, signal: "SIGKILL" })).toBe(false)
  })
})

describe("DeliveryProcess.supervise", () => {
  it.scoped("a crashed child is restarted after the backoff, not before; health shows the restarts", () =>
    Effect.gen(function*() {
      const { fake, section } = yield* setup()
      expect(fake.children).toHaveLength(1)
      expect(yield* section).toEqual({ mode: "child", state: "running", pid: "1000", restarts: 0 })
      yield* fake.crash(0)
      yield* settle
      expect(yield* section).toEqual({ mode: "child", state: "backoff", pid: null, restarts: 0 })
      yield* TestClock.adjust("999 millis")
      yield* settle
      expect(fake.children).toHaveLength(1)
      yield* TestClock.adjust("1 millis")
      yield* settle
      expect(fake.children).toHaveLength(2)
      yield* TestClock.adjust("1 second")
      expect(yield* section).toEqual({ mode: "child", state: "running", pid: "1001", restarts: 1 })
      // the second exit waits 2 s
      yield* fake.crash(1)
      yield* settle
      yield* TestClock.adjust("1999 millis")
      yield* settle
      expect(fake.children).toHaveLength(2)
      yield* TestClock.adjust("1 millis")
      yield* settle
      expect(fake.children).toHaveLength(3)
    }))

  it.scoped("the sixth exit within 10 minutes gives up with one line; nothing is started after it", () =>
    Effect.gen(function*() {
      const { fake, gaveUp, lifecycle, section } = yield* setup()
      for (const [i, delay] of [1000, 2000, 4000, 8000, 16000].entries()) {
        yield* fake.crash(i)
        yield* settle
        yield* TestClock.adjust(Duration.millis(delay))
        yield* settle
        expect(fake.children).toHaveLength(i + 2)
      }
      expect(yield* Deferred.isDone(gaveUp)).toBe(false)
      yield* fake.crash(5)
      yield* settle
      const line = yield* Deferred.await(gaveUp)
      expect(line).toBe(
        "the delivery process exited 6 times within 10 min; giving up (last: exit code 1: boom)"
      )
      expect(yield* section).toMatchObject({ state: "failed", restarts: 5 })
      yield* TestClock.adjust("1 hour")
      yield* settle
      expect(fake.children).toHaveLength(6)
      // the ordered shutdown has no child to stop
      expect(yield* lifecycle.shutdown).toEqual({ clean: true, unclean: [] })
    }))

  it.scoped("a child that cannot reach the database is restarted while the outage lasts, never given up on", () =>
    Effect.gen(function*() {
      const { fake, gaveUp, section } = yield* setup("1 hour")
      // killed during the outage (an OOM kill): an ordinary exit, the first of the window
      yield* fake.crash(0, 137)
      yield* settle
      yield* TestClock.adjust("1 second")
      yield* settle
      expect(fake.children).toHaveLength(2)
      // then every start finds the database unreachable, for 5 minutes
      fake.state.lastError = "firehook: database: could not connect (ECONNREFUSED)"
      const starts = 10
      for (let i = 0; i < starts; i++) {
        yield* fake.crash(i + 1)
        yield* settle
        expect(yield* Deferred.isDone(gaveUp)).toBe(false)
        // restarted within the 30 s cap (the exact delays: decideUnreachable)
        yield* TestClock.adjust("30 seconds")
        yield* settle
        expect(fake.children).toHaveLength(i + 3)
      }
      expect(yield* section).toMatchObject({ state: "running", restarts: starts + 1 })
      // the database is back; a later crash of another kind counts after the first one (2 s)
      fake.state.lastError = "firehook: boom"
      yield* fake.crash(starts + 1)
      yield* settle
      yield* TestClock.adjust("1999 millis")
      yield* settle
      expect(fake.children).toHaveLength(starts + 2)
      yield* TestClock.adjust("1 millis")
      yield* settle
      expect(fake.children).toHaveLength(starts + 3)
    }))

  it.scoped("exits spread over more than the window never give up", () =>
    Effect.gen(function*() {
      // (looks at health rarely: TestClock runs every sleep that falls within an adjustment)
      const { fake, gaveUp } = yield* setup("1 hour")
      for (let i = 0; i < 8; i++) {
        yield* fake.crash(i)
        yield* settle
        yield* TestClock.adjust("1 second")
        yield* settle
        expect(fake.children).toHaveLength(i + 2)
        yield* TestClock.adjust("10 minutes")
      }
      expect(yield* Deferred.isDone(gaveUp)).toBe(false)
    }))

  it.scoped("shutdown: SIGTERM to the child at the delivery stage; exit 0 is clean and nothing restarts", () =>
    Effect.gen(function*() {
      const { fake, lifecycle, section } = yield* setup()
      const report = yield* lifecycle.shutdown
      expect(report).toEqual({ clean: true, unclean: [] })
      expect(fake.children[0]!.signals).toEqual(["SIGTERM"])
      yield* TestClock.adjust("1 minute")
      yield* settle
      expect(fake.children).toHaveLength(1)
      expect(yield* section).toMatchObject({ state: "stopped", pid: null })
    }))

  it.scoped("shutdown: a child that exits 1 makes the shutdown unclean", () =>
    Effect.gen(function*() {
      const { fake, lifecycle } = yield* setup()
      fake.state.onSigterm = "exit1"
      expect(yield* lifecycle.shutdown).toEqual({ clean: false, unclean: ["delivery-process"] })
    }))

  it.scoped("shutdown: a child still running at the deadline gets SIGKILL; unclean", () =>
    Effect.gen(function*() {
      const { fake, lifecycle } = yield* setup()
      fake.state.onSigterm = "ignore"
      const shutdown = yield* Effect.fork(lifecycle.shutdown)
      yield* settle
      expect(fake.children[0]!.signals).toEqual(["SIGTERM"])
      yield* TestClock.adjust("10 seconds")
      const report = yield* Fiber.join(shutdown)
      expect(report).toEqual({ clean: false, unclean: ["delivery-process"] })
      expect(fake.children[0]!.signals).toEqual(["SIGTERM", "SIGKILL"])
    }))

  it.scoped("a child that stops on its own during the parent's shutdown (a process-group signal) is not restarted", () =>
    Effect.gen(function*() {
      const { fake, lifecycle } = yield* setup()
      // an earlier stage takes a while; meanwhile the child got the signal too and exited 0
      yield* lifecycle.registerStop(
        "intake-drain",
        "intake",
        fake.crash(0, 0).pipe(Effect.zipRight(Effect.sleep("2 seconds")))
      )
      const shutdown = yield* Effect.fork(lifecycle.shutdown)
      yield* settle
      yield* TestClock.adjust("2 seconds")
      expect(yield* Fiber.join(shutdown)).toEqual({ clean: true, unclean: [] })
      expect(fake.children).toHaveLength(1)
      expect(fake.children[0]!.signals).toEqual([])
    }))

  it.scoped("health: ready only once the child answers ready; unresponsive after 3 failed looks; mirrored sections", () =>
    Effect.gen(function*() {
      const lifecycle = yield* Lifecycle.make({ shutdownTimeout: "10 seconds" })
      const health = yield* Health.makeWith({}).pipe(Effect.provideService(Lifecycle.Lifecycle, lifecycle))
      const fake = yield* makeFake
      yield* Ref.set(fake.answer, Option.none())
      yield* DeliveryProcess.supervise({ spawner: fake.spawner, onGiveUp: () => Effect.void }).pipe(
        Effect.provideService(Lifecycle.Lifecycle, lifecycle),
        Effect.provideService(Health.Health, health)
      )
      yield* lifecycle.setPhase("live")
      yield* settle
      const report1 = yield* health.report
      expect(report1.ready).toBe(false)
      expect(report1.body["deliveryProcess"]).toMatchObject({ state: "starting" })
      expect(report1.body["delivery"]).toEqual({ stale: true })
      yield* Ref.set(fake.answer, Option.some(READY))
      yield* TestClock.adjust("1 second")
      const report2 = yield* health.report
      expect(report2.ready).toBe(true)
      expect(report2.body["delivery"]).toEqual({ pending: 3, leased: 1 })
      expect(report2.body["redis"]).toEqual({ configured: false })
      yield* Ref.set(fake.answer, Option.none())
      yield* TestClock.adjust("2 seconds")
      expect((yield* health.report).ready).toBe(true)
      yield* TestClock.adjust("1 second")
      const report3 = yield* health.report
      expect(report3.ready).toBe(false)
      expect(report3.body["deliveryProcess"]).toMatchObject({ state: "unresponsive" })
      yield* TestClock.adjust("3 seconds")
      expect((yield* health.report).body["delivery"]).toEqual({ pending: 3, leased: 1, stale: true })
    }))

  it.scoped("a hung child (no answer for 30 looks after it was ready) is killed and restarted; a 503 is not hung", () =>
    Effect.gen(function*() {
      const { fake, section } = yield* setup()
      expect(yield* section).toMatchObject({ state: "running", pid: "1000" })
      // a child that answers, but not ready (503), is alive: never killed
      yield* Ref.set(fake.answer, Option.some({ ready: false, sections: {} }))
      yield* TestClock.adjust("2 minutes")
      yield* settle
      expect(yield* section).toMatchObject({ state: "unresponsive", pid: "1000" })
      expect(fake.children[0]!.signals).toEqual([])
      // no answer at all (event loop stuck, process stopped): killed at the 30th silent look
      yield* Ref.set(fake.answer, Option.none())
      yield* TestClock.adjust("29 seconds")
      yield* settle
      expect(fake.children[0]!.signals).toEqual([])
      yield* TestClock.adjust("1 second")
      yield* settle
      expect(fake.children[0]!.signals).toEqual(["SIGKILL"])
      expect(yield* section).toMatchObject({ state: "backoff", pid: null })
      // replaced after the backoff, as after any crash
      yield* Ref.set(fake.answer, Option.some(READY))
      yield* TestClock.adjust("1 second")
      yield* settle
      expect(fake.children).toHaveLength(2)
      yield* TestClock.adjust("1 second")
      expect(yield* section).toMatchObject({ state: "running", pid: "1001", restarts: 1 })
    }))

  it.scoped("metrics: the running child's series on the parent's /metrics, labelled; none between a crash and the restart", () =>
    Effect.gen(function*() {
      const { fake, health } = yield* setup()
      const childLine = (text: string) => text.split("\n").filter((l) => l.startsWith("fake_child_total"))
      expect(childLine(yield* health.metrics)).toEqual(["fake_child_total{process=\"delivery-child\"} 1000"])
      // the parent's own metrics are there too, unlabelled
      expect(yield* health.metrics).toMatch(/^firehook_process_resident_memory_bytes \d+$/m)
      yield* fake.crash(0)
      yield* settle
      expect(childLine(yield* health.metrics)).toEqual([])
      yield* TestClock.adjust("1 second")
      yield* settle
      expect(childLine(yield* health.metrics)).toEqual(["fake_child_total{process=\"delivery-child\"} 1001"])
    }))
})

describe("ChildProcess.spawn (a real node process)", () => {
  it.live(
    "keeps the last stderr line; closing the scope stops a running child with SIGTERM",
    () =>
      Effect.gen(function*() {
        const scope = yield* Scope.make()
        const handle = yield* ChildProcess.spawn({
          command: process.execPath,
          // more than the 4 KiB tail of noise first: the last line is still the one kept
          args: [
            "-e",
            "process.stderr.write('noise\\n'.repeat(2000) + 'firehook: boom\\n'); setInterval(() => {}, 1000)"
          ],
          env: { PATH: process.env["PATH"] ?? "" },
          stopGrace: "5 seconds"
        }).pipe(Scope.extend(scope))
        expect(handle.pid).toBeGreaterThan(0)
        const last = handle.lastError.pipe(Effect.map(Option.getOrUndefined))
        for (let i = 0; i < 100 && (yield* last) !== "firehook: boom"; i++) yield* Effect.sleep("50 millis")
        expect(yield* handle.lastError).toEqual(Option.some("firehook: boom"))
        yield* Scope.close(scope, Exit.void)
        expect(yield* handle.exit).toEqual({ code: null, signal: "SIGTERM" })
      }),
    20_000
  )

  it.live("a child that ignores SIGTERM gets SIGKILL after the grace", () =>
    Effect.gen(function*() {
      const scope = yield* Scope.make()
      const handle = yield* ChildProcess.spawn({
        command: process.execPath,
        args: ["-e", "process.on('SIGTERM', () => {}); console.error('up'); setInterval(() => {}, 1000)"],
        env: { PATH: process.env["PATH"] ?? "" },
        stopGrace: "300 millis"
      }).pipe(Scope.extend(scope))
      for (let i = 0; i < 100 && Option.isNone(yield* handle.lastError); i++) yield* Effect.sleep("50 millis")
      yield* Scope.close(scope, Exit.void)
      expect(yield* handle.exit).toEqual({ code: null, signal: "SIGKILL" })
    }), 20_000)

  it.live("a missing binary is a SpawnFailed, not a crash", () =>
    Effect.gen(function*() {
      const result = yield* ChildProcess.spawn({
        command: "/nonexistent/firehook-runtime",
        args: [],
        env: {},
        stopGrace: "1 second"
      }).pipe(Effect.scoped, Effect.flip)
      expect(result._tag).toBe("SpawnFailed")
    }))
})

/** Listen on a loopback port for the scope (its connections closed at the end); the port. */
const listenLoopback = (server: Http.Server) =>
  Effect.acquireRelease(
    Effect.async<void>((resume) => {
      server.listen(0, "127.0.0.1", () => resume(Effect.void))
    }),
    () =>
      Effect.sync(() => server.closeAllConnections()).pipe(
        Effect.zipRight(Effect.async<void>((resume) => {
          server.close(() => resume(Effect.void))
        }))
      )
  ).pipe(
    Effect.map(() => {
      const addr = server.address()
      return typeof addr === "object" && addr !== null ? addr.port : 0
    })
  )

describe("DeliveryChild.probe (a real loopback listener)", () => {
  it.live(
    "reads readiness and sections; a hung or non-JSON answer is None within the timeout",
    () =>
      Effect.gen(function*() {
        let mode: "ok" | "unavailable" | "hang" | "text" | "notFound" = "ok"
        const server = Http.createServer((_req, res) => {
          if (mode === "hang") return
          if (mode === "text") {
            res.writeHead(200, { "content-type": "text/plain" })
            res.end("hello")
            return
          }
          res.writeHead(mode === "ok" ? 200 : mode === "notFound" ? 404 : 503, { "content-type": "application/json" })
          res.end(
            JSON.stringify({
              status: mode,
              phase: "live",
              delivery: { pending: 2, stale: false },
              roles: { delivery: true }
            })
          )
        })
        const port = yield* listenLoopback(server)
        expect(yield* DeliveryChild.probe(port)).toEqual(
          Option.some({ ready: true, sections: { delivery: { pending: 2, stale: false }, roles: { delivery: true } } })
        )
        mode = "unavailable"
        expect(Option.map(yield* DeliveryChild.probe(port), (a) => a.ready)).toEqual(Option.some(false))
        // only a 200 is ready (another listener on the port answering 404 is not the child)
        mode = "notFound"
        expect(Option.map(yield* DeliveryChild.probe(port), (a) => a.ready)).toEqual(Option.some(false))
        mode = "text"
        expect(yield* DeliveryChild.probe(port)).toEqual(Option.none())
        mode = "hang"
        const started = Date.now()
        expect(yield* DeliveryChild.probe(port)).toEqual(Option.none())
        expect(Date.now() - started).toBeLessThan(5000)
      }).pipe(Effect.scoped),
    20_000
  )
})

describe("DeliveryChild.metrics (a real loopback listener)", () => {
  it.live(
    "reads at most 4 MiB: an answer that never ends is None, and the read stops near the bound (not at the timeout)",
    () =>
      Effect.gen(function*() {
        let mode: "ok" | "endless" | "notFound" = "ok"
        let sent = 0
        const chunk = Buffer.alloc(64 * 1024, "#")
        const server = Http.createServer((_req, res) => {
          res.writeHead(mode === "notFound" ? 404 : 200, { "content-type": "text/plain" })
          if (mode !== "endless") {
            res.end("# HELP a_total a\n# TYPE a_total counter\na_total 1\n")
            return
          }
          // as much as the reader takes, until it hangs up (bounded: 1 GiB)
          const pump = () => {
            while (sent < 1024 * 1024 * 1024 && !res.destroyed) {
              sent += chunk.length
              if (!res.write(chunk)) return void res.once("drain", pump)
            }
            res.end()
          }
          pump()
        })
        const port = yield* listenLoopback(server)
        expect(yield* DeliveryChild.metrics(port)).toEqual(
          Option.some("# HELP a_total a\n# TYPE a_total counter\na_total 1\n")
        )
        mode = "notFound"
        expect(yield* DeliveryChild.metrics(port)).toEqual(Option.none())
        mode = "endless"
        expect(yield* DeliveryChild.metrics(port)).toEqual(Option.none())
        // the reader hung up after its 4 MiB (plus what the socket buffers held), not after 1 s of reading
        expect(sent).toBeLessThan(32 * 1024 * 1024)
      }).pipe(Effect.scoped),
    20_000
  )
})
