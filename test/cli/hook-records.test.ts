/**
 * The owners' record library (src/cli/HookRecords.ts, HookErrors.ts, HookOptions.ts) in-process,
 * against a tiny PDS on a real socket (./hook-records-fake-pds.ts): what it writes (the record's
 * exact fields, the swap values, the pages asked for), what it refuses before signing in, and what
 * it never returns or prints (SPEC §1, §8.6; README "hooks"). test/cli/hooks-cli.test.ts runs the
 * commands as processes against a real PDS and firehook.
 *
 * The last block runs `firehook hooks create|list|enable|disable|delete` (HooksCommand.ts)
 * in-process too, with its output captured.
 */
import { describe, expect, it } from "@effect/vitest"
import { ConfigProvider, Effect, Either, Option, Redacted, TestClock } from "effect"
import { classify } from "../../src/cli/HookErrors.js"
import * as Hooks from "../../src/cli/HookRecords.js"
import { hooks } from "../../src/cli/HooksCommand.js"
import { type FakePds, fakePds, PDS_DID, PDS_HANDLE, PDS_PASSWORD, writes } from "./hook-records-fake-pds.js"
import { runInProcess } from "./inProcess.js"

const WH = "place.wisp.v2.wh"
const POSTS = `at://${PDS_DID}/app.bsky.feed.post`
const URL_A = "https://receiver.example.com/hook-a"

const draft = (over: Partial<Hooks.Draft> = {}): Hooks.Draft => ({
  scope: { _tag: "Collection", collection: "app.bsky.feed.post" },
  backlinks: false,
  events: [],
  url: URL_A,
  signing: { _tag: "None" },
  enabled: true,
  rkey: Option.none(),
  ...over
})

/** The one-line message of a refused draft (`undefined` when accepted). */
const refusal = (d: Hooks.Draft, allowInsecureDev = false): string | undefined =>
  Either.match(Hooks.checkDraft(d, allowInsecureDev), { onLeft: (e) => e.text, onRight: () => undefined })

const conn = (pds: FakePds, password = PDS_PASSWORD): Hooks.Connection => ({
  pds: pds.url,
  identifier: PDS_HANDLE,
  password: Redacted.make(password)
})

/** `f` with the library signed in to the fake PDS (the session ends with the scope). */
const signedIn = <A, E>(pds: FakePds, f: (h: Hooks.HooksShape) => Effect.Effect<A, E>) =>
  Effect.scoped(Effect.flatMap(Hooks.make(conn(pds), { allowInsecureDev: false }), f))

const failureOf = <A, E>(self: Effect.Effect<A, E>) => Effect.flip(self)

// ---------------------------------------------------------------------------------------------
// The command in-process

interface Run {
  readonly code: number
  readonly line: string
  readonly stdout: string
}

/** `firehook hooks <args>` with the owner's environment pointing at `pds` (stderr left out). */
const run = (
  pds: FakePds,
  args: ReadonlyArray<string>,
  env: Record<string, string> = {}
): Effect.Effect<Run> =>
  Effect.map(
    runInProcess(hooks, args, {
      ATPROTO_PDS: pds.url,
      ATPROTO_IDENTIFIER: PDS_HANDLE,
      ATPROTO_APP_PASSWORD: PDS_PASSWORD,
      ...env
    }),
    ({ code, line, stdout }) => ({ code, line, stdout })
  )

const lines = (s: string) => s.split("\n").filter((l) => l.length > 0)

