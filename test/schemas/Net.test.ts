import ipaddr from "ipaddr.js"
import { describe, expect, it } from "vitest"
import {
  cidrContains,
  classifyHost,
  isLoopbackHost,
  isPublicIpv4,
  isPublicIpv6,
  NON_PUBLIC_IPV4,
  NON_PUBLIC_IPV6,
  parseCidr,
  parseIpv4,
  parseIpv6
} from "../../src/schemas/Net.js"

const hex = (b: Uint8Array | undefined): string | undefined =>
  b === undefined ? undefined : Array.from(b, (x) => x.toString(16).padStart(2, "0")).join("")

const v4 = (s: string): Uint8Array => {
  const b = parseIpv4(s)
  if (b === undefined) throw new Error(`test literal ${s} does not parse`)
  return b
}
const v6 = (s: string): Uint8Array => {
  const b = parseIpv6(s)
  if (b === undefined) throw new Error(`test literal ${s} does not parse`)
  return b
}

describe("parseIpv4", () => {
  it.each([
    ["0.0.0.0", "00000000"],
    ["255.255.255.255", "ffffffff"],
    ["1.2.3.4", "01020304"],
    ["10.0.0.1", "0a000001"],
    ["192.168.100.200", "c0a864c8"],
    ["8.8.8.8", "08080808"]
  ])("parses %s", (s, expected) => {
    expect(hex(parseIpv4(s))).toBe(expected)
  })

  it.each([
    "",
    "1.2.3",
    "1.2.3.4.5",
    "256.1.1.1",
    "1.2.3.256",
    "1.2.3.999",
    "01.2.3.4",
    "1.2.3.04",
    "00.0.0.0",
    "1.2.3.0004",
    "0x7f.0.0.1",
    "0x7f000001",
    "127.1",
    "2130706433",
    "017700000001",
    "1..2.3",
    "1.2.3.",
    ".1.2.3",
    "1.2.3.4.",
    " 1.2.3.4",
    "1.2.3.4 ",
    "+1.2.3.4",
    "1.2.3.-4",
    "1.2.3.4/8",
    "a.b.c.d",
    "١.٢.٣.٤"
  ])("rejects %j", (s) => {
    expect(parseIpv4(s)).toBeUndefined()
  })
})

describe("parseIpv6", () => {
  it.each([
    ["::", "00000000000000000000000000000000"],
    ["::1", "00000000000000000000000000000001"],
    ["1::", "00010000000000000000000000000000"],
    ["1:2:3:4:5:6:7:8", "00010002000300040005000600070008"],
    ["2001:DB8::1", "20010db8000000000000000000000001"],
    ["2001:0db8:0000:0000:0000:0000:0000:0001", "20010db8000000000000000000000001"],
    ["fe80::1:2", "fe800000000000000000000000010002"],
    ["::1:2:3:4:5:6:7", "00000001000200030004000500060007"],
    ["1:2:3:4:5:6:7::", "00010002000300040005000600070000"],
    ["1:2:3::6:7:8", "00010002000300000000000600070008"],
    ["::ffff:127.0.0.1", "00000000000000000000ffff7f000001"],
    ["::ffff:7f00:1", "00000000000000000000ffff7f000001"],
    ["::127.0.0.1", "0000000000000000000000007f000001"],
    ["1:2:3:4:5:6:1.2.3.4", "00010002000300040005000601020304"],
    ["64:ff9b::192.0.2.33", "0064ff9b0000000000000000c0000221"],
    ["2606:4700:4700::1111", "26064700470000000000000000001111"]
  ])("parses %s", (s, expected) => {
    expect(hex(parseIpv6(s))).toBe(expected)
  })

  it.each([
    "",
    ":",
    ":::",
    "::::",
    "1::2::3",
    "1:2:3:4:5:6:7",
    "1:2:3:4:5:6:7:8:9",
    "1:2:3:4:5:6:7:8::",
    "::1:2:3:4:5:6:7:8",
    "12345::",
    "g::",
    "G::",
    "::1:G",
    ":1::",
    "1::2:",
    ":1:2:3:4:5:6:7:8",
    "1:2:3:4:5:6:7:8:",
    "::1%eth0",
    "fe80::1%25eth0",
    "fe80::1%1",
    "[::1]",
    "::ffff:1.2.3",
    "::ffff:1.2.3.04",
    "::ffff:256.1.1.1",
    "1.2.3.4::",
    "1.2.3.4",
    "::1.2.3.4:5",
    "1:2:3:4:5:6:7:1.2.3.4",
    " ::1",
    "::1 ",
    "0:0:0:0:0:0:0:0:0:0:0:0:0:0:0:0:0:0:0:0:0:0:0:0:0"
  ])("rejects %j", (s) => {
    expect(parseIpv6(s)).toBeUndefined()
  })
})

