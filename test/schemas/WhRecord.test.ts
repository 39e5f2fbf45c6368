import { Either } from "effect"
import { describe, expect, it } from "vitest"
import {
  isRfc3339DateTime,
  sanitizeWhRecordForDelivery,
  type ValidatedWh,
  validateWhRecord,
  type WhRecordErrorKind
} from "../../src/schemas/WhRecord.js"

const PLC = "did:plc:ewvi7nxzyoun6zhxrhs64oiz"
const PROD = { allowInsecureDev: false }

const base = (): Record<string, unknown> => ({
  $type: "place.wisp.v2.wh",
  scope: { aturi: `at://${PLC}/app.bsky.feed.post` },
  url: "https://example.com/hook",
  createdAt: "2024-05-01T12:34:56.789Z"
})

const kindOf = (input: unknown, opts = PROD): WhRecordErrorKind | "ok" =>
  Either.match(validateWhRecord(input, opts), { onLeft: (k) => k, onRight: () => "ok" as const })

const valid = (input: unknown, opts = PROD): ValidatedWh => {
  const r = validateWhRecord(input, opts)
  if (Either.isLeft(r)) throw new Error(`expected valid, got ${r.left}`)
  return r.right
}

const withField = (key: string, value: unknown): Record<string, unknown> => ({ ...base(), [key]: value })
const without = (key: string): Record<string, unknown> => {
  const r = base()
  delete r[key]
  return r
}

describe("validateWhRecord: a valid record", () => {
  it("returns a clean copy and the parsed scope", () => {
    const v = valid(base())
    expect(v.record).toEqual(base())
    expect(v.scope).toEqual({ did: PLC, collection: "app.bsky.feed.post", rkey: undefined })
  })

  it("optional fields are absent (not undefined) in the clean copy", () => {
    const { record } = valid(base())
    expect(Object.keys(record).sort()).toEqual(["$type", "createdAt", "scope", "url"])
    expect("events" in record).toBe(false)
    expect("secret" in record).toBe(false)
    expect("secretId" in record).toBe(false)
    expect("enabled" in record).toBe(false)
    expect(Object.keys(record.scope)).toEqual(["aturi"])
  })

  it("keeps every known field", () => {
    const input = {
      ...base(),
      scope: { aturi: `at://${PLC}`, backlinks: true, $type: "place.wisp.v2.wh#atUri" },
      events: ["create", "delete"],
      secret: "s3cret",
      enabled: false
    }
    const { record, scope } = valid(input)
    expect(record).toEqual(input)
    expect(scope).toEqual({ did: PLC, collection: undefined, rkey: undefined })
    expect(valid({ ...base(), secretId: "prod.key_1-A" }).record.secretId).toBe("prod.key_1-A")
    expect(valid({ ...base(), enabled: true }).record.enabled).toBe(true)
    expect(valid({ ...base(), scope: { aturi: `at://${PLC}`, backlinks: false } }).record.scope.backlinks).toBe(false)
  })

  it("drops unknown fields at the top level and inside scope", () => {
    const input = {
      ...base(),
      scope: { aturi: `at://${PLC}`, extra: 1, collection: "x" },
      bogus: "x",
      __proto__polluted: true,
      nested: { deep: true }
    }
    const { record } = valid(input)
    expect(Object.keys(record).sort()).toEqual(["$type", "createdAt", "scope", "url"])
    expect(record.scope).toEqual({ aturi: `at://${PLC}` })
  })

  it("the clean copy shares nothing mutable with the input", () => {
    const events = ["create"]
    const scope = { aturi: `at://${PLC}` }
    const input = { ...base(), events, scope }
    const { record } = valid(input)
    expect(record.events).not.toBe(events)
    expect(record.scope).not.toBe(scope)
    events.push("update")
    scope.aturi = "at://evil"
    expect(record.events).toEqual(["create"])
    expect(record.scope.aturi).toBe(`at://${PLC}`)
  })

  it("keeps the url exactly as written (not normalized)", () => {
    expect(valid(withField("url", "https://EXAMPLE.com:443/Hook")).record.url).toBe("https://EXAMPLE.com:443/Hook")
  })

  it("accepts a null-prototype object (record and scope)", () => {
    const scope = Object.assign(Object.create(null) as object, { aturi: `at://${PLC}` })
    const input = Object.assign(Object.create(null) as object, { ...base(), scope })
    expect(kindOf(input)).toBe("ok")
  })

  it("allowInsecureDev is passed to the url rules", () => {
    const input = withField("url", "http://localhost:3000/hook")
    expect(kindOf(input)).toBe("url")
    expect(kindOf(input, { allowInsecureDev: true })).toBe("ok")
  })
})

