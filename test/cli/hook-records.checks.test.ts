/**
 * The owners' record library (src/cli/HookRecords.ts, HookErrors.ts, HookOptions.ts) before and
 * after signing in: the record from arguments and what it refuses, the connection and the
 * environment, a PDS's failure as one line, and list's summary of a stored record; never a secret,
 * a password or a PDS's message in what it returns (SPEC §1, §8.6; README "hooks").
 * test/cli/hooks-cli.test.ts runs the commands as processes against a real PDS and firehook.
 */
import { describe, expect, it } from "@effect/vitest"
import { ConfigProvider, Effect, Either, Option, Redacted } from "effect"
import { classify, PdsRedirect } from "../../src/cli/HookErrors.js"
import * as Hooks from "../../src/cli/HookRecords.js"
import { PDS_DID } from "./hook-records-fake-pds.js"
import { draft, POSTS, refusal, URL_A, WH } from "./hook-records-support.js"

describe("firehook hooks: the record from arguments (checkDraft, before signing in)", () => {
  it("a draft the service would accept passes; each refused field has its own one-line message", () => {
    expect(refusal(draft())).toBeUndefined()
    expect(refusal(draft({ scope: { _tag: "AtUri", aturi: POSTS }, backlinks: true, events: ["create", "delete"] })))
      .toBeUndefined()
    expect(refusal(draft({ scope: { _tag: "Collection", collection: "app.bsky.feed.*" } }))).toBeUndefined()
    expect(refusal(draft({ scope: { _tag: "Collection", collection: "no/such" } }))).toBe(
      "invalid --collection: must be a collection NSID (app.bsky.feed.post) or a glob (app.bsky.feed.*)"
    )
    // a collection that would make a valid at-uri with the own DID only by accident: a path
    expect(refusal(draft({ scope: { _tag: "Collection", collection: "app.bsky.feed.post/rkey" } }))).toMatch(
      /^invalid --collection:/
    )
    for (const aturi of ["at://owner.test/app.bsky.feed.post", `${POSTS}?x=1`, `${POSTS}#f`, "https://example.com"]) {
      expect(refusal(draft({ scope: { _tag: "AtUri", aturi } })), aturi).toMatch(
        /^invalid --scope: must be at:\/\/<did>\[\/<collection>\[\/<rkey>\]\] with a canonical DID/
      )
    }
    const events = "invalid --events: a comma-separated list of create, update, delete, each at most once"
    expect(refusal(draft({ events: ["create", "create"] }))).toBe(events)
    expect(refusal(draft({ events: ["create", "upsert"] }))).toBe(events)
    expect(refusal(draft({ events: ["create", "update", "delete"] }))).toBeUndefined()
    expect(refusal(draft({ events: ["update"] }))).toBeUndefined()
  })

  it("secrets: an inline secret of 1-256 characters, a secret id of the service's syntax; never in a message", () => {
    const secret = (s: string) => draft({ signing: { _tag: "Secret", secret: Redacted.make(s) } })
    expect(refusal(secret("x"))).toBeUndefined()
    expect(refusal(secret("s".repeat(256)))).toBeUndefined()
    expect(refusal(secret(""))).toBe("invalid --secret: must be 1-256 characters")
    expect(refusal(secret("s".repeat(257)))).toBe("invalid --secret: must be 1-256 characters")
    const id = (name: string) => draft({ signing: { _tag: "SecretId", name } })
    expect(refusal(id("main.key_2-b"))).toBeUndefined()
    expect(refusal(id("n".repeat(64)))).toBeUndefined()
    expect(refusal(id("bad name"))).toBe("invalid --secret-id: must match ^[A-Za-z0-9._-]{1,64}$")
    expect(refusal(id("n".repeat(65)))).toBe("invalid --secret-id: must match ^[A-Za-z0-9._-]{1,64}$")
    expect(refusal(draft({ signing: { _tag: "Generate" } }))).toBeUndefined()
  })

  it("--rkey is a record key (1-512 of [A-Za-z0-9._~:%@+-], not . or ..); <rkey> of enable/disable/delete too", () => {
    const rkey = (k: string) => draft({ rkey: Option.some(k) })
    expect(refusal(rkey("sentinel"))).toBeUndefined()
    expect(refusal(rkey("k".repeat(512)))).toBeUndefined()
    expect(refusal(rkey("a%20b~c:d@e+f-g_h.i"))).toBeUndefined()
    const bad = "invalid --rkey: must be a record key ([A-Za-z0-9._~:%@+-], 1-512 characters, not . or ..)"
    for (const k of ["a/b", "", "k".repeat(513), "a b", ".", ".."]) expect(refusal(rkey(k)), k).toBe(bad)
    expect(Hooks.checkRkey("3lhook")).toEqual(Either.right("3lhook"))
    for (const k of ["a/b", "", "k".repeat(513)]) {
      expect(Either.getLeft(Hooks.checkRkey(k)).pipe(Option.map((e) => e.text))).toEqual(
        Option.some("invalid <rkey>: must be a record key")
      )
    }
  })

  it("--url: the service's rules, with the reason (and the insecure development mode's) but never the URL", () => {
    const url = (u: string, dev = false) => refusal(draft({ url: u }), dev)
    const needsDev =
      " (http:// to a loopback host needs WEBHOOK_ALLOW_INSECURE_DEV=1 with NODE_ENV=development or test)"
    expect(url("ftp://example.com/hook")).toBe(`invalid --url: must be https://${needsDev}`)
    expect(url("http://127.0.0.1:9/hook")).toBe(`invalid --url: must be https://${needsDev}`)
    expect(url("http://127.0.0.1:9/hook", true)).toBeUndefined()
    expect(url("http://example.com/hook", true)).toBe(
      "invalid --url: must be https:// (insecure development mode allows http:// to a loopback host only)"
    )
    expect(url("https://user:pw@example.com/hook")).toBe("invalid --url: must not contain a user name or password")
    expect(url("https://example.com/hook#f")).toBe("invalid --url: must not contain a #fragment")
    expect(url("https://10.0.0.1/hook")).toBe(`invalid --url: a literal IP address must be public${needsDev}`)
    expect(url("https://metadata.google.internal/hook")).toMatch(/^invalid --url: this host is never allowed/)
    expect(url(`https://example.com/${"p".repeat(2048)}`)).toBe("invalid --url: must be at most 2048 characters")
  })

  it("--events as given: split on commas, trimmed", () => {
    expect(Hooks.parseEvents("create")).toEqual(["create"])
    expect(Hooks.parseEvents(" create , delete")).toEqual(["create", "delete"])
    expect(Hooks.parseEvents("create,,delete")).toEqual(["create", "", "delete"])
  })
})

