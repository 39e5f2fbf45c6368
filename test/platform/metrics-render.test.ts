/**
 * `/metrics` as a scraper and an embedder meet it (docs/operations.md: "Prometheus text format
 * 0.0.4 of every Effect metric"): the names and label keys of any Effect metric made valid, special
 * values, every metric kind Effect has, families in name order, and the delivery child's exposition
 * served with the parent's (Health.registerMetrics) while its scope is open, each source bounded.
 */
import * as NodeHttpServer from "@effect/platform-node/NodeHttpServer"
import * as HttpClient from "@effect/platform/HttpClient"
import * as HttpClientRequest from "@effect/platform/HttpClientRequest"
import * as HttpServer from "@effect/platform/HttpServer"
import { describe, expect, it } from "@effect/vitest"
import { Effect, Exit, Fiber, Layer, Metric, Option, Scope, TestClock } from "effect"
import * as Health from "../../src/services/platform/Health.js"
import * as Lifecycle from "../../src/services/platform/Lifecycle.js"
import * as Metrics from "../../src/services/platform/Metrics.js"
import { checkExposition } from "../support/promText.js"

/** The lines of `text` that start with `prefix`. */
const linesOf = (text: string, prefix: string) => text.split("\n").filter((l) => l.startsWith(prefix))

describe("Metrics.render of any Effect metric", () => {
  it.effect("a name or label key outside the Prometheus grammar is made valid; a name keeps its colons", () =>
    Effect.gen(function*() {
      // an embedder's OpenTelemetry-style names
      const counter = Metric.counter("embedder.http:requests_total", { description: "d" })
      yield* Metric.increment(
        Metric.tagged(Metric.tagged(Metric.tagged(counter, "http.route", "/x"), "a:b", "1"), "9lives", "2")
      )
      yield* Metric.set(Metric.gauge("9embedder_gauge", { description: "d" }), 1)
      const text = Metrics.render(yield* Metric.snapshot)
      expect(checkExposition(text).errors.filter((e) => e.includes("embedder"))).toEqual([])
      expect(text).toContain("# TYPE embedder_http:requests_total counter")
      expect(linesOf(text, "embedder_http:requests_total{")).toEqual([
        "embedder_http:requests_total{http_route=\"/x\",a_b=\"1\",_9lives=\"2\"} 1"
      ])
      expect(text).toContain("# TYPE _9embedder_gauge gauge\n_9embedder_gauge 1\n")
    }))

  it.effect("a gauge at +Inf, -Inf or NaN is written as the format spells them", () =>
    Effect.gen(function*() {
      yield* Metric.set(Metric.gauge("firehook_test_inf", { description: "d" }), Infinity)
      yield* Metric.set(Metric.gauge("firehook_test_minus_inf", { description: "d" }), -Infinity)
      yield* Metric.set(Metric.gauge("firehook_test_nan", { description: "d" }), NaN)
      const text = Metrics.render(yield* Metric.snapshot)
      expect(linesOf(text, "firehook_test_inf ")).toEqual(["firehook_test_inf +Inf"])
      expect(linesOf(text, "firehook_test_minus_inf ")).toEqual(["firehook_test_minus_inf -Inf"])
      expect(linesOf(text, "firehook_test_nan ")).toEqual(["firehook_test_nan NaN"])
    }))

  it.effect("summaries and frequencies: a summary with its quantiles, a frequency as a counter by key", () =>
    Effect.gen(function*() {
      const summary = Metric.summary({
        name: "firehook_test_summary_ms",
        maxAge: "1 minute",
        maxSize: 10,
        error: 0.01,
        quantiles: [0.5],
        description: "a summary"
      })
      yield* Metric.update(summary, 3)
      const frequency = Metric.frequency("firehook_test_frequency_total", { description: "a frequency" })
      yield* Metric.update(frequency, "a")
      yield* Metric.update(frequency, "a")
      const text = Metrics.render(yield* Metric.snapshot)
      expect(checkExposition(text).errors.filter((e) => /firehook_test_(summary|frequency)/.test(e))).toEqual([])
      expect(text).toContain(
        [
          "# HELP firehook_test_summary_ms a summary",
          "# TYPE firehook_test_summary_ms summary",
          "firehook_test_summary_ms{quantile=\"0.5\"} 3",
          "firehook_test_summary_ms_sum 3",
          "firehook_test_summary_ms_count 1"
        ].join("\n")
      )
      expect(text).toContain(
        [
          "# HELP firehook_test_frequency_total a frequency",
          "# TYPE firehook_test_frequency_total counter",
          "firehook_test_frequency_total{key=\"a\"} 2"
        ].join("\n")
      )
    }))

  it.effect("families come in name order; a metric without a description has its name as help", () =>
    Effect.gen(function*() {
      yield* Metric.increment(Metric.counter("firehook_test_order_b_total", { description: "b" }))
      yield* Metric.increment(Metric.counter("firehook_test_order_a_total"))
      const text = Metrics.render(yield* Metric.snapshot)
      const names = linesOf(text, "# TYPE ").map((l) => l.split(" ")[2] ?? "")
      expect(names).toEqual([...names].sort())
      expect(names.length).toBeGreaterThan(2)
      expect(text).toContain("# HELP firehook_test_order_a_total firehook_test_order_a_total\n")
    }))

  it.effect("labelledCounterFamily: label sets that concatenate alike are two series; the description is the help", () =>
    Effect.gen(function*() {
      const family = Metrics.labelledCounterFamily("firehook_test_family_split_total", { description: "split" })
      yield* Metric.increment(family({ a: "x", b: "yz" }))
      yield* Metric.increment(family({ a: "xy", b: "z" }))
      const text = Metrics.render(yield* Metric.snapshot)
      expect(linesOf(text, "firehook_test_family_split_total")).toEqual([
        "firehook_test_family_split_total{a=\"x\",b=\"yz\"} 1",
        "firehook_test_family_split_total{a=\"xy\",b=\"z\"} 1"
      ])
      expect(text).toContain("# HELP firehook_test_family_split_total split\n")
    }))

  it.effect("the process gauges: resident memory and heap in use, each its own figure", () =>
    Effect.gen(function*() {
      const text = yield* Metrics.exposition
      const value = (name: string) => Number(linesOf(text, `${name} `)[0]?.slice(name.length + 1))
      const rss = value("firehook_process_resident_memory_bytes")
      const heap = value("firehook_process_heap_used_bytes")
      expect(heap).toBeGreaterThan(0)
      // the heap is part of the resident set, never all of it (code, stacks and buffers are too)
      expect(heap).toBeLessThan(rss)
    }))
})