// ---------------------------------------------------------------------------------------------

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
      const malformed = "invalid --identifier: must be a handle, DID or email of 1-256 characters without spaces"
      expect(yield* refused({ ATPROTO_IDENTIFIER: "a b", ATPROTO_APP_PASSWORD: "pw" })).toBe(malformed)
      expect(yield* refused({ ATPROTO_IDENTIFIER: "i".repeat(257), ATPROTO_APP_PASSWORD: "pw" })).toBe(malformed)
      expect(yield* refused({ ATPROTO_APP_PASSWORD: "pw" }, given({ identifier: "" }))).toBe(malformed)
      const longest = yield* withEnv(
        { ATPROTO_IDENTIFIER: "i".repeat(256), ATPROTO_APP_PASSWORD: "pw" },
        Hooks.connection(given())
      )
      expect(longest.identifier).toHaveLength(256)
      const missing = "missing password: set ATPROTO_APP_PASSWORD (or pass --password)"
      expect(yield* refused({ ATPROTO_IDENTIFIER: "a.test" })).toBe(missing)
      expect(yield* refused({ ATPROTO_IDENTIFIER: "a.test" }, given({ password: "" }))).toBe(missing)
      expect(yield* refused({ ATPROTO_IDENTIFIER: "a.test", ATPROTO_PDS: "http://pds.example.com" })).toMatch(
        /^invalid --pds:/
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
    expect(c("login", xrpc(401, "AuthFactorTokenRequired"))).toEqual([
      "login",
      "login failed: invalid identifier or password"
    ])
    expect(c("login", xrpc(400, "AuthFactorTokenRequired"))).toEqual([
      "login",
      "login failed: the account requires a sign-in code; use an app password"
    ])
    expect(c("login", xrpc(400, "AccountTakedown"))).toEqual(["login", "login failed: the account is taken down"])
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

describe("firehook hooks: the library signed in to a PDS", () => {
  it.scoped("create: the record written is exactly the draft's, createdAt is now, no secret is returned", () =>
    Effect.gen(function*() {
      const pds = yield* fakePds
      yield* TestClock.setTime(Date.parse("2026-03-04T05:06:07.890Z"))
      const created = yield* signedIn(pds, (h) => h.create(draft()))
      const [write] = writes(pds)
      expect(writes(pds)).toHaveLength(1)
      expect(write?.nsid).toBe("com.atproto.repo.createRecord")
      expect(write?.body).toEqual({
        repo: PDS_DID,
        collection: WH,
        record: { $type: WH, scope: { aturi: POSTS }, url: URL_A, createdAt: "2026-03-04T05:06:07.890Z" }
      })
      const stored = [...pds.records.entries()][0]
      expect(created).toEqual({
        did: PDS_DID,
        uri: `at://${PDS_DID}/${WH}/${stored?.[0]}`,
        rkey: stored?.[0],
        cid: stored?.[1].cid,
        secret: Option.none()
      })
    }))

  it.scoped("create: --scope, --backlinks, --events, --secret-id and --disabled land in their fields", () =>
    Effect.gen(function*() {
      const pds = yield* fakePds
      const scope = `at://did:plc:abcdefghijklmnopqrstuvwx/app.bsky.feed.post`
      yield* signedIn(pds, (h) =>
        h.create(draft({
          scope: { _tag: "AtUri", aturi: scope },
          backlinks: true,
          events: ["create", "delete"],
          signing: { _tag: "SecretId", name: "main" },
          enabled: false
        })))
      expect(writes(pds)[0]?.body["record"]).toEqual({
        $type: WH,
        scope: { aturi: scope, backlinks: true },
        url: URL_A,
        events: ["create", "delete"],
        secretId: "main",
        enabled: false,
        createdAt: "1970-01-01T00:00:00.000Z"
      })
    }))

  it.scoped("create: one --events value is written as a one-item list (never dropped, which would mean all)", () =>
    Effect.gen(function*() {
      const pds = yield* fakePds
      yield* signedIn(pds, (h) => h.create(draft({ events: ["update"] })))
      yield* signedIn(pds, (h) => h.create(draft({ events: ["create", "update", "delete"] })))
      expect(writes(pds).map((c) => (c.body["record"] as Record<string, unknown>)["events"])).toEqual([
        ["update"],
        ["create", "update", "delete"]
      ])
    }))

  it.scoped("create: an inline secret is written and not returned; a generated one is written and returned once", () =>
    Effect.gen(function*() {
      const pds = yield* fakePds
      const given = yield* signedIn(
        pds,
        (h) => h.create(draft({ signing: { _tag: "Secret", secret: Redacted.make("inline-secret") } }))
      )
      expect(given.secret).toEqual(Option.none())
      expect(writes(pds)[0]?.body["record"]).toMatchObject({ secret: "inline-secret" })
      const one = yield* signedIn(pds, (h) => h.create(draft({ signing: { _tag: "Generate" } })))
      const two = yield* signedIn(pds, (h) => h.create(draft({ signing: { _tag: "Generate" } })))
      const secretOf = (c: Hooks.Created) => Option.getOrElse(Option.map(c.secret, Redacted.value), () => "")
      expect(secretOf(one)).toMatch(/^whsec_[A-Za-z0-9+/]{43}=$/)
      expect(secretOf(two)).toMatch(/^whsec_[A-Za-z0-9+/]{43}=$/)
      expect(secretOf(one)).not.toBe(secretOf(two))
      expect(pds.records.get(one.rkey)?.value).toMatchObject({ secret: secretOf(one) })
      expect(pds.records.get(two.rkey)?.value).toMatchObject({ secret: secretOf(two) })
    }))

  it.scoped("create --rkey: putRecord with swapRecord null at that key; an existing record is never replaced", () =>
    Effect.gen(function*() {
      const pds = yield* fakePds
      const created = yield* signedIn(pds, (h) => h.create(draft({ rkey: Option.some("sentinel") })))
      expect(created.rkey).toBe("sentinel")
      expect(created.uri).toBe(`at://${PDS_DID}/${WH}/sentinel`)
      const put = writes(pds)[0]
      expect(put?.nsid).toBe("com.atproto.repo.putRecord")
      expect(put?.body).toMatchObject({ repo: PDS_DID, collection: WH, rkey: "sentinel", swapRecord: null })
      const before = pds.records.get("sentinel")
      const again = yield* failureOf(
        signedIn(pds, (h) => h.create(draft({ url: "https://other.example.com/h", rkey: Option.some("sentinel") })))
      )
      expect(again).toMatchObject({
        reason: "exists",
        text: "a webhook record sentinel already exists; nothing written"
      })
      expect(pds.records.get("sentinel")).toBe(before)
    }))

  it.scoped("create: an invalid draft is refused before anything is written", () =>
    Effect.gen(function*() {
      const pds = yield* fakePds
      const e = yield* failureOf(signedIn(pds, (h) => h.create(draft({ events: ["upsert"] }))))
      expect(e._tag).toBe("HooksInvalid")
      const r = yield* failureOf(signedIn(pds, (h) => h.create(draft({ rkey: Option.some("a/b") }))))
      expect(r._tag).toBe("HooksInvalid")
      expect(writes(pds)).toEqual([])
    }))

  it.scoped("sign-in: a wrong password is one line without it; the session is deleted when done", () =>
    Effect.gen(function*() {
      const pds = yield* fakePds
      const wrong = "wrong-password-123"
      const e = yield* failureOf(Effect.scoped(Hooks.make(conn(pds, wrong), { allowInsecureDev: false })))
      expect(e).toMatchObject({ reason: "login", text: "login failed: invalid identifier or password" })
      expect(JSON.stringify(e)).not.toContain(wrong)
      expect(pds.calls.map((c) => c.nsid)).toEqual(["com.atproto.server.createSession"])
      expect(pds.calls[0]?.body).toEqual({ identifier: PDS_HANDLE, password: wrong })
      pds.calls.length = 0
      const did = yield* signedIn(pds, (h) => Effect.succeed(h.did))
      expect(did).toBe(PDS_DID)
      expect(pds.calls.map((c) => c.nsid)).toEqual([
        "com.atproto.server.createSession",
        "com.atproto.server.deleteSession"
      ])
    }))

  it.scoped("list: every page (100 records a page, the cursor passed on), summaries in order, not truncated", () =>
    Effect.gen(function*() {
      const pds = yield* fakePds
      const value = { $type: WH, scope: { aturi: POSTS }, url: URL_A, createdAt: "2026-01-01T00:00:00Z" }
      for (let i = 0; i < 250; i++) pds.records.set(`k${String(i).padStart(4, "0")}`, { cid: pds.nextCid(), value })
      const listed = yield* signedIn(pds, (h) => h.list)
      expect(listed.did).toBe(PDS_DID)
      expect(listed.truncated).toBe(false)
      expect(listed.webhooks.map((w) => w.rkey)).toEqual([...pds.records.keys()].sort())
      expect(listed.webhooks[0]).toMatchObject({ validation: "ok", url: URL_A, cid: pds.records.get("k0000")?.cid })
      const pages = pds.calls.filter((c) => c.nsid === "com.atproto.repo.listRecords")
      expect(pages.map((c) => [c.query.get("repo"), c.query.get("collection"), c.query.get("limit")])).toEqual(
        Array.from({ length: 4 }, () => [PDS_DID, WH, "100"])
      )
      expect(pages.map((c) => c.query.get("cursor"))).toEqual([null, "k0099", "k0199", "k0249"])
    }))

  it.scoped("list: at most 50 pages (5000 records), then truncated; a repeated cursor ends the listing", () =>
    Effect.gen(function*() {
      const pds = yield* fakePds
      const value = { $type: WH, scope: { aturi: POSTS }, url: URL_A, createdAt: "2026-01-01T00:00:00Z" }
      for (let i = 0; i < 5001; i++) pds.records.set(`k${String(i).padStart(5, "0")}`, { cid: pds.nextCid(), value })
      const listed = yield* signedIn(pds, (h) => h.list)
      expect(listed.webhooks).toHaveLength(5000)
      expect(listed.truncated).toBe(true)
      expect(pds.calls.filter((c) => c.nsid === "com.atproto.repo.listRecords")).toHaveLength(50)
      // exactly 5000: the 51st page would be empty, but the bound is reached first
      pds.records.delete("k05000")
      const exact = yield* signedIn(pds, (h) => h.list)
      expect(exact.webhooks).toHaveLength(5000)
      // a PDS that answers the same cursor again: the listing ends there (no loop, no duplicates)
      pds.calls.length = 0
      pds.override.set("com.atproto.repo.listRecords", () => ({
        status: 200,
        body: {
          records: [{
            uri: `at://${PDS_DID}/${WH}/same`,
            cid: "bafyreiej5wohacte5wj4l44s4wx3q6dhaeslgqf6x6d7nkq7i6xrwzdxsy",
            value
          }],
          cursor: "same"
        }
      }))
      const looping = yield* signedIn(pds, (h) => h.list)
      expect(looping.webhooks.map((w) => w.rkey)).toEqual(["same", "same"])
      expect(looping.truncated).toBe(false)
      // a page with no records ends the listing even with a cursor
      pds.override.set("com.atproto.repo.listRecords", () => ({ status: 200, body: { records: [], cursor: "more" } }))
      expect(yield* signedIn(pds, (h) => h.list)).toEqual({ did: PDS_DID, webhooks: [], truncated: false })
    }))

  it.scoped("disable/enable: only `enabled` changes (unknown fields kept), swapped on the fetched CID; a no-op writes nothing", () =>
    Effect.gen(function*() {
      const pds = yield* fakePds
      const value = {
        $type: WH,
        scope: { aturi: POSTS },
        url: URL_A,
        secret: "kept-secret",
        createdAt: "2026-01-01T00:00:00Z",
        extra: { kept: true }
      }
      pds.records.set("a", { cid: "bafyreid2fhmmitjorg2moxmx3snjaxovgzya3itvmt3genpx6kbzfjrgxq", value })
      pds.records.set("b", { cid: "bafyreicfol3zrsjme7ejxn5tdgmuh6plfzntbvf7utnklanns7idfeqbo4", value })
      const off = yield* signedIn(pds, (h) => h.setEnabled("a", false))
      const put = writes(pds)[0]
      expect(put?.nsid).toBe("com.atproto.repo.putRecord")
      expect(put?.body).toEqual({
        repo: PDS_DID,
        collection: WH,
        rkey: "a",
        record: { ...value, enabled: false },
        swapRecord: "bafyreid2fhmmitjorg2moxmx3snjaxovgzya3itvmt3genpx6kbzfjrgxq"
      })
      expect(off).toEqual({
        uri: `at://${PDS_DID}/${WH}/a`,
        rkey: "a",
        enabled: false,
        changed: true,
        cid: pds.records.get("a")?.cid
      })
      expect(pds.records.get("b")?.value).toBe(value)
      // already disabled: nothing written
      const again = yield* signedIn(pds, (h) => h.setEnabled("a", false))
      expect(again).toMatchObject({ rkey: "a", enabled: false, changed: false, cid: pds.records.get("a")?.cid })
      expect(writes(pds)).toHaveLength(1)
      // enable: enabled true written; a record without the field is already enabled
      const on = yield* signedIn(pds, (h) => h.setEnabled("a", true))
      expect(on).toMatchObject({ rkey: "a", enabled: true, changed: true })
      expect(writes(pds)[1]?.body["record"]).toEqual({ ...value, enabled: true })
      expect(yield* signedIn(pds, (h) => h.setEnabled("b", true))).toMatchObject({ changed: false })
      expect(writes(pds)).toHaveLength(2)
    }))

  it.scoped("disable/enable/delete: a missing record, an invalid key, an invalid stored record, a concurrent edit", () =>
    Effect.gen(function*() {
      const pds = yield* fakePds
      const value = { $type: WH, scope: { aturi: POSTS }, url: URL_A, createdAt: "2026-01-01T00:00:00Z" }
      const missing = yield* failureOf(signedIn(pds, (h) => h.setEnabled("nope", false)))
      expect(missing).toMatchObject({ reason: "not_found", text: "no webhook record nope" })
      const missingDelete = yield* failureOf(signedIn(pds, (h) => h.remove("nope")))
      expect(missingDelete).toMatchObject({ reason: "not_found", text: "no webhook record nope" })
      pds.calls.length = 0
      for (const self of [signedIn(pds, (h) => h.setEnabled("a/b", true)), signedIn(pds, (h) => h.remove("a/b"))]) {
        expect(yield* failureOf(self)).toMatchObject({
          _tag: "HooksInvalid",
          text: "invalid <rkey>: must be a record key"
        })
      }
      expect(pds.calls.filter((c) => c.nsid.startsWith("com.atproto.repo."))).toEqual([])
      pds.records.set("bad", {
        cid: "bafyreihcpiyqe54o3fbufh5rge23q624xgumzzof7atnxcpklapfgh37im",
        value: { ...value, url: "ftp://x.example.com" }
      })
      const invalidRecord = yield* failureOf(signedIn(pds, (h) => h.setEnabled("bad", false)))
      expect(invalidRecord).toMatchObject({
        reason: "invalid_record",
        text: "webhook record bad is not valid for firehook (url); nothing written (delete it and create it again)"
      })
      expect(writes(pds)).toEqual([])
      // the record changes between the read and the write: the swap fails, nothing is overwritten
      pds.records.set("a", { cid: "bafyreibbcmpgdbkzjroppxev45oozwr6p2wcoqjudsubu65brmjwj3hali", value })
      pds.override.set(
        "com.atproto.repo.putRecord",
        () => ({ status: 400, body: { error: "InvalidSwap", message: "x" } })
      )
      const conflict = yield* failureOf(signedIn(pds, (h) => h.setEnabled("a", false)))
      expect(conflict).toMatchObject({ reason: "conflict" })
    }))

  it.scoped("delete: deleteRecord of that key, swapped on the fetched CID", () =>
    Effect.gen(function*() {
      const pds = yield* fakePds
      const value = { $type: WH, scope: { aturi: POSTS }, url: URL_A, createdAt: "2026-01-01T00:00:00Z" }
      pds.records.set("a", { cid: "bafyreiajef73hv6f43kedsmxvxh237ysppto3upflm7xpzq6jxuxdrer5m", value })
      pds.records.set("b", { cid: "bafyreigpgfvek5s5xzyyrp4bj3subeczi2p6uyiwfa2lmz4d6abp5m6oye", value })
      const d = yield* signedIn(pds, (h) => h.remove("a"))
      expect(d).toEqual({ uri: `at://${PDS_DID}/${WH}/a`, rkey: "a" })
      expect(writes(pds).map((c) => [c.nsid, c.body])).toEqual([
        [
          "com.atproto.repo.deleteRecord",
          {
            repo: PDS_DID,
            collection: WH,
            rkey: "a",
            swapRecord: "bafyreiajef73hv6f43kedsmxvxh237ysppto3upflm7xpzq6jxuxdrer5m"
          }
        ]
      ])
      expect([...pds.records.keys()]).toEqual(["b"])
    }))
})

describe("firehook hooks create|list|enable|disable|delete (the commands, in-process)", () => {
  it.scoped("create refuses conflicting or missing options with code 2 before signing in", () =>
    Effect.gen(function*() {
      const pds = yield* fakePds
      const url = ["--url", URL_A]
      const one = "choose at most one of --secret, --secret-id, --generate-secret"
      const cases: ReadonlyArray<[ReadonlyArray<string>, string]> = [
        [["--collection", "app.bsky.feed.post", ...url, "--secret", "s3cret-x", "--secret-id", "main"], one],
        [["--collection", "app.bsky.feed.post", ...url, "--secret", "s3cret-x", "--generate-secret"], one],
        [["--collection", "app.bsky.feed.post", ...url, "--secret-id", "main", "--generate-secret"], one],
        [["--collection", "app.bsky.feed.post", "--scope", POSTS, ...url], "give exactly one of --scope, --collection"],
        [url, "give exactly one of --scope, --collection"],
        [
          ["--collection", "app.bsky.feed.post", ...url, "--events", "create,upsert"],
          "invalid --events: a comma-separated list of create, update, delete, each at most once"
        ],
        [
          ["--collection", "app.bsky.feed.post", ...url, "--rkey", "a/b"],
          "invalid --rkey: must be a record key ([A-Za-z0-9._~:%@+-], 1-512 characters, not . or ..)"
        ]
      ]
      for (const [args, line] of cases) {
        const r = yield* run(pds, ["create", ...args])
        expect(r, line).toEqual({ code: 2, line, stdout: "" })
        expect(r.line).not.toContain("s3cret-x")
      }
      // an http:// receiver: the mode is read as the service reads it
      const dev = yield* run(pds, [
        "create",
        "--collection",
        "app.bsky.feed.post",
        "--url",
        "http://127.0.0.1:9/h",
        "--json"
      ], {
        NODE_ENV: "test",
        WEBHOOK_ALLOW_INSECURE_DEV: "1"
      })
      expect(dev.code, dev.line).toBe(0)
      const prod = yield* run(
        pds,
        ["create", "--collection", "app.bsky.feed.post", "--url", "https://a.example.com/h"],
        {
          WEBHOOK_ALLOW_INSECURE_DEV: "1"
        }
      )
      expect(prod.code).toBe(2)
      expect(prod.line).toContain("WEBHOOK_ALLOW_INSECURE_DEV")
      // one sign-in (the accepted create); the refusals never reached the PDS
      expect(pds.calls.filter((c) => c.nsid === "com.atproto.server.createSession")).toHaveLength(1)
      expect(writes(pds)).toHaveLength(1)
    }))

  it.scoped("create: the generated secret is printed once (and is the one written); an inline one never", () =>
    Effect.gen(function*() {
      const pds = yield* fakePds
      const base = ["create", "--collection", "app.bsky.feed.post", "--url", URL_A]
      const gen = yield* run(pds, [...base, "--generate-secret"])
      expect(gen.code, gen.line).toBe(0)
      const [first, second, ...rest] = lines(gen.stdout)
      const rkey = [...pds.records.keys()][0] ?? ""
      const written = pds.records.get(rkey)?.value
      const secret = typeof written === "object" && written !== null && "secret" in written
        ? String(written.secret)
        : ""
      expect(secret).toMatch(/^whsec_/)
      expect(first).toBe(`created webhook ${rkey}: at://${PDS_DID}/${WH}/${rkey}`)
      expect(second).toBe(`signing secret (shown once): ${secret}`)
      expect(rest).toEqual([])
      const json = yield* run(pds, [...base, "--generate-secret", "--json", "--disabled"])
      const out = JSON.parse(json.stdout) as Record<string, unknown>
      const rkey2 = String(out["rkey"])
      expect(out).toEqual({
        did: PDS_DID,
        uri: `at://${PDS_DID}/${WH}/${rkey2}`,
        rkey: rkey2,
        cid: pds.records.get(rkey2)?.cid,
        enabled: false,
        secret: (pds.records.get(rkey2)?.value as Record<string, unknown>)["secret"]
      })
      expect(pds.records.get(rkey2)?.value).toMatchObject({ enabled: false })
      const inline = "inline-s3cret-value"
      const given = yield* run(pds, [...base, "--secret", inline, "--disabled"])
      expect(given.code, given.line).toBe(0)
      expect(lines(given.stdout)).toHaveLength(1)
      expect(given.stdout).toMatch(/^created webhook \S+ \(disabled\): at:\/\//)
      expect(given.stdout).not.toContain(inline)
      const givenJson = yield* run(pds, [...base, "--secret", inline, "--json"])
      expect(givenJson.stdout).not.toContain(inline)
      expect(JSON.parse(givenJson.stdout)).not.toHaveProperty("secret")
      expect(JSON.parse(givenJson.stdout)).toMatchObject({ enabled: true })
    }))

  it.scoped("list: no secret and no URL unless --show-urls; all events spelled out; truncation said", () =>
    Effect.gen(function*() {
      const pds = yield* fakePds
      const empty = yield* run(pds, ["list"])
      expect(empty).toEqual({ code: 0, line: "", stdout: `no webhooks in ${PDS_DID}\n` })
      const secret = "inline-s3cret-value"
      pds.records.set("a", {
        cid: "bafyreid5o5c76xtan7fczhhgvohrc5zwbyau4jccaxawmlzyi4jtrlmc7y",
        value: {
          $type: WH,
          scope: { aturi: POSTS, backlinks: true },
          url: URL_A,
          secret,
          createdAt: "2026-01-01T00:00:00Z"
        }
      })
      pds.records.set("b", {
        cid: "bafyreiam6rraof6pfsms5ddub2vxguzjxey4oxyrywjqdpuht6c3lgt2xi",
        value: {
          $type: WH,
          scope: { aturi: POSTS },
          url: "ftp://b.example.com",
          events: ["create"],
          secretId: "main",
          enabled: false,
          createdAt: "2026-01-01T00:00:00Z"
        }
      })
      const table = yield* run(pds, ["list"])
      expect(table.code, table.line).toBe(0)
      expect(table.stdout).not.toContain(secret)
      expect(table.stdout).not.toContain("example.com")
      const rows = lines(table.stdout).map((l) => l.trim().split(/\s+/))
      expect(rows).toEqual([
        ["RKEY", "SCOPE", "EVENTS", "ENABLED", "SIGNING", "FIREHOOK"],
        ["a", POSTS, "+backlinks", "all", "yes", "secret", "accepted"],
        ["b", POSTS, "create", "no", "secretId:main", "rejected", "(url)"]
      ])
      const withUrls = yield* run(pds, ["list", "--show-urls"])
      expect(lines(withUrls.stdout)[0]?.trim().split(/\s+/).at(-1)).toBe("URL")
      expect(withUrls.stdout).toContain(URL_A)
      expect(withUrls.stdout).toContain("ftp://b.example.com")
      expect(withUrls.stdout).not.toContain(secret)
      const json = yield* run(pds, ["list", "--json"])
      const listed = JSON.parse(json.stdout) as { webhooks: ReadonlyArray<Record<string, unknown>>; truncated: boolean }
      expect(json.stdout).not.toContain(secret)
      expect(json.stdout).not.toContain("example.com")
      expect(listed.truncated).toBe(false)
      expect(listed.webhooks.map((w) => [w["rkey"], w["url"], w["events"], w["accepted"], w["invalid"], w["secretId"]]))
        .toEqual([
          ["a", "[redacted]", ["create", "update", "delete"], true, null, null],
          ["b", "[redacted]", ["create"], false, "url", "main"]
        ])
      const jsonUrls = JSON.parse((yield* run(pds, ["list", "--json", "--show-urls"])).stdout) as {
        webhooks: ReadonlyArray<Record<string, unknown>>
      }
      expect(jsonUrls.webhooks.map((w) => w["url"])).toEqual([URL_A, "ftp://b.example.com"])
      const value = { $type: WH, scope: { aturi: POSTS }, url: URL_A, createdAt: "2026-01-01T00:00:00Z" }
      for (let i = 0; i < 5001; i++) pds.records.set(`k${String(i).padStart(5, "0")}`, { cid: pds.nextCid(), value })
      const long = yield* run(pds, ["list"])
      expect(lines(long.stdout).at(-1)).toBe("(the first 5000 records; more exist)")
    }))

  it.scoped("--pds, --identifier and --password sign in without the environment's values and win over them", () =>
    Effect.gen(function*() {
      const pds = yield* fakePds
      const elsewhere = {
        ATPROTO_PDS: "http://127.0.0.1:1",
        ATPROTO_IDENTIFIER: "someone-else.test",
        ATPROTO_APP_PASSWORD: "wrong-pass-999"
      }
      const flags = ["--pds", pds.url, "--identifier", PDS_HANDLE, "--password", PDS_PASSWORD]
      expect(yield* run(pds, ["list", ...flags], elsewhere)).toEqual({
        code: 0,
        line: "",
        stdout: `no webhooks in ${PDS_DID}\n`
      })
      const sessions = pds.calls.filter((c) => c.nsid === "com.atproto.server.createSession")
      expect(sessions.map((c) => c.body["identifier"])).toEqual([PDS_HANDLE])
    }))

  it.scoped("the insecure development mode as the service reads it: list's verdict on an http:// loopback receiver; refused outside development", () =>
    Effect.gen(function*() {
      const pds = yield* fakePds
      const value = {
        $type: WH,
        scope: { aturi: POSTS },
        url: "http://127.0.0.1:9/h",
        createdAt: "2026-01-01T00:00:00Z"
      }
      pds.records.set("a", { cid: pds.nextCid(), value })
      const accepted = (r: Run) =>
        (JSON.parse(r.stdout) as { webhooks: ReadonlyArray<{ accepted: boolean }> }).webhooks
          .map((w) => w.accepted)
      expect(accepted(yield* run(pds, ["list", "--json"]))).toEqual([false])
      const dev = { WEBHOOK_ALLOW_INSECURE_DEV: "1", NODE_ENV: "test" }
      expect(accepted(yield* run(pds, ["list", "--json"], dev))).toEqual([true])
      const calls = pds.calls.length
      for (const args of [["list"], ["enable", "a"], ["disable", "a"], ["delete", "a"]]) {
        const r = yield* run(pds, args, { WEBHOOK_ALLOW_INSECURE_DEV: "1", NODE_ENV: "production" })
        expect(r.code, r.line).toBe(2)
        expect(r.line).toContain("WEBHOOK_ALLOW_INSECURE_DEV")
        expect(r.stdout).toBe("")
      }
      expect(pds.calls).toHaveLength(calls)
    }))

  it.scoped("enable/disable/delete: the line said, the JSON, and code 2 for a bad key before signing in", () =>
    Effect.gen(function*() {
      const pds = yield* fakePds
      const value = { $type: WH, scope: { aturi: POSTS }, url: URL_A, createdAt: "2026-01-01T00:00:00Z" }
      pds.records.set("a", { cid: "bafyreic27evmyyypg7dg45d36e2ypgsxnujyn7fout74uzs7cvhyt3sx4e", value })
      expect(yield* run(pds, ["disable", "a"])).toEqual({ code: 0, line: "", stdout: "disabled webhook a\n" })
      expect(pds.records.get("a")?.value).toMatchObject({ enabled: false })
      expect(yield* run(pds, ["disable", "a"])).toEqual({
        code: 0,
        line: "",
        stdout: "webhook a is already disabled\n"
      })
      const on = yield* run(pds, ["enable", "a", "--json"])
      expect(JSON.parse(on.stdout)).toEqual({
        rkey: "a",
        uri: `at://${PDS_DID}/${WH}/a`,
        cid: pds.records.get("a")?.cid,
        enabled: true,
        changed: true
      })
      expect(pds.records.get("a")?.value).toMatchObject({ enabled: true })
      expect(yield* run(pds, ["enable", "a"])).toEqual({ code: 0, line: "", stdout: "webhook a is already enabled\n" })
      const calls = pds.calls.length
      for (const cmd of ["enable", "disable", "delete"]) {
        expect(yield* run(pds, [cmd, "a/b"])).toEqual({
          code: 2,
          line: "invalid <rkey>: must be a record key",
          stdout: ""
        })
      }
      expect(pds.calls).toHaveLength(calls)
      expect(yield* run(pds, ["delete", "a", "--json"])).toEqual({
        code: 0,
        line: "",
        stdout: `${JSON.stringify({ rkey: "a", uri: `at://${PDS_DID}/${WH}/a`, deleted: true }, null, 2)}\n`
      })
      expect(pds.records.size).toBe(0)
      expect(yield* run(pds, ["delete", "a"])).toEqual({ code: 1, line: "no webhook record a", stdout: "" })
      const wrong = yield* run(pds, ["list"], { ATPROTO_APP_PASSWORD: "wrong-pass-999" })
      expect(wrong).toEqual({ code: 1, line: "login failed: invalid identifier or password", stdout: "" })
    }))
})