// Every range of SPEC §4.6, with addresses inside (first, last, a sample) and the neighbours just outside.
const V4_RANGES: ReadonlyArray<{ cidr: string; inside: ReadonlyArray<string>; outside: ReadonlyArray<string> }> = [
  { cidr: "0.0.0.0/8", inside: ["0.0.0.0", "0.1.2.3", "0.255.255.255"], outside: ["1.0.0.0"] },
  { cidr: "10.0.0.0/8", inside: ["10.0.0.0", "10.1.2.3", "10.255.255.255"], outside: ["9.255.255.255", "11.0.0.0"] },
  {
    cidr: "100.64.0.0/10",
    inside: ["100.64.0.0", "100.100.100.100", "100.127.255.255"],
    outside: ["100.63.255.255", "100.128.0.0"]
  },
  {
    cidr: "127.0.0.0/8",
    inside: ["127.0.0.0", "127.0.0.1", "127.255.255.255"],
    outside: ["126.255.255.255", "128.0.0.0"]
  },
  {
    cidr: "169.254.0.0/16",
    inside: ["169.254.0.0", "169.254.169.254", "169.254.255.255"],
    outside: ["169.253.255.255", "169.255.0.0"]
  },
  {
    cidr: "172.16.0.0/12",
    inside: ["172.16.0.0", "172.20.1.1", "172.31.255.255"],
    outside: ["172.15.255.255", "172.32.0.0"]
  },
  {
    cidr: "192.0.0.0/24",
    inside: ["192.0.0.0", "192.0.0.9", "192.0.0.255"],
    outside: ["191.255.255.255", "192.0.1.0"]
  },
  { cidr: "192.0.2.0/24", inside: ["192.0.2.0", "192.0.2.1", "192.0.2.255"], outside: ["192.0.1.255", "192.0.3.0"] },
  { cidr: "192.31.196.0/24", inside: ["192.31.196.1"], outside: ["192.31.195.255", "192.31.197.0"] },
  { cidr: "192.52.193.0/24", inside: ["192.52.193.1"], outside: ["192.52.192.255", "192.52.194.0"] },
  { cidr: "192.88.99.0/24", inside: ["192.88.99.1"], outside: ["192.88.98.255", "192.88.100.0"] },
  {
    cidr: "192.168.0.0/16",
    inside: ["192.168.0.0", "192.168.1.1", "192.168.255.255"],
    outside: ["192.167.255.255", "192.169.0.0"]
  },
  { cidr: "192.175.48.0/24", inside: ["192.175.48.1"], outside: ["192.175.47.255", "192.175.49.0"] },
  {
    cidr: "198.18.0.0/15",
    inside: ["198.18.0.0", "198.19.255.255", "198.18.5.5"],
    outside: ["198.17.255.255", "198.20.0.0"]
  },
  { cidr: "198.51.100.0/24", inside: ["198.51.100.7"], outside: ["198.51.99.255", "198.51.101.0"] },
  { cidr: "203.0.113.0/24", inside: ["203.0.113.7"], outside: ["203.0.112.255", "203.0.114.0"] },
  {
    cidr: "224.0.0.0/4",
    inside: ["224.0.0.0", "224.0.0.1", "239.255.255.250", "239.255.255.255"],
    outside: ["223.255.255.255"]
  },
  { cidr: "240.0.0.0/4", inside: ["240.0.0.0", "250.1.2.3", "255.255.255.255"], outside: [] }
]

