/**
 * `firehook hooks create|list|enable|disable|delete` (src/cli/HooksCommand.ts) in-process, with its
 * output captured, against a tiny PDS on a real socket (./hook-records-fake-pds.ts): the options it
 * refuses before signing in, the lines and JSON it prints, and what it never prints (SPEC §1, §8.6;
 * README "hooks"). test/cli/hooks-cli.test.ts runs the commands as processes against a real PDS and
 * firehook.
 */
import { describe, expect, it } from "@effect/vitest"
import { Effect } from "effect"
import { fakePds, PDS_DID, PDS_HANDLE, PDS_PASSWORD, writes } from "./hook-records-fake-pds.js"
import { lines, POSTS, type Run, run, URL_A, WH } from "./hook-records-support.js"

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

  it.scoped("list: a backlinksOnly webhook (SPEC §1: backlinks only, never the scope's own records) is a backlink one", () =>
    Effect.gen(function*() {
      const pds = yield* fakePds
      pds.records.set("only", {
        cid: pds.nextCid(),
        value: {
          $type: WH,
          scope: { aturi: POSTS, backlinksOnly: true },
          url: URL_A,
          createdAt: "2026-01-01T00:00:00Z"
        }
      })
      const json = yield* run(pds, ["list", "--json"])
      expect(json.code, json.line).toBe(0)
      const listed = JSON.parse(json.stdout) as { webhooks: ReadonlyArray<Record<string, unknown>> }
      expect(listed.webhooks.map((w) => [w["rkey"], w["backlinks"], w["backlinksOnly"], w["accepted"]])).toEqual([[
        "only",
        true,
        true,
        true
      ]])
      const table = yield* run(pds, ["list"])
      expect(lines(table.stdout)[1]?.trim().split(/\s+/).slice(0, 4)).toEqual(["only", POSTS, "+backlinks", "only"])
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
