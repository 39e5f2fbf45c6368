/**
 * SafeHttp (SPEC §4.6), pure parts: the allow-list parser, request headers, allowedAddress,
 * planTarget, and how errors render.
 */
import { describe, expect, it } from "@effect/vitest"
import { Either } from "effect"
import { parseCidr } from "../../../src/schemas/Net.js"
import { buildHeaders } from "../../../src/services/platform/http/Headers.js"
import {
  allowedAddress,
  MAX_REQUEST_HEADER_BYTES,
  parseAllowCidrs,
  planTarget,
  SafeHttpError
} from "../../../src/services/platform/http/SafeHttp.js"
import { cidrs } from "./safehttp-support.js"

describe("SafeHttp: pure parts", () => {
  it("parseAllowCidrs: comma-separated, whitespace-tolerant, strict", () => {
    expect(parseAllowCidrs("")).toEqual(Either.right([]))
    expect(parseAllowCidrs("   ")).toEqual(Either.right([]))
    const two = parseAllowCidrs(" 10.0.0.0/8 ,fd00::/8")
    expect(Either.isRight(two) && two.right.map((c) => [c.family, c.prefix])).toEqual([[4, 8], [6, 8]])
    for (
      const bad of [
        "10.0.0.0/8,",
        ",10.0.0.0/8",
        "10.0.0.0/8,,fd00::/8",
        "10.0.0.1/8",
        "10.0.0.0",
        "10.0.0.0/33",
        "fe80::1%eth0/64",
        "example.com/8"
      ]
    ) {
      expect(parseAllowCidrs(bad)).toEqual(Either.left("invalid_cidr"))
    }
    const many = (n: number) => Array.from({ length: n }, (_, i) => `10.${i >> 8}.${i & 255}.0/24`).join(",")
    expect(Either.isRight(parseAllowCidrs(many(256)))).toBe(true)
    expect(parseAllowCidrs(many(257))).toEqual(Either.left("invalid_cidr"))
  })

  it("request headers: names, values and 4 bytes each count toward MAX_REQUEST_HEADER_BYTES; hop-by-hop headers are dropped", () => {
    const fill = (total: number) => ({ "X-Big": "v".repeat(total - "X-Big".length - 4) })
    expect(Either.isRight(buildHeaders(fill(MAX_REQUEST_HEADER_BYTES), "h.test", undefined))).toBe(true)
    expect(buildHeaders(fill(MAX_REQUEST_HEADER_BYTES + 1), "h.test", undefined)).toEqual(
      Either.left("request_too_large")
    )
    const hopByHop = [
      "HOST",
      "Content-Length",
      "transfer-encoding",
      "Connection",
      "Keep-Alive",
      "Proxy-Connection",
      "Upgrade",
      "TE",
      "Trailer",
      "Expect",
      "HTTP2-Settings"
    ]
    const headers = Either.getOrThrow(
      buildHeaders(Object.fromEntries([["X-Keep", "1"], ...hopByHop.map((n) => [n, "x"])]), "h.test:8443", 3)
    )
    expect(headers).toEqual({ "X-Keep": "1", Host: "h.test:8443", "Content-Length": "3" })
  })

  it("allowedAddress: public, allow-list, development loopback, loopback-only", () => {
    const allow = [parseCidr("10.0.0.0/8")!, parseCidr("fd00::/8")!]
    const prod = { allowInsecureDev: false, allowCidrs: allow, loopbackOnly: false }
    const dev = { allowInsecureDev: true, allowCidrs: [], loopbackOnly: false }
    const devHttp = { allowInsecureDev: true, allowCidrs: allow, loopbackOnly: true }
    expect(allowedAddress("1.1.1.1", prod)).toBeDefined()
    expect(allowedAddress("2606:4700::1111", prod)).toBeDefined()
    expect(allowedAddress("10.1.2.3", prod)).toBeDefined()
    expect(allowedAddress("fd12::1", prod)).toBeDefined()
    expect(allowedAddress("11.0.0.1", prod)).toBeDefined()
    expect(allowedAddress("192.168.0.1", prod)).toBeUndefined()
    expect(allowedAddress("127.0.0.1", prod)).toBeUndefined()
    expect(allowedAddress("::ffff:10.0.0.1", prod)).toBeUndefined() // families never mix
    expect(allowedAddress("127.0.0.1", dev)).toBeDefined()
    expect(allowedAddress("::1", dev)).toBeDefined()
    expect(allowedAddress("10.0.0.1", dev)).toBeUndefined()
    expect(allowedAddress("127.0.0.5", devHttp)).toBeDefined()
    expect(allowedAddress("1.1.1.1", devHttp)).toBeUndefined()
    expect(allowedAddress("10.0.0.1", devHttp)).toBeUndefined()
    expect(allowedAddress("127.0.0.1", { ...devHttp, allowInsecureDev: false })).toBeUndefined()
    for (const junk of ["", "127.1", "0x7f.0.0.1", "fe80::1%eth0", "[::1]", "localhost", "1.1.1.1 "]) {
      expect(allowedAddress(junk, { ...dev, allowCidrs: [parseCidr("0.0.0.0/0")!] })).toBeUndefined()
    }
  })

  it("planTarget: Host header, port, path, SNI", () => {
    const opts = { allowInsecureDev: false, allowCidrs: [] }
    const t = Either.getOrThrow(planTarget("https://Example.COM./a/b?c=d%20e", opts))
    expect(t).toMatchObject({
      protocol: "https:",
      hostname: "example.com.",
      hostHeader: "example.com.",
      port: 443,
      path: "/a/b?c=d%20e",
      servername: "example.com",
      loopbackOnly: false,
      literal: undefined
    })
    const p = Either.getOrThrow(planTarget("https://example.com:8443", opts))
    expect(p).toMatchObject({ hostHeader: "example.com:8443", port: 8443, path: "/" })
    const v6 = Either.getOrThrow(planTarget("https://[2606:4700::1111]:444/x", opts))
    expect(v6).toMatchObject({ hostHeader: "[2606:4700::1111]:444", servername: undefined })
    expect(v6.literal).toHaveLength(16)
    expect(planTarget("https://1.1.1.1/", opts)).toSatisfy(Either.isRight)
    expect(planTarget("https://0x7f.1/", opts)).toEqual(Either.left("blocked_target"))
    expect(planTarget("https://127.1/", opts)).toEqual(Either.left("blocked_target"))
    expect(planTarget("https://[fe80::1%25eth0]/", opts)).toSatisfy(Either.isLeft)
    const dev = { allowInsecureDev: true, allowCidrs: [] }
    expect(Either.getOrThrow(planTarget("http://receiver.test:8080/h", dev))).toMatchObject({
      protocol: "http:",
      loopbackOnly: true,
      servername: undefined,
      port: 8080
    })
    expect(planTarget("http://u:p@receiver.test/", dev)).toEqual(Either.left("invalid_target"))
    expect(planTarget("http://receiver.test/#x", dev)).toEqual(Either.left("invalid_target"))
    expect(planTarget("http://10.0.0.1/", { ...dev, allowCidrs: cidrs("10.0.0.0/8") })).toEqual(
      Either.left("invalid_target")
    )
  })

  it("errors render generically", () => {
    for (
      const kind of [
        "invalid_target",
        "blocked_target",
        "dns",
        "timeout",
        "network",
        "request_too_large",
        "response_too_large"
      ] as const
    ) {
      const e = new SafeHttpError({ kind })
      expect(String(e)).toBe(`SafeHttpError: delivery failed: ${kind}`)
      expect(JSON.parse(JSON.stringify(e))).toEqual({ _tag: "SafeHttpError", kind })
    }
  })
})