describe("validateWhRecord: events", () => {
  it.each([
    [["create"], ["create"]],
    [["update", "create"], ["update", "create"]],
    [["create", "update", "delete"], ["create", "update", "delete"]],
    [["delete"], ["delete"]]
  ])("%j is kept", (events, expected) => {
    expect(valid(withField("events", events)).record.events).toEqual(expected)
  })

  it("an empty array means all operations and is left out of the clean copy", () => {
    const { record } = valid(withField("events", []))
    expect("events" in record).toBe(false)
  })

  it.each([
    ["not an array", "create"],
    ["null", null],
    ["object", { 0: "create", length: 1 }],
    ["unknown op", ["create", "upsert"]],
    ["uppercase op", ["CREATE"]],
    // "all operations" is spelled by leaving `events` out or empty, never by a word for it
    ["all as a word", ["all"]],
    ["star", ["*"]],
    ["duplicate", ["create", "create"]],
    ["too many", ["create", "update", "delete", "create"]],
    ["four distinct-looking", ["create", "update", "delete", "x"]],
    ["number", [1]],
    ["nested", [["create"]]],
    ["hole", [, "create"]], // eslint-disable-line no-sparse-arrays
    ["undefined element", [undefined]]
  ])("%s → events", (_name, events) => {
    expect(kindOf(withField("events", events))).toBe("events")
  })

  it("an array element getter is never invoked", () => {
    let calls = 0
    const events: Array<string> = []
    Object.defineProperty(events, 0, {
      get() {
        calls++
        return "create"
      },
      enumerable: true
    })
    expect(kindOf(withField("events", events))).toBe("events")
    expect(calls).toBe(0)
  })
})

