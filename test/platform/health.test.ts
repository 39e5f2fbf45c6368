import * as NodeHttpServer from "@effect/platform-node/NodeHttpServer"
import * as HttpClient from "@effect/platform/HttpClient"
import * as HttpClientRequest from "@effect/platform/HttpClientRequest"
import * as HttpServer from "@effect/platform/HttpServer"
import { describe, expect, it } from "@effect/vitest"
import { Effect, Exit, Fiber, Layer, Metric, MetricBoundaries, Option, Scope, TestClock } from "effect"
import * as Http from "node:http"
import * as Health from "../../src/services/platform/Health.js"
import * as Lifecycle from "../../src/services/platform/Lifecycle.js"
import * as Metrics from "../../src/services/platform/Metrics.js"

const LifecycleTest = Lifecycle.layer({ shutdownTimeout: "5 seconds" })
const HealthTest = Health.layer.pipe(Layer.provideMerge(LifecycleTest))
const ServerTest = HttpServer.serve(Health.router).pipe(
  Layer.provideMerge(NodeHttpServer.layerTest),
  Layer.provideMerge(HealthTest)
)

const get = (path: string) =>
  Effect.gen(function*() {
    const client = yield* HttpClient.HttpClient
    const res = yield* client.execute(HttpClientRequest.get(path))
    const text = yield* res.text
    return { status: res.status, text, headers: res.headers }
  })

const PHASES: ReadonlyArray<readonly [Lifecycle.Phase, number, string, number]> = [
  // phase, /live status, /live body status, /health status
  ["starting", 200, "live", 503],
  ["reconciling-live", 200, "live", 200],
  ["live", 200, "live", 200],
  // SPEC §6.2: 503 {"status":"failed"} only when failed (issue 14 item 11; was {"status":"live"})
  ["failed", 503, "failed", 503]
]

