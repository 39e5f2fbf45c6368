/**
 * SafeHttp (SPEC §4.6), targets: blocked literal IPs and host names, and what the Resolver's answers
 * allow (real HTTPS servers on 127.0.0.1, a fake Resolver; the system resolver, Bun's lookup).
 */
import { describe, expect, it } from "@effect/vitest"
import { Cause, Duration, Effect, Exit, Fiber, Option, TestClock } from "effect"
import { bunLookup, makeLookup } from "../../../src/services/platform/http/Resolver.js"
import { MAX_TIMEOUT_MS, ResolveError, Resolver } from "../../../src/services/platform/http/SafeHttp.js"
import {
  answers,
  DEV,
  expectKind,
  fakeResolver,
  ok,
  post,
  PROD,
  send,
  startServer,
  useTestCertificate,
  withHttp
} from "./safehttp-support.js"

useTestCertificate()

describe("SafeHttp: blocked targets (no resolution, no connection)", () => {
  const LITERALS = [
    "10.0.0.1",
    "169.254.169.254",
    "100.64.0.1",
    "192.168.1.1",
    "172.16.0.1",
    "0.0.0.0",
    "127.0.0.1",
    "198.18.0.1",
    "224.0.0.1",
    "192.0.2.1",
    "240.0.0.1",
    "[fc00::1]",
    "[fe80::1]",
    "[::1]",
    "[::]",
    "[::ffff:127.0.0.1]",
    "[::127.0.0.1]",
    "[2001:db8::1]",
    "[64:ff9b::1]",
    "[2002::1]",
    "[ff02::1]"
  ]

  it.scopedLive("every non-public literal IP is blocked_target", () =>
    Effect.gen(function*() {
      const server = yield* startServer(ok, { tls: true })
      const resolver = answers("1.1.1.1")
      for (const lit of LITERALS) {
        const url = `https://${lit}:${server.port}/hook`
        yield* expectKind(send(PROD, resolver, post(url)), "blocked_target", [
          lit,
          lit.replace(/[[\]]/g, ""),
          String(server.port),
          "/hook"
        ])
      }
      // insecure development mode only opens loopback (127/8, ::1); everything else stays blocked
      for (const lit of LITERALS.filter((l) => l !== "127.0.0.1" && l !== "[::1]")) {
        yield* expectKind(send(DEV, resolver, post(`https://${lit}:${server.port}/hook`)), "blocked_target", [lit])
      }
      // 0.0.0.0 and ::ffff:127.0.0.1 would have reached this server had a connection been attempted
      expect(resolver.calls).toEqual([])
      expect(server.connections()).toBe(0)
    }))

  it.scopedLive("blocked host names are blocked_target without a lookup", () =>
    Effect.gen(function*() {
      const resolver = answers("1.1.1.1")
      for (
        const host of [
          "localhost",
          "LOCALHOST.",
          "a.b.localhost",
          "metadata.google.internal",
          "metadata.google.internal."
        ]
      ) {
        yield* expectKind(send(PROD, resolver, post(`https://${host}/x`)), "blocked_target", [host.toLowerCase()])
      }
      // in insecure development mode, http: to a *.localhost or the metadata host is still blocked
      for (const host of ["a.localhost", "metadata.google.internal"]) {
        yield* expectKind(send(DEV, resolver, post(`http://${host}/x`)), "blocked_target", [host])
      }
      expect(resolver.calls).toEqual([])
    }))

  it.scopedLive("syntax errors and http: outside development mode are invalid_target", () =>
    Effect.gen(function*() {
      const resolver = answers("1.1.1.1")
      for (
        const url of [
          "not a url",
          "ftp://receiver.test/",
          "https://u:p@receiver.test/",
          "https://receiver.test/#f",
          "http://receiver.test/",
          "http://1.1.1.1/",
          "https://",
          "https://[::1/",
          `https://receiver.test/${"a".repeat(2100)}`
        ]
      ) {
        yield* expectKind(send(PROD, resolver, post(url)), "invalid_target", ["receiver.test", "1.1.1.1"])
      }
      // development mode: http: only to loopback; a public literal is still a scheme error
      yield* expectKind(send(DEV, resolver, post("http://1.1.1.1/")), "invalid_target", ["1.1.1.1"])
      expect(resolver.calls).toEqual([])
    }))
})