describe("firehook hooks: connection and environment", () => {
  const given = (o: { pds?: string; identifier?: string; password?: string } = {}) => ({
    pds: Option.fromNullable(o.pds),
    identifier: Option.fromNullable(o.identifier),
    password: Option.map(Option.fromNullable(o.password), Redacted.make)
  })
  const withEnv = <A, E>(env: Record<string, string>, self: Effect.Effect<A, E>) =>
    Effect.withConfigProvider(self, ConfigProvider.fromMap(new Map(Object.entries(env))))

  it("--pds: https://, or http:// to a loopback host only; no credentials, query or fragment", () => {
    for (
      const ok of [
        "https://pds.example.com",
        "https://pds.example.com:8443/base",
        "http://127.0.0.1:2583",
        "http://localhost:2583",
        "http://[::1]:2583",
        "http://127.9.8.7"
      ]
    ) {
      expect(Either.isRight(Hooks.parsePdsUrl(ok)), ok).toBe(true)
    }
    for (
      const bad of [
        "http://example.com",
        "http://10.0.0.1",
        "http://localhost.example.com",
        "ftp://pds.example.com",
        "https://u:p@pds.example.com",
        "https://:p@pds.example.com",
        "https://pds.example.com/?x=1",
        "https://pds.example.com/#f",
        "https://pds example.com",
        "pds.example.com",
        ""
      ]
    ) {
      expect(Either.getLeft(Hooks.parsePdsUrl(bad)).pipe(Option.map((e) => e.text)), bad).toEqual(
        Option.some(
          "invalid --pds: must be an https:// URL (http:// only to a loopback host: localhost, 127.0.0.0/8 or [::1]) without credentials, query or fragment"
        )
      )
    }
  })

  it.effect("the options win over the environment; ATPROTO_PDS defaults to https://bsky.social", () =>
    Effect.gen(function*() {
      const env = {
        ATPROTO_PDS: "https://env.example.com",
        ATPROTO_IDENTIFIER: "env.test",
        ATPROTO_APP_PASSWORD: "envpw"
      }
      const fromEnv = yield* withEnv(env, Hooks.connection(given()))
      expect({ ...fromEnv, password: Redacted.value(fromEnv.password) }).toEqual({
        pds: "https://env.example.com/",
        identifier: "env.test",
        password: "envpw"
      })
      const fromFlags = yield* withEnv(
        env,
        Hooks.connection(given({ pds: "https://flag.example.com", identifier: "flag.test", password: "flagpw" }))
      )
      expect({ ...fromFlags, password: Redacted.value(fromFlags.password) }).toEqual({
        pds: "https://flag.example.com/",
        identifier: "flag.test",
        password: "flagpw"
      })
      const byDefault = yield* withEnv(
        { ATPROTO_IDENTIFIER: "a.test", ATPROTO_APP_PASSWORD: "pw" },
        Hooks.connection(given())
      )
      expect(byDefault.pds).toBe("https://bsky.social/")
      // an empty variable counts as unset
      const emptyPds = yield* withEnv(
        { ATPROTO_PDS: "", ATPROTO_IDENTIFIER: "a.test", ATPROTO_APP_PASSWORD: "pw" },
        Hooks.connection(given())
      )
      expect(emptyPds.pds).toBe("https://bsky.social/")
    }))

  it.effect("a missing or malformed identifier, a missing password: invalid (exit 2), the password never shown", () =>
    Effect.gen(function*() {
      const refused = (env: Record<string, string>, g = given()) =>
        withEnv(env, Hooks.connection(g)).pipe(Effect.flip, Effect.map((e) => e.text))
      expect(yield* refused({ ATPROTO_APP_PASSWORD: "pw" })).toBe(
        "missing --identifier (or ATPROTO_IDENTIFIER): the handle, DID or email to sign in as"
      )
      const rule = "must be a handle, DID or email of 1-256 characters without spaces"
      // a value from the environment is named by its variable too (before 6 December 2026: by the flag alone)
      const fromEnv = `invalid --identifier (ATPROTO_IDENTIFIER): ${rule}`
      expect(yield* refused({ ATPROTO_IDENTIFIER: "a b", ATPROTO_APP_PASSWORD: "pw" })).toBe(fromEnv)
      expect(yield* refused({ ATPROTO_IDENTIFIER: "i".repeat(257), ATPROTO_APP_PASSWORD: "pw" })).toBe(fromEnv)
      expect(yield* refused({ ATPROTO_APP_PASSWORD: "pw" }, given({ identifier: "" }))).toBe(
        `invalid --identifier: ${rule}`
      )
      const longest = yield* withEnv(
        { ATPROTO_IDENTIFIER: "i".repeat(256), ATPROTO_APP_PASSWORD: "pw" },
        Hooks.connection(given())
      )
      expect(longest.identifier).toHaveLength(256)
      const missing = "missing password: set ATPROTO_APP_PASSWORD (or pass --password)"
      expect(yield* refused({ ATPROTO_IDENTIFIER: "a.test" })).toBe(missing)
      expect(yield* refused({ ATPROTO_IDENTIFIER: "a.test" }, given({ password: "" }))).toBe(missing)
      expect(yield* refused({ ATPROTO_IDENTIFIER: "a.test", ATPROTO_PDS: "http://pds.example.com" })).toMatch(
        /^invalid --pds \(ATPROTO_PDS\):/
      )
    }))

  it.effect("insecure development mode: WEBHOOK_ALLOW_INSECURE_DEV=1 only with NODE_ENV=development|test", () =>
    Effect.gen(function*() {
      const mode = (env: Record<string, string>) => withEnv(env, Effect.either(Hooks.allowInsecureDevFromEnv))
      expect(yield* mode({})).toEqual(Either.right(false))
      expect(yield* mode({ WEBHOOK_ALLOW_INSECURE_DEV: "0", NODE_ENV: "test" })).toEqual(Either.right(false))
      expect(yield* mode({ WEBHOOK_ALLOW_INSECURE_DEV: "1", NODE_ENV: "test" })).toEqual(Either.right(true))
      expect(yield* mode({ WEBHOOK_ALLOW_INSECURE_DEV: "1", NODE_ENV: "development" })).toEqual(Either.right(true))
      for (
        const env of [{ WEBHOOK_ALLOW_INSECURE_DEV: "1" }, { WEBHOOK_ALLOW_INSECURE_DEV: "1", NODE_ENV: "production" }]
      ) {
        const e = yield* mode(env)
        expect(Either.isLeft(e)).toBe(true)
        expect(Either.getLeft(e).pipe(Option.map((x) => x.text), Option.getOrElse(() => ""))).toContain(
          "WEBHOOK_ALLOW_INSECURE_DEV"
        )
      }
      expect(Either.isLeft(yield* mode({ WEBHOOK_ALLOW_INSECURE_DEV: "yes", NODE_ENV: "test" }))).toBe(true)
      expect(Either.isLeft(yield* mode({ NODE_ENV: "staging" }))).toBe(true)
    }))
})