// Every error kind, with the cases that produce it.
const ERROR_CASES: ReadonlyArray<readonly [string, unknown, WhRecordErrorKind]> = [
  // not_object
  ["undefined", undefined, "not_object"],
  ["null", null, "not_object"],
  ["string", "{}", "not_object"],
  ["number", 1, "not_object"],
  ["array", [base()], "not_object"],
  ["Map", new Map(Object.entries(base())), "not_object"],
  ["Date", new Date(0), "not_object"],
  [
    "class instance",
    new (class Wh {
      $type = "place.wisp.v2.wh"
      scope = { aturi: `at://${PLC}` }
      url = "https://example.com/hook"
      createdAt = "2024-05-01T12:34:56Z"
    })(),
    "not_object"
  ],
  ["Object.create(proto) with inherited fields", Object.create(base()) as unknown, "not_object"],
  ["function", () => base(), "not_object"],
  // type
  ["$type missing", without("$type"), "type"],
  ["$type wrong", withField("$type", "place.wisp.v1.wh"), "type"],
  ["$type scope type", withField("$type", "place.wisp.v2.wh#atUri"), "type"],
  ["$type wrong case", withField("$type", "Place.wisp.v2.wh"), "type"],
  ["$type not string", withField("$type", 1), "type"],
  // scope
  ["scope missing", without("scope"), "scope"],
  ["scope string", withField("scope", `at://${PLC}`), "scope"],
  ["scope null", withField("scope", null), "scope"],
  ["scope array", withField("scope", [{ aturi: `at://${PLC}` }]), "scope"],
  [
    "scope class instance",
    withField(
      "scope",
      new (class S {
        aturi = `at://${PLC}`
      })()
    ),
    "scope"
  ],
  ["scope inherited aturi", withField("scope", Object.create({ aturi: `at://${PLC}` }) as unknown), "scope"],
  ["scope aturi missing", withField("scope", {}), "scope"],
  ["scope aturi not string", withField("scope", { aturi: 1 }), "scope"],
  ["scope handle", withField("scope", { aturi: "at://alice.bsky.social" }), "scope"],
  ["scope bad plc length", withField("scope", { aturi: "at://did:plc:abc" }), "scope"],
  ["scope uppercase plc", withField("scope", { aturi: "at://did:plc:EWVI7NXZYOUN6ZHXRHS64OIZ" }), "scope"],
  ["scope trailing slash", withField("scope", { aturi: `at://${PLC}/` }), "scope"],
  ["scope query", withField("scope", { aturi: `at://${PLC}?x` }), "scope"],
  ["scope backlinks string", withField("scope", { aturi: `at://${PLC}`, backlinks: "true" }), "scope"],
  ["scope backlinks null", withField("scope", { aturi: `at://${PLC}`, backlinks: null }), "scope"],
  ["scope $type wrong", withField("scope", { aturi: `at://${PLC}`, $type: "place.wisp.v2.wh" }), "scope"],
  ["scope $type undefined", withField("scope", { aturi: `at://${PLC}`, $type: undefined }), "scope"],
  // url
  ["url missing", without("url"), "url"],
  ["url not string", withField("url", 1), "url"],
  ["url URL object", withField("url", new URL("https://example.com/")), "url"],
  ["url http", withField("url", "http://example.com/"), "url"],
  ["url private ip", withField("url", "https://10.0.0.1/"), "url"],
  ["url localhost", withField("url", "https://localhost/"), "url"],
  ["url fragment", withField("url", "https://example.com/#"), "url"],
  ["url credentials", withField("url", "https://a:b@example.com/"), "url"],
  ["url too long", withField("url", "https://example.com/" + "a".repeat(2048)), "url"],
  ["url relative", withField("url", "/hook"), "url"],
  // events
  ["events string", withField("events", "create"), "events"],
  // secret
  ["secret empty", withField("secret", ""), "secret"],
  ["secret too long", withField("secret", "s".repeat(257)), "secret"],
  ["secret not string", withField("secret", 123), "secret"],
  ["secret null", withField("secret", null), "secret"],
  ["secret undefined", withField("secret", undefined), "secret"],
  ["secret lone surrogate", withField("secret", "ab\ud800c"), "secret"],
  ["secret lone low surrogate", withField("secret", "\udc00"), "secret"],
  ["secret and secretId", { ...base(), secret: "s3cret", secretId: "key" }, "secret"],
  // secret_id
  ["secretId empty", withField("secretId", ""), "secret_id"],
  ["secretId too long", withField("secretId", "k".repeat(65)), "secret_id"],
  ["secretId bad char", withField("secretId", "key/1"), "secret_id"],
  ["secretId space", withField("secretId", "my key"), "secret_id"],
  ["secretId not string", withField("secretId", 1), "secret_id"],
  ["secretId null", withField("secretId", null), "secret_id"],
  ["secretId invalid with secret", { ...base(), secret: "s3cret", secretId: "bad id" }, "secret_id"],
  // enabled
  ["enabled string", withField("enabled", "false"), "enabled"],
  ["enabled number", withField("enabled", 0), "enabled"],
  ["enabled null", withField("enabled", null), "enabled"],
  // created_at
  ["createdAt missing", without("createdAt"), "created_at"],
  ["createdAt not string", withField("createdAt", 1714566896000), "created_at"],
  ["createdAt Date", withField("createdAt", new Date(0)), "created_at"],
  ["createdAt garbage", withField("createdAt", "yesterday"), "created_at"],
  ["createdAt too long", withField("createdAt", "2024-05-01T12:34:56." + "1".repeat(108) + "Z"), "created_at"]
]

describe("validateWhRecord: error kinds", () => {
  it.each(ERROR_CASES)("%s → %s", (_name, input, expected) => {
    expect(kindOf(input)).toBe(expected)
  })

  it("covers every error kind", () => {
    const kinds = new Set(ERROR_CASES.map(([, , k]) => k))
    const all: ReadonlyArray<WhRecordErrorKind> = [
      "not_object",
      "type",
      "scope",
      "url",
      "events",
      "secret",
      "secret_id",
      "enabled",
      "created_at"
    ]
    for (const k of all) expect(kinds.has(k), k).toBe(true)
  })

  it("reports the first failing field in field order", () => {
    expect(kindOf({ ...base(), $type: "x", url: 1, createdAt: 1 })).toBe("type")
    expect(kindOf({ ...base(), scope: 1, url: 1 })).toBe("scope")
    expect(kindOf({ ...base(), url: 1, events: 1 })).toBe("url")
    expect(kindOf({ ...base(), events: 1, secret: "" })).toBe("events")
    expect(kindOf({ ...base(), secret: "", secretId: "" })).toBe("secret")
    expect(kindOf({ ...base(), secretId: "", enabled: 1 })).toBe("secret_id")
    expect(kindOf({ ...base(), enabled: 1, createdAt: 1 })).toBe("enabled")
  })

  it("errors are bare kinds that never carry the offending value", () => {
    const r = validateWhRecord({ ...base(), secret: "topsecretvalue", secretId: "k" }, PROD)
    expect(r).toEqual(Either.left("secret"))
    expect(JSON.stringify(r)).not.toContain("topsecretvalue")
  })

  it("accepts the secret length bounds", () => {
    expect(kindOf(withField("secret", "s"))).toBe("ok")
    expect(kindOf(withField("secret", "s".repeat(256)))).toBe("ok")
    expect(kindOf(withField("secret", "🔑".repeat(128)))).toBe("ok")
    expect(kindOf(withField("secretId", "k"))).toBe("ok")
    expect(kindOf(withField("secretId", "k".repeat(64)))).toBe("ok")
  })
})