describe("Health HTTP", () => {
  for (const [phase, liveStatus, liveBody, healthStatus] of PHASES) {
    it.scoped(`phase ${phase}: /live ${liveStatus}, /health ${healthStatus}`, () =>
      Effect.gen(function*() {
        const lifecycle = yield* Lifecycle.Lifecycle
        yield* lifecycle.setPhase(phase)
        const live = yield* get("/live")
        expect(live.status).toBe(liveStatus)
        expect(JSON.parse(live.text)).toEqual({ status: liveBody })
        const health = yield* get("/health")
        expect(health.status).toBe(healthStatus)
        expect(health.headers["cache-control"]).toBe("no-store")
        const body = JSON.parse(health.text)
        expect(body.phase).toBe(phase)
        expect(body.status).toBe(healthStatus === 200 ? "ok" : "unavailable")
      }).pipe(Effect.provide(ServerTest)))
  }

  it.scoped("phases stopping and stopped: /live says stopping, /health 503", () =>
    Effect.gen(function*() {
      const lifecycle = yield* Lifecycle.Lifecycle
      yield* lifecycle.setPhase("live")
      // a shutdown blocked in a drain keeps the phase at `stopping`
      const gate = yield* Effect.makeLatch(false)
      yield* lifecycle.registerStop("delivery", "gate", gate.await)
      yield* Effect.forkScoped(lifecycle.shutdown)
      yield* Effect.yieldNow().pipe(Effect.repeatN(10))
      expect(yield* lifecycle.phase).toBe("stopping")
      const live = yield* get("/live")
      expect(live.status).toBe(200)
      expect(JSON.parse(live.text)).toEqual({ status: "stopping" })
      expect((yield* get("/health")).status).toBe(503)
      yield* gate.open
      yield* lifecycle.shutdown
      expect(yield* lifecycle.phase).toBe("stopped")
      expect(JSON.parse((yield* get("/live")).text)).toEqual({ status: "stopping" })
      expect((yield* get("/health")).status).toBe(503)
    }).pipe(Effect.provide(ServerTest)))

  it.scoped("registered sections appear, are clamped, and gate readiness", () =>
    Effect.gen(function*() {
      const lifecycle = yield* Lifecycle.Lifecycle
      const health = yield* Health.Health
      yield* lifecycle.setPhase("live")
      yield* health.register(
        "intake",
        Effect.succeed({ ready: true, body: { connected: true, queued: 5_000_000, lag: -3, kind: "protocol" } })
      )
      const ok = yield* get("/health")
      expect(ok.status).toBe(200)
      expect(JSON.parse(ok.text).intake).toEqual({ connected: true, queued: 1_000_000, lag: 0, kind: "protocol" })
      yield* Effect.scoped(
        Effect.gen(function*() {
          yield* health.register("backfill", Effect.succeed({ ready: false, body: { healthy: false } }))
          const down = yield* get("/health")
          expect(down.status).toBe(503)
          expect(JSON.parse(down.text).backfill).toEqual({ healthy: false })
        })
      )
      // the section goes away with its scope
      const again = yield* get("/health")
      expect(again.status).toBe(200)
      expect(JSON.parse(again.text).backfill).toBeUndefined()
    }).pipe(Effect.provide(ServerTest)))

  // SPEC §6.2: numbers clamped to 0..1,000,000; a NaN (a rate of 0/0) is 0, not `null` in the JSON
  it.scoped("NaN and infinities in a section are clamped to numbers in 0..1,000,000", () =>
    Effect.gen(function*() {
      yield* (yield* Lifecycle.Lifecycle).setPhase("live")
      yield* (yield* Health.Health).register(
        "delivery",
        Effect.succeed({
          ready: true,
          body: {
            rate: Number.NaN,
            up: Number.POSITIVE_INFINITY,
            down: Number.NEGATIVE_INFINITY,
            nested: { r: Number.NaN }
          }
        })
      )
      const res = yield* get("/health")
      expect(res.status).toBe(200)
      expect(JSON.parse(res.text).delivery).toEqual({ rate: 0, up: 1_000_000, down: 0, nested: { r: 0 } })
    }).pipe(Effect.provide(ServerTest)))

  it.scoped("/metrics is Prometheus text; anything else is 404", () =>
    Effect.gen(function*() {
      const counter = Metric.counter("firehook_test_things_total", { description: "things" }).pipe(
        Metric.tagged("kind", "we\"ird")
      )
      yield* Metric.increment(counter)
      const m = yield* get("/metrics")
      expect(m.status).toBe(200)
      expect(m.headers["content-type"]).toContain("text/plain")
      expect(m.text).toContain("# TYPE firehook_test_things_total counter")
      expect(m.text).toContain("firehook_test_things_total{kind=\"we\\\"ird\"} 1")
      expect(m.text).toContain("# TYPE firehook_process_resident_memory_bytes gauge")
      for (const path of ["/nope", "/health/x", "/"]) expect((yield* get(path)).status).toBe(404)
      const client = yield* HttpClient.HttpClient
      const post = yield* client.execute(HttpClientRequest.post("/live"))
      expect(post.status).toBe(404)
    }).pipe(Effect.provide(ServerTest)))
})

