/**
 * The owners' record library (src/cli/HookRecords.ts) in-process, signed in to a tiny PDS on a real
 * socket (./hook-records-fake-pds.ts): what it writes (the record's exact fields, the swap values,
 * the pages asked for), what it refuses before writing, and what it never returns (SPEC §1, §8.6;
 * README "hooks"). test/cli/hooks-cli.test.ts runs the commands as processes against a real PDS
 * and firehook.
 */
import { describe, expect, it } from "@effect/vitest"
import { Effect, Either, Option, Redacted, TestClock } from "effect"
import * as Hooks from "../../src/cli/HookRecords.js"
import { fakePds, PDS_DID, PDS_HANDLE, writes } from "./hook-records-fake-pds.js"
import { conn, draft, failureOf, POSTS, signedIn, URL_A, WH } from "./hook-records-support.js"

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

  it.scoped("sign-in: a taken-down account and a sign-in code request are said as such, though sent with 401", () =>
    Effect.gen(function*() {
      const pds = yield* fakePds
      const refusedWith = (error: string) =>
        Effect.gen(function*() {
          // as @atproto/pds (AuthRequiredError) and Bluesky's entryway send them
          pds.override.set("com.atproto.server.createSession", () => ({ status: 401, body: { error, message: "x" } }))
          return yield* failureOf(signedIn(pds, (h) => Effect.succeed(h.did)))
        })
      expect(yield* refusedWith("AccountTakedown")).toMatchObject({
        reason: "login",
        text: "login failed: the account is taken down"
      })
      expect(yield* refusedWith("AuthFactorTokenRequired")).toMatchObject({
        reason: "login",
        text: "login failed: the account requires a sign-in code; use an app password"
      })
    }))

  it.scoped("sign-in: the session is never sent to a DID document's http:// PDS other than a loopback one", () =>
    Effect.gen(function*() {
      const pds = yield* fakePds
      const token = (scope: string) =>
        ["{\"alg\":\"ES256K\"}", JSON.stringify({ scope, sub: PDS_DID, exp: 4_000_000_000 }), "sig"]
          .map((part) => Buffer.from(part, "utf8").toString("base64url")).join(".")
      const withEndpoint = (serviceEndpoint: string) => {
        const didDoc = {
          id: PDS_DID,
          service: [{ id: "#atproto_pds", type: "AtprotoPersonalDataServer", serviceEndpoint }]
        }
        const session = { did: PDS_DID, handle: PDS_HANDLE, active: true, didDoc }
        const body = { ...session, accessJwt: token("com.atproto.appPass"), refreshJwt: token("com.atproto.refresh") }
        pds.override.set("com.atproto.server.createSession", () => ({ status: 200, body }))
        pds.calls.length = 0
      }
      withEndpoint("http://pds.invalid")
      const e = yield* Effect.either(signedIn(pds, (h) => h.list))
      expect(Either.getLeft(e).pipe(Option.map((f) => [f.reason, f.text]), Option.getOrUndefined)).toEqual([
        "pds",
        "the account's PDS (DID document) is not https://"
      ])
      // the session was deleted at the named PDS (the refresh token goes there only), nothing else asked
      expect(pds.calls.map((c) => c.nsid)).toEqual([
        "com.atproto.server.createSession",
        "com.atproto.server.deleteSession"
      ])
      // http:// to a loopback host (as --pds allows it): this PDS itself
      withEndpoint(pds.url)
      const listed = yield* signedIn(pds, (h) => h.list)
      expect(listed.did).toBe(PDS_DID)
      expect(pds.calls.map((c) => c.nsid)).toContain("com.atproto.repo.listRecords")
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
      expect(pds.calls.filter((c) => c.nsid === "com.atproto.repo.listRecords")).toHaveLength(51) // 50 pages, then the probe
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
      expect(looping.webhooks.map((w) => w.rkey)).toEqual(["same"])
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