describe("validateWhRecord: accessors and prototypes", () => {
  const spyGetter = (obj: object, key: string, value: unknown): { calls: number } => {
    const spy = { calls: 0 }
    Object.defineProperty(obj, key, {
      get() {
        spy.calls++
        return value
      },
      enumerable: true,
      configurable: true
    })
    return spy
  }

  it.each(
    [
      ["$type", "place.wisp.v2.wh", "type"],
      ["scope", { aturi: `at://${PLC}` }, "scope"],
      ["url", "https://example.com/hook", "url"],
      ["events", ["create"], "events"],
      ["secret", "s3cret", "secret"],
      ["secretId", "key", "secret_id"],
      ["enabled", true, "enabled"],
      ["createdAt", "2024-05-01T12:34:56Z", "created_at"]
    ] as const
  )("a getter for %s is never called and makes the field invalid", (key, value, expected) => {
    const input = base()
    delete input[key]
    const spy = spyGetter(input, key, value)
    expect(kindOf(input)).toBe(expected)
    expect(spy.calls).toBe(0)
  })

  it("a throwing getter is never called", () => {
    const input = base()
    delete input["url"]
    Object.defineProperty(input, "url", {
      get() {
        throw new Error("getter invoked")
      },
      enumerable: true
    })
    expect(kindOf(input)).toBe("url")
  })

  it.each([
    ["aturi", `at://${PLC}`],
    ["backlinks", true],
    ["$type", "place.wisp.v2.wh#atUri"]
  ])("a getter for scope.%s is never called and makes scope invalid", (key, value) => {
    const scope: Record<string, unknown> = { aturi: `at://${PLC}` }
    delete scope[key]
    const spy = spyGetter(scope, key, value)
    expect(kindOf(withField("scope", scope))).toBe("scope")
    expect(spy.calls).toBe(0)
  })

  it("a getter on an unknown field is ignored and never called", () => {
    const input = base()
    const spy = spyGetter(input, "bogus", 1)
    const { record } = valid(input)
    expect(spy.calls).toBe(0)
    expect("bogus" in record).toBe(false)
  })

  it("a setter-only accessor counts as invalid", () => {
    const input = base()
    delete input["createdAt"]
    Object.defineProperty(input, "createdAt", { set() {}, enumerable: true })
    expect(kindOf(input)).toBe("created_at")
  })

  it("inherited optional fields are never read", () => {
    // A null-prototype chain cannot be used (not plain); the Object.prototype itself is the only parent.
    const polluted = Object.prototype as Record<string, unknown>
    polluted["secret"] = "from-prototype"
    polluted["enabled"] = "not-a-boolean"
    try {
      const { record } = valid(base())
      expect("secret" in record && Object.hasOwn(record, "secret")).toBe(false)
      expect(Object.hasOwn(record, "enabled")).toBe(false)
    } finally {
      delete polluted["secret"]
      delete polluted["enabled"]
    }
  })

  it("non-enumerable own data properties are read (descriptor-based)", () => {
    const input = without("createdAt")
    Object.defineProperty(input, "createdAt", { value: "2024-05-01T12:34:56Z", enumerable: false })
    expect(valid(input).record.createdAt).toBe("2024-05-01T12:34:56Z")
  })

  it("a JSON own __proto__ key is just an unknown field", () => {
    const input: unknown = JSON.parse(
      `{"$type":"place.wisp.v2.wh","scope":{"aturi":"at://${PLC}"},"url":"https://example.com/",` +
        `"createdAt":"2024-05-01T12:34:56Z","__proto__":{"secret":"x","enabled":"y"}}`
    )
    const { record } = valid(input)
    expect(Object.keys(record).sort()).toEqual(["$type", "createdAt", "scope", "url"])
  })
})