describe("Metrics.merge: the labels of a foreign exposition", () => {
  it.effect("are escaped like any label value", () =>
    Effect.gen(function*() {
      const foreign =
        "# HELP firehook_test_merge_esc e\n# TYPE firehook_test_merge_esc gauge\nfirehook_test_merge_esc{k=\"v\"} 1\n"
      const text = Metrics.merge(yield* Metric.snapshot, [{ text: foreign, labels: { process: "a\"b\\c" } }])
      expect(linesOf(text, "firehook_test_merge_esc{")).toEqual([
        "firehook_test_merge_esc{process=\"a\\\"b\\\\c\",k=\"v\"} 1"
      ])
      expect(checkExposition(text).errors.filter((e) => e.includes("firehook_test_merge_esc"))).toEqual([])
    }))
})

describe("Health.metrics with several sources", () => {
  const makeHealth = Effect.gen(function*() {
    const lifecycle = yield* Lifecycle.make({ shutdownTimeout: "5 seconds" })
    return yield* Health.makeWith({}).pipe(Effect.provideService(Lifecycle.Lifecycle, lifecycle))
  })
  const source = (name: string, process: string) =>
    Option.some({ text: `# HELP ${name} s\n# TYPE ${name} counter\n${name} 1\n`, labels: { process } })

  it.scoped("a source answering within 2 s is served", () =>
    Effect.gen(function*() {
      const health = yield* makeHealth
      yield* health.registerMetrics(
        Effect.delay(Effect.succeed(source("firehook_test_slow_total", "p")), "1500 millis")
      )
      const scrape = yield* Effect.fork(health.metrics)
      yield* TestClock.adjust("2 seconds")
      expect(linesOf(yield* Fiber.join(scrape), "firehook_test_slow_total")).toEqual([
        "firehook_test_slow_total{process=\"p\"} 1"
      ])
    }))

  it.scoped("sources are asked together: two that never answer hold a scrape 2 s, not 4 s", () =>
    Effect.gen(function*() {
      const health = yield* makeHealth
      yield* health.registerMetrics(Effect.never)
      yield* health.registerMetrics(Effect.never)
      yield* health.registerMetrics(Effect.succeed(source("firehook_test_together_total", "p")))
      const scrape = yield* Effect.fork(health.metrics)
      yield* TestClock.adjust("2 seconds")
      const done = yield* Fiber.poll(scrape)
      expect(Option.isSome(done)).toBe(true)
      expect(linesOf(yield* Fiber.join(scrape), "firehook_test_together_total")).toEqual([
        "firehook_test_together_total{process=\"p\"} 1"
      ])
    }))

  it.scoped("every registered source is served; closing one's scope removes that one only", () =>
    Effect.gen(function*() {
      const health = yield* makeHealth
      const first = yield* Scope.make()
      const second = yield* Scope.make()
      yield* health.registerMetrics(Effect.succeed(source("firehook_test_many_total", "a"))).pipe(Scope.extend(first))
      yield* health.registerMetrics(Effect.succeed(source("firehook_test_many_total", "b"))).pipe(Scope.extend(second))
      expect(linesOf(yield* health.metrics, "firehook_test_many_total")).toEqual([
        "firehook_test_many_total{process=\"a\"} 1",
        "firehook_test_many_total{process=\"b\"} 1"
      ])
      yield* Scope.close(first, Exit.void)
      expect(linesOf(yield* health.metrics, "firehook_test_many_total")).toEqual([
        "firehook_test_many_total{process=\"b\"} 1"
      ])
      yield* Scope.close(second, Exit.void)
    }))
})

describe("GET /metrics", () => {
  const ServerTest = HttpServer.serve(Health.router).pipe(
    Layer.provideMerge(NodeHttpServer.layerTest),
    Layer.provideMerge(Health.layer.pipe(Layer.provideMerge(Lifecycle.layer({ shutdownTimeout: "5 seconds" }))))
  )

  it.scoped("is text format 0.0.4, not cached", () =>
    Effect.gen(function*() {
      const client = yield* HttpClient.HttpClient
      const res = yield* client.execute(HttpClientRequest.get("/metrics"))
      expect(res.status).toBe(200)
      expect(res.headers["content-type"]).toBe("text/plain; version=0.0.4; charset=utf-8")
      expect(res.headers["cache-control"]).toBe("no-store")
    }).pipe(Effect.provide(ServerTest)))
})