describe("isPublicIpv4 (SPEC §4.6)", () => {
  it("the exported table is exactly the SPEC list", () => {
    const spec = V4_RANGES.map((r) => r.cidr).sort()
    const table = NON_PUBLIC_IPV4.map((c) => `${Array.from(c.bytes).join(".")}/${c.prefix}`).sort()
    expect(table).toEqual(spec)
  })

  for (const r of V4_RANGES) {
    it.each(r.inside)(`${r.cidr}: %s is not public`, (a) => {
      expect(isPublicIpv4(v4(a))).toBe(false)
    })
    if (r.outside.length > 0) {
      it.each(r.outside)(`${r.cidr}: neighbour %s is public`, (a) => {
        expect(isPublicIpv4(v4(a))).toBe(true)
      })
    }
  }

  it.each(["8.8.8.8", "1.1.1.1", "9.9.9.9", "93.184.216.34", "100.63.0.1", "172.32.0.1", "223.1.1.1"])(
    "public: %s",
    (a) => {
      expect(isPublicIpv4(v4(a))).toBe(true)
    }
  )

  it("rejects wrong-length byte arrays", () => {
    expect(isPublicIpv4(new Uint8Array([8, 8, 8]))).toBe(false)
    expect(isPublicIpv4(new Uint8Array(16))).toBe(false)
  })

  it("agrees with an independent integer-range model on a sweep of addresses", () => {
    const ranges = V4_RANGES.map((r) => {
      const [addr, len] = r.cidr.split("/")
      const b = v4(addr ?? "")
      const start = (((b[0] ?? 0) * 256 + (b[1] ?? 0)) * 256 + (b[2] ?? 0)) * 256 + (b[3] ?? 0)
      return { start, end: start + 2 ** (32 - Number(len)) - 1 }
    })
    let checked = 0
    for (let n = 0; n < 2 ** 32; n += 65_537 * 3) {
      const bytes = new Uint8Array([(n >>> 24) & 255, (n >>> 16) & 255, (n >>> 8) & 255, n & 255])
      const expected = !ranges.some((r) => n >= r.start && n <= r.end)
      expect(isPublicIpv4(bytes)).toBe(expected)
      checked++
    }
    expect(checked).toBeGreaterThan(20_000)
  })
})

describe("isPublicIpv6 (SPEC §4.6)", () => {
  it.each([
    // outside 2000::/3
    "::",
    "::1",
    "1fff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
    "4000::1",
    "fc00::1",
    "fd00::1",
    "fe80::1",
    "fec0::1",
    "ff02::1",
    "ff0e::1",
    // IPv4-mapped and IPv4-compatible, whatever they embed
    "::ffff:127.0.0.1",
    "::ffff:8.8.8.8",
    "::ffff:0:0",
    "::7f00:1",
    "::8.8.8.8",
    "::0.0.0.2",
    // NAT64
    "64:ff9b::8.8.8.8",
    "64:ff9b::1",
    "64:ff9b:1::1",
    "64:ff9b:1:ffff::1",
    // discard-only
    "100::1",
    "100::ffff:ffff:ffff:ffff",
    // 2001::/23 (Teredo, benchmarking, ORCHID, ...)
    "2001::1",
    "2001:0:4136:e378:8000:63bf:3fff:fdd2",
    "2001:2::1",
    "2001:10::1",
    "2001:1ff:ffff:ffff:ffff:ffff:ffff:ffff",
    // documentation
    "2001:db8::1",
    "2001:db8:ffff:ffff:ffff:ffff:ffff:ffff",
    // 6to4
    "2002::1",
    "2002:7f00:1::1",
    "2002:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
    // AS112 direct delegation
    "2620:4f:8000::1",
    "2620:4f:8000:ffff::1",
    // documentation (RFC 9637)
    "3fff::1",
    "3fff:fff:ffff::1",
    // SRv6 SIDs
    "5f00::1",
    "5f00:ffff::1"
  ])("not public: %s", (a) => {
    expect(isPublicIpv6(v6(a))).toBe(false)
  })

  it.each([
    "2606:4700:4700::1111",
    "2001:4860:4860::8888",
    "2000::1",
    "2001:200::1", // just after 2001::/23
    "2001:db7:ffff:ffff:ffff:ffff:ffff:ffff", // just before 2001:db8::/32
    "2001:db9::1", // just after 2001:db8::/32
    "2001:200::", // first address after 2001::/23
    "2003::1", // just after 2002::/16
    "2001:ffff::1",
    "2620:4f:7fff:ffff::1", // just before 2620:4f:8000::/48
    "2620:4f:8001::1", // just after
    "3ffe:ffff::1", // just before 3fff::/20
    "3fff:1000::1", // just after 3fff::/20
    "3fff:ffff:ffff:ffff:ffff:ffff:ffff:ffff" // last of 2000::/3
  ])("public: %s", (a) => {
    expect(isPublicIpv6(v6(a))).toBe(true)
  })

  it("the exclusion table covers every block the SPEC lists, plus mapped and compatible forms", () => {
    const listed = NON_PUBLIC_IPV6.map((c) => `${hex(c.bytes)}/${c.prefix}`)
    for (
      const s of [
        "::ffff:0:0/96",
        "::/96",
        "64:ff9b::/96",
        "64:ff9b:1::/48",
        "100::/64",
        "2001::/23",
        "2001:db8::/32",
        "2002::/16",
        "2620:4f:8000::/48",
        "3fff::/20",
        "5f00::/16"
      ]
    ) {
      const c = parseCidr(s)
      expect(c, s).toBeDefined()
      expect(listed).toContain(`${hex(c?.bytes)}/${c?.prefix}`)
    }
    expect(listed).toHaveLength(11)
  })

  it("rejects wrong-length byte arrays", () => {
    expect(isPublicIpv6(new Uint8Array(4))).toBe(false)
    expect(isPublicIpv6(new Uint8Array(15).fill(0x26))).toBe(false)
  })
})