describe("isRfc3339DateTime (createdAt)", () => {
  it.each([
    "2024-05-01T12:34:56Z",
    "2024-05-01T12:34:56.789Z",
    "2024-05-01T12:34:56.1Z",
    "2024-05-01T12:34:56.123456789Z",
    "2024-05-01t12:34:56z",
    "2024-05-01T12:34:56+02:00",
    "2024-05-01T12:34:56-07:30",
    "2024-05-01T12:34:56.5+23:59",
    "2024-05-01T12:34:56-00:00",
    "2024-02-29T00:00:00Z", // leap year
    "2000-02-29T00:00:00Z", // divisible by 400
    "2023-01-31T23:59:59Z",
    "2023-04-30T00:00:00Z",
    "2016-12-31T23:59:60Z", // leap second
    "0000-01-01T00:00:00Z",
    "9999-12-31T23:59:59Z",
    "2024-05-01T12:34:56." + "1".repeat(107) + "Z" // exactly 128 chars
  ])("accepts %s", (s) => {
    expect(isRfc3339DateTime(s)).toBe(true)
    expect(kindOf(withField("createdAt", s))).toBe("ok")
  })

  it.each([
    "",
    "2024-05-01",
    "2024-05-01T12:34Z",
    "2024-05-01T12:34:56",
    "2024-05-01 12:34:56Z",
    "2024-05-01_12:34:56Z",
    "2024/05-01T12:34:56Z", // each separator is checked: the one between year and month
    "2024-05/01T12:34:56Z", // between month and day
    "2024-05-01T12.34:56Z", // between hour and minute
    "2024-05-01T12:34.56Z", // between minute and second
    "2024-05-01T12:34:56.Z",
    "2024-05-01T12:34:56,5Z",
    "2024-5-01T12:34:56Z",
    "24-05-01T12:34:56Z",
    "+2024-05-01T12:34:56Z",
    "2024-00-01T12:34:56Z",
    "2024-13-01T12:34:56Z",
    "2024-01-00T12:34:56Z",
    "2024-01-32T12:34:56Z",
    "2023-02-29T12:34:56Z", // not a leap year
    "1900-02-29T12:34:56Z", // divisible by 100, not 400
    "2024-02-30T12:34:56Z",
    "2024-04-31T12:34:56Z",
    "2024-06-31T12:34:56Z",
    "2024-09-31T12:34:56Z",
    "2024-11-31T12:34:56Z",
    "2024-05-01T24:00:00Z",
    "2024-05-01T12:60:00Z",
    "2024-05-01T12:34:61Z",
    "2024-05-01T12:34:56+24:00",
    "2024-05-01T12:34:56+02:60",
    "2024-05-01T12:34:56+0200",
    "2024-05-01T12:34:56+02",
    "2024-05-01T12:34:56+02.00", // the offset's colon
    "2024-05-01T12:34:56+02:00Z",
    "2024-05-01T12:34:56ZZ",
    "2024-05-01T12:34:56Z ",
    " 2024-05-01T12:34:56Z",
    "2024-05-01T12:34:56UTC",
    "2024-05-01T1a:34:56Z",
    "2024-05-01T12:34:56.123456789",
    "２０２４-05-01T12:34:56Z",
    "2024-05-01T12:34:56." + "1".repeat(108) + "Z" // 129 chars
  ])("rejects %j", (s) => {
    expect(isRfc3339DateTime(s)).toBe(false)
    expect(kindOf(withField("createdAt", s))).toBe("created_at")
  })
})

