// SPEC §6.5: HEALTH_HOST / API_HOST are IP literals or localhost. An IPv6 zone id is kept only after
// a link-local address (fe80::/10): Bun listens on `fe80::…%eth0` (by interface name or index), but a
// zone on any other address made `Bun.serve` throw a TypeError (`::1%lo`, `::%eth0`) or fail the
// bind (`fd00::1%eth0`: EINVAL), which startup reported as `startup failed (unexpected TypeError
// ERR_INVALID_ARG_TYPE)`. Such a value is now a startup error naming the variable and the rule. A
// link-local address without its zone (`fe80::1`) cannot be listened on either (EINVAL at the bind)
// and is refused the same way.
import { describe, expect, it } from "@effect/vitest"
import { Effect, Either } from "effect"
import { listenersCollide } from "../../src/services/platform/ConfigRead.js"
import { load } from "./config-support.js"

const refusal = (env: Record<string, string>) =>
  Effect.gen(function*() {
    const result = yield* Effect.either(load(env))
    if (Either.isRight(result)) return yield* Effect.die(`accepted ${JSON.stringify(env)}`)
    return result.left
  })

describe("listen hosts with an IPv6 zone", () => {
  for (const variable of ["HEALTH_HOST", "API_HOST"]) {
    it.effect(`${variable}: a link-local address keeps its zone (name or index), as given`, () =>
      Effect.gen(function*() {
        for (const host of ["fe80::1%eth0", "fe80::fc:ff:fe00:1%4", "FE80::1%en0", "febf::1%eth0"]) {
          const c = yield* load({ [variable]: host })
          expect(variable === "HEALTH_HOST" ? c.healthHost : c.api.host).toBe(host)
        }
      }))

    it.effect(`${variable}: a zone after any other address is refused in one line`, () =>
      Effect.gen(function*() {
        for (
          const host of [
            "::1%lo",
            "::1%1",
            "::%eth0",
            "fd00::2%eth0",
            "::ffff:127.0.0.1%lo",
            "ff02::1%eth0",
            "fec0::1%eth0"
          ]
        ) {
          const err = yield* refusal({ [variable]: host })
          expect(err.variable).toBe(variable)
          expect(err.message).toBe(
            `invalid configuration: ${variable} may have an IPv6 zone (%eth0) only after a link-local fe80:: address`
          )
        }
      }))

    it.effect(`${variable}: a link-local address without its zone is refused in one line (it cannot be listened on)`, () =>
      Effect.gen(function*() {
        for (const host of ["fe80::1", "FE80::abcd", "febf::1", "fe80::"]) {
          const err = yield* refusal({ [variable]: host })
          expect(err.variable).toBe(variable)
          expect(err.message).toBe(
            `invalid configuration: ${variable} needs an IPv6 zone after a link-local fe80:: address (fe80::1%eth0)`
          )
        }
        // control: the neighbours of fe80::/10 need none
        for (const host of ["fe7f::1", "fec0::1", "::1"]) {
          const c = yield* load({ [variable]: host })
          expect(variable === "HEALTH_HOST" ? c.healthHost : c.api.host).toBe(host)
        }
      }))
  }

  it("a zoned address collides by its address: not with 127.0.0.1, with itself and the wildcard", () => {
    const at = (host: string) => ({ host, port: 4000 })
    // before: the zoned address was read as a name, and a name against a loopback address collided
    expect(listenersCollide(at("fe80::1%eth0"), at("127.0.0.1"))).toBe(false)
    expect(listenersCollide(at("::1"), at("fe80::1%eth0"))).toBe(false)
    expect(listenersCollide(at("fe80::1%eth0"), at("fe80::2%eth0"))).toBe(false)
    expect(listenersCollide(at("fe80::1%eth0"), at("fe80::1"))).toBe(true)
    expect(listenersCollide(at("fe80::1%eth0"), at("fe80::0:1%2"))).toBe(true)
    expect(listenersCollide(at("fe80::1%eth0"), at("::"))).toBe(true)
    expect(listenersCollide(at("fe80::1%eth0"), { host: "fe80::1%eth0", port: 4001 })).toBe(false)
  })

  it.effect("HEALTH_HOST zoned and API_HOST 127.0.0.1 may share a port number", () =>
    Effect.gen(function*() {
      const c = yield* load({
        HEALTH_HOST: "fe80::1%eth0",
        HEALTH_PORT: "4000",
        API_HOST: "127.0.0.1",
        API_PORT: "4000"
      })
      expect([c.healthPort, c.api.port]).toEqual([4000, 4000])
    }))
})