describe("classifyHost", () => {
  it.each(
    [
      ["8.8.8.8", "ipv4", true],
      ["1.1.1.1", "ipv4", true],
      ["127.0.0.1", "ipv4", false],
      ["10.1.2.3", "ipv4", false],
      ["[::1]", "ipv6", false],
      ["::1", "ipv6", false],
      ["[2606:4700:4700::1111]", "ipv6", true],
      ["2606:4700:4700::1111", "ipv6", true],
      ["[::ffff:7f00:1]", "ipv6", false],
      ["[::ffff:8.8.8.8]", "ipv6", false],
      ["[::7f00:1]", "ipv6", false]
    ] as const
  )("%s → %s public=%s", (host, kind, pub) => {
    const c = classifyHost(host)
    expect(c.kind).toBe(kind)
    expect(c.kind === "ipv4" || c.kind === "ipv6" ? c.public : undefined).toBe(pub)
  })

  it("returns the address bytes", () => {
    const c = classifyHost("[::1]")
    expect(c.kind === "ipv6" ? hex(c.bytes) : undefined).toBe("00000000000000000000000000000001")
  })

  it.each([
    "example.com",
    "example.com.",
    "localhost",
    "xn--nxasmq6b.com",
    "a-b.c0m",
    "1.2.3.4.example",
    // a last label that starts with 0x but is not hex is a name (a WHATWG URL parser takes it as one)
    "foo.0xg",
    "foo.0x1g"
  ])(
    "%s → name",
    (host) => {
      expect(classifyHost(host).kind).toBe("name")
    }
  )

  it.each([
    "",
    "[fe80::1%eth0]",
    "[fe80::1%25eth0]",
    "fe80::1%eth0",
    "[::1",
    "[]",
    "[1.2.3.4]",
    "[example.com]",
    "1:2",
    // not a canonical dotted quad, but a resolver (inet_aton) or URL parser would read it as an address
    "127.1",
    "0x7f.1",
    "0x7f000001",
    "2130706433",
    "017700000001",
    "1.2.3.4.5",
    "foo.123",
    "foo.0x1f",
    // a bare 0x is the number 0 to a WHATWG URL parser
    "foo.0x",
    "foo.0X",
    "1.2.3.4."
  ])("%j → invalid (callers reject)", (host) => {
    expect(classifyHost(host).kind).toBe("invalid")
  })
})

