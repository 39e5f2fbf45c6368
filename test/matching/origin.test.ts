/**
 * The origin key (SPEC §4.1 per-origin cap, §4.3 circuit breaker): one key per receiver origin,
 * however its URL is spelled.
 */
import { describe, expect, it } from "vitest"
import { originKey } from "../../src/services/matching/Outbox.js"

describe("originKey", () => {
  it("spellings of one origin give one key", () => {
    const one = [
      "https://h.example/hook",
      "https://H.EXAMPLE/other?x=1",
      "https://h.example:443/a",
      "HTTPS://h.example./b#frag",
      "https://h.example"
    ]
    expect(new Set(one.map(originKey))).toEqual(new Set(["https://h.example"]))
  })

  it("ports, schemes and hosts that differ are different origins", () => {
    expect(originKey("https://h.example:8443/a")).toBe("https://h.example:8443")
    expect(originKey("http://h.example/a")).toBe("http://h.example")
    expect(originKey("http://h.example:80/a")).toBe("http://h.example")
    expect(originKey("https://g.example/a")).toBe("https://g.example")
    expect(originKey("https://[2001:DB8::1]:443/x")).toBe("https://[2001:db8::1]")
    expect(originKey("https://bücher.example/")).toBe("https://xn--bcher-kva.example")
  })

  it("a string the URL parser refuses falls back to the written scheme://authority, lowercased", () => {
    expect(originKey("https://exa mple.com/x")).toBe("https://exa mple.com")
    expect(originKey("HTTPS://Exa mple.COM/x")).toBe("https://exa mple.com")
    expect(originKey("not a url")).toBe("")
  })

  it("a URL without a host (never a validated webhook URL) gets the SQL rule's key too", () => {
    expect(originKey("mailto:someone@h.example")).toBe("")
    expect(originKey("file:///etc/hosts")).toBe("file://")
  })

  it("answers the same the second time (memoised)", () => {
    const u = "https://memo.example:443/x"
    expect(originKey(u)).toBe("https://memo.example")
    expect(originKey(u)).toBe("https://memo.example")
  })
})