// SPEC §6.2 "anything else → 404": the path as received, case-sensitive (the router's defaults
// answered /LIVE, /live/ and //live with 200). Raw requests: an HTTP client would rewrite some of
// these paths (`//live` is a protocol-relative URL to it).
describe("Health routing is exact", () => {
  const raw = (method: string, path: string) =>
    Effect.gen(function*() {
      const server = yield* HttpServer.HttpServer
      const address = server.address
      if (address._tag !== "TcpAddress") return yield* Effect.die("not a TCP server")
      return yield* Effect.async<{ readonly status: number; readonly body: string }>((resume) => {
        const req = Http.request({ host: "127.0.0.1", port: address.port, method, path }, (res) => {
          let body = ""
          res.setEncoding("utf8")
          res.on("data", (d: string) => (body += d))
          res.on("end", () => resume(Effect.succeed({ status: res.statusCode ?? 0, body })))
        })
        req.on("error", (e) => resume(Effect.die(e)))
        req.end()
      })
    })

  it.scoped("only /live, /health and /metrics, exactly, answer", () =>
    Effect.gen(function*() {
      yield* (yield* Lifecycle.Lifecycle).setPhase("live")
      for (const path of ["/live", "/health", "/metrics", "/live?x=1", "/live?x=a;b"]) {
        expect({ path, status: (yield* raw("GET", path)).status }).toEqual({ path, status: 200 })
      }
      const notFound = [
        "/LIVE",
        "/Live",
        "/live/",
        "//live",
        "/live//",
        "///live",
        "/HEALTH",
        "/health/",
        "//health",
        "/Metrics",
        "/metrics/",
        "//metrics",
        "/live.json",
        "/live/x",
        // the router cuts a path at ';' as if it began a query
        "/live;x",
        "/health;jsessionid=1",
        "/metrics;",
        "/live;x?y=1"
      ]
      for (const path of notFound) {
        const res = yield* raw("GET", path)
        expect({ path, status: res.status }).toEqual({ path, status: 404 })
        expect(JSON.parse(res.body)).toEqual({ error: "not_found" })
      }
    }).pipe(Effect.provide(ServerTest)))

  // docs/decisions.md: methods other than GET are 404 (HEAD too: the catch-all route takes it first)
  it.scoped("methods other than GET, HEAD too, stay 404", () =>
    Effect.gen(function*() {
      yield* (yield* Lifecycle.Lifecycle).setPhase("live")
      for (const method of ["HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"]) {
        expect({ method, status: (yield* raw(method, "/live")).status }).toEqual({ method, status: 404 })
      }
    }).pipe(Effect.provide(ServerTest)))

  // SPEC §6.2 (anything else → 404) on each of the three paths, not only /live
  it.scoped("/health and /metrics answer GET only too", () =>
    Effect.gen(function*() {
      yield* (yield* Lifecycle.Lifecycle).setPhase("live")
      for (const path of ["/health", "/metrics"]) {
        for (const method of ["HEAD", "POST", "PUT", "DELETE"]) {
          expect({ method, path, status: (yield* raw(method, path)).status }).toEqual({ method, path, status: 404 })
        }
      }
    }).pipe(Effect.provide(ServerTest)))
})

describe("Metrics.render", () => {
  it.effect("histograms are cumulative with +Inf, sum and count", () =>
    Effect.gen(function*() {
      const h = Metric.histogram("firehook_test_latency_ms", MetricBoundaries.fromIterable([10, 100]), "latency")
      yield* Metric.update(h, 5)
      yield* Metric.update(h, 50)
      yield* Metric.update(h, 500)
      const text = Metrics.render(yield* Metric.snapshot)
      expect(text).toContain("# TYPE firehook_test_latency_ms histogram")
      expect(text).toContain("firehook_test_latency_ms_bucket{le=\"10\"} 1")
      expect(text).toContain("firehook_test_latency_ms_bucket{le=\"100\"} 2")
      expect(text).toContain("firehook_test_latency_ms_bucket{le=\"+Inf\"} 3")
      expect(text).toContain("firehook_test_latency_ms_sum 555")
      expect(text).toContain("firehook_test_latency_ms_count 3")
    }))

  it.effect("labelled counters and gauges are the same series as Metric.tagged ones", () =>
    Effect.gen(function*() {
      const labelled = Metrics.labelledCounter("firehook_test_labelled_total", { description: "d" }, { stream: "s1" })
      labelled.unsafeUpdate(1, [])
      yield* Metric.increment(labelled)
      // the same name and options as a Metric.counter that is tagged: one series
      yield* Metric.increment(
        Metric.tagged(Metric.counter("firehook_test_labelled_total", { description: "d" }), "stream", "s1")
      )
      const gauge = Metrics.labelledGauge("firehook_test_labelled_gauge", {}, { stream: "s1" })
      yield* Metric.set(gauge, 7)
      const text = Metrics.render(yield* Metric.snapshot)
      expect(text).toContain("firehook_test_labelled_total{stream=\"s1\"} 3")
      expect(text).toContain("firehook_test_labelled_gauge{stream=\"s1\"} 7")
    }))

  it.effect("Effect's effect_fiber_active, a counter that goes down, is typed gauge", () =>
    Effect.gen(function*() {
      // the name and kind of Effect's own runtime metric (fibers alive now)
      const active = Metric.counter("effect_fiber_active")
      yield* Metric.incrementBy(active, 3)
      yield* Metric.incrementBy(active, -1)
      const text = Metrics.render(yield* Metric.snapshot)
      expect(text).toContain("# TYPE effect_fiber_active gauge")
      expect(text).not.toContain("# TYPE effect_fiber_active counter")
    }))
})