describe("parseCidr / cidrContains", () => {
  it.each(
    [
      ["10.0.0.0/8", 4, 8, "0a000000"],
      ["0.0.0.0/0", 4, 0, "00000000"],
      ["192.168.1.7/32", 4, 32, "c0a80107"],
      ["100.64.0.0/10", 4, 10, "64400000"],
      ["fd00::/8", 6, 8, "fd000000000000000000000000000000"],
      ["::/0", 6, 0, "00000000000000000000000000000000"],
      ["::1/128", 6, 128, "00000000000000000000000000000001"],
      ["2001:db8::/32", 6, 32, "20010db8000000000000000000000000"],
      ["::ffff:10.0.0.0/104", 6, 104, "00000000000000000000ffff0a000000"]
    ] as const
  )("parses %s", (s, family, prefix, bytes) => {
    const c = parseCidr(s)
    expect(c?.family).toBe(family)
    expect(c?.prefix).toBe(prefix)
    expect(hex(c?.bytes)).toBe(bytes)
  })

  it.each([
    "",
    "10.0.0.0",
    "10.0.0.0/",
    "/8",
    "10.0.0.0/33",
    "10.0.0.0/08",
    "10.0.0.0/-1",
    "10.0.0.0/ 8",
    "10.0.0.0/8/8",
    "10.0.0.0/1000",
    "10.1.0.0/8", // host bits set
    "10.0.0.1/31",
    "fd00::/129",
    "fd00::1/64",
    "fe80::%eth0/64",
    "010.0.0.0/8",
    "10.0/8",
    "example.com/8"
  ])("rejects %j", (s) => {
    expect(parseCidr(s)).toBeUndefined()
  })

  const contains = (cidr: string, addr: string): boolean => {
    const c = parseCidr(cidr)
    if (c === undefined) throw new Error(cidr)
    const b = addr.includes(":") ? v6(addr) : v4(addr)
    return cidrContains(c, b)
  }

  it.each(
    [
      ["10.0.0.0/8", "10.0.0.0", true],
      ["10.0.0.0/8", "10.255.255.255", true],
      ["10.0.0.0/8", "11.0.0.0", false],
      ["10.0.0.0/8", "9.255.255.255", false],
      ["172.16.0.0/12", "172.31.0.1", true],
      ["172.16.0.0/12", "172.32.0.1", false],
      ["192.168.1.7/32", "192.168.1.7", true],
      ["192.168.1.7/32", "192.168.1.8", false],
      ["0.0.0.0/0", "8.8.8.8", true],
      ["fd00::/8", "fd12:3456::1", true],
      ["fd00::/8", "fc00::1", false],
      ["2001:db8::/33", "2001:db8:7fff::1", true],
      ["2001:db8::/33", "2001:db8:8000::1", false],
      ["::/0", "2606:4700:4700::1111", true],
      // families never mix
      ["10.0.0.0/8", "::ffff:10.0.0.1", false],
      ["::/0", "10.0.0.1", false],
      ["::ffff:10.0.0.0/104", "10.0.0.1", false],
      ["::ffff:10.0.0.0/104", "::ffff:10.0.0.1", true]
    ] as const
  )("%s contains %s: %s", (cidr, addr, expected) => {
    expect(contains(cidr, addr)).toBe(expected)
  })
})

describe("isLoopbackHost (insecure development mode, SPEC §1.2 / §6.5)", () => {
  it.each(["localhost", "127.0.0.1", "127.255.255.254", "127.1.2.3", "[::1]", "::1"])("%s is loopback", (host) => {
    expect(isLoopbackHost(host)).toBe(true)
  })
  it.each([
    "127.evil.example",
    "127.0.0.1.evil.example",
    "127.0.0.1.nip.io",
    "localhost.evil.example",
    "evil.localhost",
    "localhost.",
    "127.1",
    "0x7f.0.0.1",
    "[::ffff:127.0.0.1]",
    "[::ffff:7f00:1]",
    "[::2]",
    "[::101]",
    "[::1:1]",
    "[::1%lo]",
    "128.0.0.1",
    "0.0.0.0",
    ""
  ])("%s is not", (host) => {
    expect(isLoopbackHost(host)).toBe(false)
  })
})