describe("firehook hooks: a PDS's failure as one line (classify)", () => {
  const xrpc = (status: number, error: string) => ({ status, error, message: "free text from the PDS: s3cret" })

  it("status and error name only, never the PDS's message; the reason decides the exit code's kind", () => {
    const c = (op: Parameters<typeof classify>[0], e: unknown) => {
      const f = classify(op, "pds.example.com", e)
      return [f.reason, f.text]
    }
    expect(c("login", xrpc(401, "AuthenticationRequired"))).toEqual([
      "login",
      "login failed: invalid identifier or password"
    ])
    // by name before the status: the reference PDS sends a taken-down account (and an entryway a
    // sign-in code request) with 401, which is not a wrong password
    for (const status of [400, 401]) {
      expect(c("login", xrpc(status, "AuthFactorTokenRequired"))).toEqual([
        "login",
        "login failed: the account requires a sign-in code; use an app password"
      ])
      expect(c("login", xrpc(status, "AccountTakedown"))).toEqual(["login", "login failed: the account is taken down"])
    }
    expect(c("login", xrpc(400, "Odd Name!<x>"))).toEqual(["login", "login failed: the PDS answered 400 OddNamex"])
    expect(c("login", xrpc(400, ""))).toEqual(["login", "login failed: the PDS answered 400 error"])
    expect(c("login", xrpc(429, "RateLimitExceeded"))).toEqual([
      "rate_limited",
      "the PDS rate-limited login (429); try again later"
    ])
    expect(c("getRecord", xrpc(400, "RecordNotFound"))).toEqual(["not_found", "no such webhook record"])
    expect(c("putRecord", xrpc(400, "InvalidSwap"))).toEqual([
      "conflict",
      "the record changed meanwhile (or already exists); nothing written"
    ])
    expect(c("putRecord", xrpc(401, "ExpiredToken"))).toEqual([
      "login",
      "the PDS refused putRecord (401 ExpiredToken)"
    ])
    expect(c("deleteRecord", xrpc(403, "Forbidden"))).toEqual([
      "login",
      "the PDS refused deleteRecord (403 Forbidden)"
    ])
    expect(c("createRecord", xrpc(500, "InternalServerError"))).toEqual([
      "pds",
      "the PDS refused createRecord (500 InternalServerError)"
    ])
    expect(c("createRecord", xrpc(400, "x".repeat(100)))).toEqual([
      "pds",
      `the PDS refused createRecord (400 ${"x".repeat(64)})`
    ])
    expect(c("listRecords", new TypeError("fetch failed"))).toEqual([
      "unreachable",
      "could not reach the PDS at pds.example.com (listRecords)"
    ])
    expect(c("listRecords", { status: 1, error: "Unknown" })).toEqual([
      "unreachable",
      "could not reach the PDS at pds.example.com (listRecords)"
    ])
    // below 100 is no HTTP answer (the client's own codes); an answer without an error name is "error"
    expect(c("listRecords", { status: 99, error: "InternalServerError" })).toEqual([
      "unreachable",
      "could not reach the PDS at pds.example.com (listRecords)"
    ])
    expect(c("createRecord", { status: 502 })).toEqual(["pds", "the PDS refused createRecord (502 error)"])
    expect(c("login", { status: 400, error: 7 })).toEqual(["login", "login failed: the PDS answered 400 error"])
    expect(c("listRecords", { status: 2, error: "InvalidResponse" })).toEqual([
      "invalid_response",
      "the PDS sent an invalid response to listRecords"
    ])
    // a redirect refused by the session's fetch (XRPCError.from keeps it as the cause), never followed
    const redirect = new PdsRedirect({ status: 307 })
    expect(c("login", redirect)).toEqual(["login", "login failed: the PDS answered 307, a redirect (not followed)"])
    expect(c("login", Object.assign(new Error("x", { cause: redirect }), { status: 404, error: "XRPCNotSupported" })))
      .toEqual(["login", "login failed: the PDS answered 307, a redirect (not followed)"])
    expect(c("listRecords", new Error("x", { cause: new PdsRedirect({ status: 308 }) }))).toEqual([
      "pds",
      "the PDS refused listRecords (308, a redirect, not followed)"
    ])
    // a getter is never invoked: only own data properties are read
    const getter = Object.defineProperty({}, "status", { get: () => 401, enumerable: true })
    expect(c("listRecords", getter)[0]).toBe("unreachable")
  })
})