describe("Metrics.merge (another process's metrics on this process's /metrics)", () => {
  const FOREIGN = [
    "# HELP firehook_test_merge_total things\\nsecond line",
    "# TYPE firehook_test_merge_total counter",
    "firehook_test_merge_total 4",
    "firehook_test_merge_total{kind=\"a {b} c\"} 5",
    "# HELP firehook_test_merge_ms latency",
    "# TYPE firehook_test_merge_ms histogram",
    "firehook_test_merge_ms_bucket{le=\"10\"} 1",
    "firehook_test_merge_ms_bucket{le=\"+Inf\"} 2",
    "firehook_test_merge_ms_sum 30",
    "firehook_test_merge_ms_count 2",
    "# HELP firehook_test_merge_only_child gauge of the child alone",
    "# TYPE firehook_test_merge_only_child gauge",
    "firehook_test_merge_only_child 7",
    "# HELP firehook_test_merge_clash declared otherwise here",
    "# TYPE firehook_test_merge_clash gauge",
    "firehook_test_merge_clash 9",
    "# HELP firehook_test_merge_odd a type Prometheus 0.0.4 does not have here",
    "# TYPE firehook_test_merge_odd untyped",
    "firehook_test_merge_odd 1",
    ""
  ].join("\n")

  it.effect("one family per name, the foreign samples labelled, clashing or unknown families left out", () =>
    Effect.gen(function*() {
      yield* Metric.incrementBy(Metric.counter("firehook_test_merge_total", { description: "things" }), 2)
      yield* Metric.increment(Metric.counter("firehook_test_merge_clash", { description: "a counter here" }))
      const text = Metrics.merge(yield* Metric.snapshot, [{ text: FOREIGN, labels: { process: "delivery-child" } }])
      const lines = text.split("\n")
      // every family once, in order
      const types = lines.filter((l) => l.startsWith("# TYPE "))
      expect(new Set(types).size).toBe(types.length)
      const family = (name: string) => {
        const start = lines.indexOf(
          `# TYPE ${name} ${name.endsWith("_ms") ? "histogram" : name.endsWith("child") ? "gauge" : "counter"}`
        )
        expect(start).toBeGreaterThan(0)
        const end = lines.findIndex((l, i) => i > start && l.startsWith("# "))
        return lines.slice(start + 1, end < 0 ? undefined : end)
      }
      expect(family("firehook_test_merge_total")).toEqual([
        "firehook_test_merge_total 2",
        "firehook_test_merge_total{process=\"delivery-child\"} 4",
        "firehook_test_merge_total{process=\"delivery-child\",kind=\"a {b} c\"} 5"
      ])
      expect(family("firehook_test_merge_ms")).toEqual([
        "firehook_test_merge_ms_bucket{process=\"delivery-child\",le=\"10\"} 1",
        "firehook_test_merge_ms_bucket{process=\"delivery-child\",le=\"+Inf\"} 2",
        "firehook_test_merge_ms_sum{process=\"delivery-child\"} 30",
        "firehook_test_merge_ms_count{process=\"delivery-child\"} 2"
      ])
      expect(family("firehook_test_merge_only_child")).toEqual([
        "firehook_test_merge_only_child{process=\"delivery-child\"} 7"
      ])
      // this process's help is kept; a family of the child alone keeps the child's (escaped as it came)
      expect(lines).toContain("# HELP firehook_test_merge_total things")
      expect(lines).toContain("# HELP firehook_test_merge_only_child gauge of the child alone")
      expect(lines).toContain("# HELP firehook_test_merge_ms latency")
      // a family whose type differs from this process's: only this process's samples
      expect(family("firehook_test_merge_clash")).toEqual(["firehook_test_merge_clash 1"])
      expect(text).not.toContain("firehook_test_merge_odd")
    }))

  it.effect("a help text with an escaped newline or backslash comes back escaped the same way", () =>
    Effect.gen(function*() {
      const foreign =
        "# HELP firehook_test_merge_help a\\\\b\\nc\n# TYPE firehook_test_merge_help gauge\nfirehook_test_merge_help 1\n"
      const text = Metrics.merge(yield* Metric.snapshot, [{ text: foreign, labels: {} }])
      expect(text).toContain(
        "# HELP firehook_test_merge_help a\\\\b\\nc\n# TYPE firehook_test_merge_help gauge\nfirehook_test_merge_help 1\n"
      )
    }))

  it.scoped("Health.metrics: registered sources are merged; one that does not answer is left out after 2 s", () =>
    Effect.gen(function*() {
      const lifecycle = yield* Lifecycle.make({ shutdownTimeout: "5 seconds" })
      const health = yield* Health.makeWith({}).pipe(Effect.provideService(Lifecycle.Lifecycle, lifecycle))
      const answer =
        "# HELP firehook_test_src_total s\n# TYPE firehook_test_src_total counter\nfirehook_test_src_total 3\n"
      yield* health.registerMetrics(Effect.succeed(Option.some({ text: answer, labels: { process: "p1" } })))
      yield* health.registerMetrics(Effect.succeed(Option.none()))
      yield* health.registerMetrics(Effect.never)
      const scrape = yield* Effect.fork(health.metrics)
      yield* TestClock.adjust("2 seconds")
      const text = yield* Fiber.join(scrape)
      expect(text.split("\n").filter((l) => l.startsWith("firehook_test_src_total"))).toEqual([
        "firehook_test_src_total{process=\"p1\"} 3"
      ])
      expect(text).toContain("# TYPE firehook_process_resident_memory_bytes gauge")
    }))

  it.scoped("Health.metrics: a source is served only while the scope that registered it is open", () =>
    Effect.gen(function*() {
      const lifecycle = yield* Lifecycle.make({ shutdownTimeout: "5 seconds" })
      const health = yield* Health.makeWith({}).pipe(Effect.provideService(Lifecycle.Lifecycle, lifecycle))
      const answer =
        "# HELP firehook_test_scoped_total s\n# TYPE firehook_test_scoped_total counter\nfirehook_test_scoped_total 1\n"
      const served = (text: string) => text.split("\n").filter((l) => l.startsWith("firehook_test_scoped_total"))
      const scope = yield* Scope.make()
      yield* health.registerMetrics(Effect.succeed(Option.some({ text: answer, labels: { process: "child" } }))).pipe(
        Scope.extend(scope)
      )
      expect(served(yield* health.metrics)).toEqual(["firehook_test_scoped_total{process=\"child\"} 1"])
      yield* Scope.close(scope, Exit.void)
      expect(served(yield* health.metrics)).toEqual([])
    }))
})
