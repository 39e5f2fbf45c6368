/**
 * The PDS hosts that asked for time (PdsCooldown.ts): keyed by the PDS URL's scheme and authority,
 * a cool-down ends when its time has passed, a shorter request never cuts a longer one, the wait is
 * capped at an hour, and the hosts held stay bounded.
 */
import { describe, expect, it } from "vitest"
import { COOLDOWN_MAX_MS, hostKey, make } from "../../src/services/reconciliation/PdsCooldown.js"

describe("PdsCooldown", () => {
  it("keys a PDS by its scheme, host and port, lower-cased", () => {
    expect(hostKey("https://PDS.Example.com")).toBe("https://pds.example.com")
    expect(hostKey("https://pds.example.com/base/path")).toBe("https://pds.example.com")
    expect(hostKey("http://127.0.0.1:2583")).toBe("http://127.0.0.1:2583")
    expect(hostKey("http://127.0.0.1:2584")).not.toBe(hostKey("http://127.0.0.1:2583"))
    expect(hostKey("not a url")).toBe("not a url")
  })

  it("holds a host for the time it asked, then lets it go", () => {
    const c = make()
    expect(c.remaining("https://pds.example", 1_000)).toBeUndefined()
    c.note("https://pds.example", 1_000, 30_000)
    expect(c.remaining("https://pds.example", 1_000)).toBe(30_000)
    // the same host by another path or case
    expect(c.remaining("https://PDS.example/xrpc", 11_000)).toBe(20_000)
    expect(c.remaining("https://other.example", 11_000)).toBeUndefined()
    expect(c.remaining("https://pds.example", 30_999)).toBe(1)
    expect(c.remaining("https://pds.example", 31_000)).toBeUndefined()
    // an ended cool-down is dropped when it is read
    expect(c.size()).toBe(0)
  })

  it("keeps the longer of two cool-downs, caps one at an hour, and ignores an empty or invalid wait", () => {
    const c = make()
    c.note("https://pds.example", 0, 60_000)
    c.note("https://pds.example", 10_000, 5_000)
    expect(c.remaining("https://pds.example", 10_000)).toBe(50_000)
    c.note("https://pds.example", 10_000, 90_000)
    expect(c.remaining("https://pds.example", 10_000)).toBe(90_000)
    c.note("https://far.example", 0, Number.MAX_SAFE_INTEGER)
    expect(c.remaining("https://far.example", 0)).toBe(COOLDOWN_MAX_MS)
    for (const ms of [0, -5, Number.NaN]) c.note("https://none.example", 0, ms)
    expect(c.remaining("https://none.example", 0)).toBeUndefined()
    expect(c.size()).toBe(2)
  })

  it("holds at most its bound of hosts: expired ones go first, then the one that ends soonest", () => {
    const c = make(3)
    c.note("https://a.example", 0, 1_000)
    c.note("https://b.example", 0, 50_000)
    c.note("https://c.example", 0, 20_000)
    // a has ended: it makes the room
    c.note("https://d.example", 2_000, 40_000)
    expect(c.size()).toBe(3)
    expect(c.remaining("https://b.example", 2_000)).toBe(48_000)
    expect(c.remaining("https://c.example", 2_000)).toBe(18_000)
    // none has ended: c ends soonest and goes
    c.note("https://e.example", 2_000, 10_000)
    expect(c.size()).toBe(3)
    expect(c.remaining("https://c.example", 2_000)).toBeUndefined()
    expect(c.remaining("https://b.example", 2_000)).toBe(48_000)
    expect(c.remaining("https://d.example", 2_000)).toBe(40_000)
    expect(c.remaining("https://e.example", 2_000)).toBe(10_000)
    // a host already held is updated in place, never evicting another
    c.note("https://e.example", 2_000, 45_000)
    expect(c.size()).toBe(3)
    expect(c.remaining("https://d.example", 2_000)).toBe(40_000)
    // a thousand hosts through a bound of three
    for (let i = 0; i < 1_000; i++) c.note(`https://h${i}.example`, 3_000, 1_000 + i)
    expect(c.size()).toBe(3)
    const none = make(0)
    none.note("https://a.example", 0, 1_000)
    expect(none.size()).toBe(0)
    expect(none.remaining("https://a.example", 0)).toBeUndefined()
  })
})