describe("firehook hooks: list's summary of a stored record (summarize)", () => {
  const uri = `at://${PDS_DID}/${WH}/3lhook`
  const base = { $type: WH, scope: { aturi: POSTS }, url: URL_A, createdAt: "2026-01-02T03:04:05.000Z" }

  it("the fields as stored, the signing kind but never the secret, the URL only as a field, firehook's verdict", () => {
    expect(Hooks.summarize({ uri, cid: "bafyc", value: base }, false)).toEqual({
      rkey: "3lhook",
      uri,
      cid: "bafyc",
      scope: POSTS,
      backlinks: false,
      backlinksOnly: false,
      events: [],
      enabled: true,
      signing: "none",
      secretId: undefined,
      createdAt: "2026-01-02T03:04:05.000Z",
      url: URL_A,
      validation: "ok"
    })
    const secret = "inline-secret-value"
    const full = Hooks.summarize({
      uri,
      cid: "bafyc",
      value: {
        ...base,
        scope: { aturi: POSTS, backlinks: true },
        events: ["create", 7, "delete"],
        secret,
        enabled: false
      }
    }, false)
    expect(full).toMatchObject({ backlinks: true, events: ["create", "delete"], enabled: false, signing: "secret" })
    expect(JSON.stringify(full)).not.toContain(secret)
    expect(Hooks.summarize({ uri, cid: "c", value: { ...base, secretId: "main" } }, false)).toMatchObject({
      signing: "secretId",
      secretId: "main",
      validation: "ok"
    })
    // backlinksOnly (SPEC §1) fires for backlinks only and implies backlinks; only exactly true counts
    const only = (scope: unknown) => Hooks.summarize({ uri, cid: "c", value: { ...base, scope } }, false)
    expect(only({ aturi: POSTS, backlinksOnly: true })).toMatchObject({
      backlinks: true,
      backlinksOnly: true,
      validation: "ok"
    })
    expect(only({ aturi: POSTS, backlinks: true, backlinksOnly: true })).toMatchObject({
      backlinks: true,
      backlinksOnly: true
    })
    expect(only({ aturi: POSTS, backlinksOnly: "yes" })).toMatchObject({ backlinks: false, backlinksOnly: false })
    // an enabled flag that is not exactly false counts as enabled (the service's default)
    expect(Hooks.summarize({ uri, cid: "c", value: { ...base, enabled: true } }, false).enabled).toBe(true)
  })

  it("what firehook would refuse is named by its error kind, with the same insecure development mode", () => {
    const s = (value: unknown, dev = false) => Hooks.summarize({ uri, cid: "c", value }, dev).validation
    expect(s({ ...base, url: "http://127.0.0.1:9/h" })).toBe("url")
    expect(s({ ...base, url: "http://127.0.0.1:9/h" }, true)).toBe("ok")
    expect(s({ ...base, secret: "a", secretId: "b" })).toBe("secret")
    expect(s({ ...base, events: ["create", "create"] })).toBe("events")
    expect(s({ ...base, createdAt: "yesterday" })).toBe("created_at")
    expect(s("not an object")).toBe("not_object")
    const odd = Hooks.summarize({ uri, cid: "c", value: { scope: "x", url: 5, events: "create" } }, false)
    expect(odd).toMatchObject({ scope: undefined, url: undefined, events: [], createdAt: undefined })
    // only own data properties: a getter is never called
    const trap = Object.defineProperty({ ...base }, "enabled", { get: () => false, enumerable: true })
    expect(Hooks.summarize({ uri, cid: "c", value: trap }, false).enabled).toBe(true)
  })
})