describe("sanitizeWhRecordForDelivery", () => {
  it("removes secret and keeps everything else (unknown fields included)", () => {
    const input = { ...base(), secret: "s3cret", bogus: { x: 1 }, events: ["create"] }
    const out = sanitizeWhRecordForDelivery(input)
    expect(out).toEqual({ ...base(), bogus: { x: 1 }, events: ["create"] })
    expect(out).not.toBe(input)
    expect(input.secret).toBe("s3cret") // the input is untouched
    expect(JSON.stringify(out)).not.toContain("s3cret")
  })

  it("keeps secretId (it is a name, not a secret)", () => {
    expect(sanitizeWhRecordForDelivery({ ...base(), secretId: "key" })).toEqual({ ...base(), secretId: "key" })
  })

  it("is shallow: nested values are shared", () => {
    const input = base()
    const out = sanitizeWhRecordForDelivery(input) as Record<string, unknown>
    expect(out["scope"]).toBe(input["scope"])
  })

  it("never invokes getters and drops accessors", () => {
    let calls = 0
    const input = base()
    Object.defineProperty(input, "secret", {
      get() {
        calls++
        return "s3cret"
      },
      enumerable: true
    })
    Object.defineProperty(input, "other", {
      get() {
        calls++
        return 1
      },
      enumerable: true
    })
    const out = sanitizeWhRecordForDelivery(input)
    expect(calls).toBe(0)
    expect(out).toEqual(base())
    expect(JSON.stringify(out)).not.toContain("s3cret")
  })

  it("does not copy inherited fields or the prototype, and keeps an own __proto__ key as data", () => {
    const inherited = Object.create({ secret: "s3cret", inheritedField: 1 }) as Record<string, unknown>
    inherited["own"] = 1
    const out = sanitizeWhRecordForDelivery(inherited) as Record<string, unknown>
    expect(Object.getPrototypeOf(out)).toBe(Object.prototype)
    expect(out).toEqual({ own: 1 })
    expect("inheritedField" in out).toBe(false)

    const parsed: unknown = JSON.parse(`{"__proto__":{"polluted":true},"secret":"x","a":1}`)
    const out2 = sanitizeWhRecordForDelivery(parsed) as Record<string, unknown>
    expect(Object.getPrototypeOf(out2)).toBe(Object.prototype)
    expect(Object.keys(out2).sort()).toEqual(["__proto__", "a"])
    expect(({} as Record<string, unknown>)["polluted"]).toBeUndefined()
  })

  it("returns non-objects and arrays unchanged", () => {
    expect(sanitizeWhRecordForDelivery(null)).toBe(null)
    expect(sanitizeWhRecordForDelivery(undefined)).toBe(undefined)
    expect(sanitizeWhRecordForDelivery("x")).toBe("x")
    expect(sanitizeWhRecordForDelivery(1)).toBe(1)
    const arr = [1, 2]
    expect(sanitizeWhRecordForDelivery(arr)).toBe(arr)
  })

  it("a record without secret is copied as is", () => {
    expect(sanitizeWhRecordForDelivery(base())).toEqual(base())
  })
})

describe("validateWhRecord: scope.backlinksOnly (SPEC §1, wisp.place's newest validator)", () => {
  const scopeWith = (extra: Record<string, unknown>) => withField("scope", { aturi: `at://${PLC}`, ...extra })

  it.each([
    [{ backlinksOnly: true }],
    [{ backlinksOnly: true, backlinks: true }],
    [{ backlinksOnly: false }],
    [{ backlinksOnly: false, backlinks: false }],
    [{ backlinksOnly: false, backlinks: true }],
    [{ backlinksOnly: true, $type: "place.wisp.v2.wh#atUri" }]
  ])("%j is accepted and kept in the clean copy as written", (extra) => {
    const { record } = valid(scopeWith(extra))
    expect(record.scope).toEqual({ aturi: `at://${PLC}`, ...extra })
  })

  it.each([
    ["with backlinks: false", { backlinksOnly: true, backlinks: false }],
    ["with backlinks: false, in the other key order", { backlinks: false, backlinksOnly: true }],
    ["a string", { backlinksOnly: "true" }],
    ["a number", { backlinksOnly: 1 }],
    ["null", { backlinksOnly: null }],
    ["undefined", { backlinksOnly: undefined }]
  ])("backlinksOnly %s → scope", (_name, extra) => {
    expect(kindOf(scopeWith(extra))).toBe("scope")
  })

  it("a getter for scope.backlinksOnly is never called and makes scope invalid", () => {
    const scope: Record<string, unknown> = { aturi: `at://${PLC}` }
    let calls = 0
    Object.defineProperty(scope, "backlinksOnly", {
      get() {
        calls++
        return true
      },
      enumerable: true
    })
    expect(kindOf(withField("scope", scope))).toBe("scope")
    expect(calls).toBe(0)
  })

  it("an inherited backlinksOnly is never read", () => {
    const polluted = Object.prototype as Record<string, unknown>
    polluted["backlinksOnly"] = true
    try {
      const { record } = valid(withField("scope", { aturi: `at://${PLC}`, backlinks: false }))
      expect(record.scope).toEqual({ aturi: `at://${PLC}`, backlinks: false })
    } finally {
      delete polluted["backlinksOnly"]
    }
  })
})