// ipaddr.js decides what an address is; Net.ts only refuses notations the library alone would
// accept (docs/decisions.md, "Delivery transport"). Each case: the library takes it, Net.ts does not
// (or reads it as RFC 4291 does), so a later version of the library cannot widen what firehook admits.
describe("notations ipaddr.js accepts and Net.ts refuses", () => {
  it.each(
    [
      ["127.1", parseIpv4],
      ["0x7f.0.0.1", parseIpv4],
      ["2130706433", parseIpv4],
      ["0177.0.0.1", parseIpv4],
      ["::ffff:0x7f.0.0.1", parseIpv6],
      ["::ffff:0177.0.0.1", parseIpv6],
      ["::ffff:01.2.3.4", parseIpv6],
      ["fe80::1%eth0", parseIpv6],
      ["fe80::1%1", parseIpv6]
    ] as const
  )("%s", (s, parse) => {
    expect(ipaddr.isValid(s)).toBe(true)
    expect(parse(s)).toBeUndefined()
  })

  it.each(["10.0.0.0/08", "10.0.0.0/008", "10.1.0.0/8", "::ffff:0x0a.0.0.0/104", "fe80::%eth0/64"])("%s", (s) => {
    expect(ipaddr.isValidCIDR(s)).toBe(true)
    expect(parseCidr(s)).toBeUndefined()
  })

  it("::a.b.c.d is the IPv4-compatible address (RFC 4291), not the mapped one the library makes of it", () => {
    expect(ipaddr.IPv6.parse("::127.0.0.1").toNormalizedString()).toBe("0:0:0:0:0:ffff:7f00:1")
    expect(hex(parseIpv6("::127.0.0.1"))).toBe("0000000000000000000000007f000001")
    expect(hex(parseCidr("::10.0.0.0/104")?.bytes)).toBe("0000000000000000000000000a000000")
  })
})

// classifyHost keeps recent answers (at most 1,024 strings of at most 255 characters): the second
// classification of a string must be the first's, also after the map started over, and a longer
// string is still classified (not kept).
describe("classifyHost's kept answers", () => {
  const hosts = [
    "127.0.0.1",
    "8.8.8.8",
    "[::1]",
    "[2606:4700:4700::1111]",
    "2001:db8::1",
    "::ffff:127.0.0.1",
    "receiver.example.com",
    "127.1",
    "[fe80::1%25eth0]",
    `${"a".repeat(250)}.com`,
    `${"a".repeat(300)}.example`
  ]
  const view = (c: ReturnType<typeof classifyHost>) =>
    c.kind === "ipv4" || c.kind === "ipv6" ? `${c.kind} ${hex(c.bytes)} ${c.public}` : c.kind

  it("answers a string again as the first time, across more strings than it keeps", () => {
    const first = hosts.map((h) => view(classifyHost(h)))
    expect(first).toEqual([
      "ipv4 7f000001 false",
      "ipv4 08080808 true",
      "ipv6 00000000000000000000000000000001 false",
      "ipv6 26064700470000000000000000001111 true",
      "ipv6 20010db8000000000000000000000001 false",
      "ipv6 00000000000000000000ffff7f000001 false",
      "name",
      "invalid",
      "invalid",
      "name",
      "name"
    ])
    for (let round = 0; round < 3; round++) {
      for (let i = 0; i < 1_500; i++) classifyHost(`10.${round}.${i >> 8}.${i & 255}`)
      expect(hosts.map((h) => view(classifyHost(h)))).toEqual(first)
    }
  })
})

// ipaddr.js's own predicate `IPv4.isIPv4` throws on a part such as `09` or `08` (a leading zero
// that is not octal); every such input is refused, never thrown: a header (X-Forwarded-For), a
// configuration value and a DNS answer reach these functions.
describe("inputs on which the library throws", () => {
  it.each(["09.1.2.3", "1.2.3.09", "08.0.0.1", "::ffff:1.2.3.08", "::09.1.2.3", "[::ffff:09.1.2.3]"])(
    "%s is refused",
    (s) => {
      expect(parseIpv4(s)).toBeUndefined()
      expect(parseIpv6(s)).toBeUndefined()
      expect(parseCidr(s)).toBeUndefined()
      expect(classifyHost(s).kind).toBe("invalid")
      expect(isLoopbackHost(s)).toBe(false)
    }
  )

  it("a block with such a part is refused", () => {
    expect(parseCidr("10.0.0.09/8")).toBeUndefined()
    expect(parseCidr("::ffff:10.0.0.08/104")).toBeUndefined()
  })
})