describe("SafeHttp: DNS answers", () => {
  it.scopedLive("mixed public/private answers are blocked_target after exactly one lookup", () =>
    Effect.gen(function*() {
      const server = yield* startServer(ok, { tls: true })
      const sets: ReadonlyArray<ReadonlyArray<string>> = [
        ["1.1.1.1", "10.0.0.1"],
        ["10.0.0.1", "1.1.1.1"],
        ["2606:4700::1111", "fd00::1"],
        ["1.1.1.1", "::ffff:127.0.0.1"],
        ["1.1.1.1", "127.0.0.1"],
        ["1.1.1.1", "169.254.169.254"],
        ["1.1.1.1", "fe80::1%eth0"],
        ["1.1.1.1", "127.1"],
        ["1.1.1.1", "not-an-ip"]
      ]
      for (const set of sets) {
        const resolver = answers(...set)
        yield* expectKind(
          send(PROD, resolver, post(`https://receiver.test:${server.port}/hook`)),
          "blocked_target",
          ["receiver.test", ...set, String(server.port)]
        )
        expect(resolver.calls).toEqual(["receiver.test"])
      }
      expect(server.connections()).toBe(0)
    }))

  it.scopedLive("a failing lookup is dns; no answers is dns", () =>
    Effect.gen(function*() {
      const failing = fakeResolver(() => Effect.fail(new ResolveError({ reason: "not_found" })))
      yield* expectKind(send(PROD, failing, post("https://receiver.test/hook")), "dns", ["receiver.test"])
      expect(failing.calls).toEqual(["receiver.test"])
      const empty = answers()
      yield* expectKind(send(PROD, empty, post("https://receiver.test/hook")), "dns", ["receiver.test"])
      expect(empty.calls).toHaveLength(1)
    }))

  it.scopedLive("a lookup that never answers is a timeout within the deadline", () =>
    Effect.gen(function*() {
      const hanging = fakeResolver(() => Effect.never)
      yield* expectKind(send(PROD, hanging, post("https://receiver.test/hook", { timeoutMs: 200 })), "timeout", [
        "receiver.test"
      ])
    }))

  it.scoped("a lookup that never answers fails as timeout exactly at timeoutMs, at most MAX_TIMEOUT_MS (TestClock)", () =>
    Effect.gen(function*() {
      const hanging = fakeResolver(() => Effect.never)
      yield* withHttp(PROD, hanging, (http) =>
        Effect.gen(function*() {
          const settle = () => Effect.repeatN(Effect.yieldNow(), 20)
          for (const [timeoutMs, bound] of [[200, 200], [60 * 60 * 1000, MAX_TIMEOUT_MS]] as const) {
            const fiber = yield* Effect.fork(http.request(post("https://receiver.test/hook", { timeoutMs })))
            yield* settle()
            yield* TestClock.adjust(Duration.millis(bound - 1))
            yield* settle()
            expect(Option.isNone(yield* Fiber.poll(fiber))).toBe(true)
            yield* TestClock.adjust(Duration.millis(1))
            yield* settle()
            const exit = yield* Fiber.poll(fiber)
            expect(Option.isSome(exit) && Exit.isFailure(exit.value) ? String(Cause.squash(exit.value.cause)) : exit)
              .toBe("SafeHttpError: delivery failed: timeout")
          }
        }))
    }))

  it.scopedLive("the system resolver answers for localhost and fails generically for .invalid", () =>
    Effect.gen(function*() {
      const resolver = yield* Resolver.pipe(Effect.provide(Resolver.layer))
      const local = yield* resolver.lookup("localhost")
      expect(local.length).toBeGreaterThan(0)
      for (const a of local) expect([4, 6]).toContain(a.family)
      const error = yield* Effect.flip(resolver.lookup("no-such-host.invalid"))
      expect(error).toBeInstanceOf(ResolveError)
      expect(String(error)).not.toContain("no-such-host")
      expect(JSON.stringify(error)).not.toContain("no-such-host")
    }))

  it.effect("under Bun the system resolver is Bun.dns.lookup with the c-ares backend (no thread per lookup)", () =>
    Effect.gen(function*() {
      const calls: Array<[string, unknown]> = []
      const fakeBun = {
        dns: {
          lookup(this: unknown, hostname: string, options: unknown) {
            calls.push([hostname, options])
            if (this !== fakeBun.dns) return Promise.reject(new Error("called without its receiver"))
            if (hostname === "gone.test") {
              return Promise.reject(Object.assign(new Error("x"), { code: "DNS_ENOTFOUND" }))
            }
            if (hostname === "slow.test") return Promise.reject(Object.assign(new Error("x"), { code: "DNS_ETIMEOUT" }))
            return Promise.resolve([
              { address: "203.0.113.7", family: 4, ttl: 60 },
              { address: "2001:db8::7", family: 6, ttl: 60 },
              { address: "bogus", family: "IPv4" },
              null
            ])
          }
        }
      }
      const look = bunLookup(fakeBun)
      expect(look).toBeDefined()
      if (look === undefined) return
      const lookup = makeLookup(look)
      expect(yield* lookup("receiver.test")).toEqual([
        { address: "203.0.113.7", family: 4 },
        { address: "2001:db8::7", family: 6 }
      ])
      expect(calls).toEqual([["receiver.test", { backend: "c-ares" }]])
      expect((yield* Effect.flip(lookup("gone.test"))).reason).toBe("not_found")
      expect((yield* Effect.flip(lookup("slow.test"))).reason).toBe("temporary")
      // not Bun (Node, the tests' runtime): node:dns
      expect(bunLookup(undefined)).toBeUndefined()
      expect(bunLookup({})).toBeUndefined()
      expect(bunLookup({ dns: {} })).toBeUndefined()
    }))
})
