/**
 * `firehook owners add | reconcile | status` as operators run it (`bun src/cli/main.ts`), against a fresh
 * database, a fake PLC and a fake PDS on loopback (insecure development mode).
 */
import { describe, expect, it } from "@effect/vitest"
import { Effect, Redacted } from "effect"
import * as Db from "../support/db.js"
import { didDoc, fakePlc, type FakeRepo, fakeServer, pdsHandler } from "../support/fakeAtproto.js"
import { type CliResult, runCli } from "../support/proc.js"
import { plc, rev, whRecordValue } from "../support/stack.js"
import { lines } from "./cli-expect.js"

type Result = CliResult

const cli = (args: ReadonlyArray<string>, env: Record<string, string>): Effect.Effect<Result> =>
  Effect.promise(() => runCli(args, env))

const ALICE = plc(1)
const BOB = plc(2)
const CAROL = plc(3)

describe("firehook owners", () => {
  it.scopedLive("add, reconcile and status", () =>
    Effect.gen(function*() {
      const db = yield* Db.freshDatabase
      const docs = new Map<string, unknown>()
      const repos = new Map<string, FakeRepo>()
      const plcServer = yield* fakePlc(docs)
      const pds = yield* fakeServer(pdsHandler(repos))
      docs.set(ALICE, didDoc(ALICE, pds.url))
      docs.set(BOB, didDoc(BOB, "http://169.254.169.254"))
      repos.set(ALICE, {
        rev: rev(100),
        records: [
          { rkey: "a", value: whRecordValue(`at://${CAROL}`) },
          { rkey: "b", value: whRecordValue(`at://${CAROL}`, { url: "https://10.0.0.1/hook" }) }
        ]
      })
      const env = {
        DATABASE_URL: Redacted.value(db.url),
        NODE_ENV: "test",
        WEBHOOK_ALLOW_INSECURE_DEV: "1",
        PLC_DIRECTORY_URL: plcServer.url
      }

      // invalid arguments: exit 2, one line, no database needed
      const bad = yield* cli(["owners", "add", "alice.test"], { DATABASE_URL: "postgres://x@127.0.0.1:1/none" })
      expect(bad.code).toBe(2)
      expect(lines(bad.stderr)).toHaveLength(1)

      const added = yield* cli(["owners", "add", ALICE], env)
      expect(added.code, added.stderr).toBe(0)
      expect(added.stdout).toContain(ALICE)

      const reconciled = yield* cli(["owners", "reconcile", ALICE, "--json"], env)
      expect(reconciled.code, reconciled.stderr).toBe(0)
      expect(JSON.parse(reconciled.stdout)).toEqual({
        did: ALICE,
        outcome: "complete",
        repoFound: true,
        records: 2,
        invalid: 1,
        written: 1,
        deleted: 0,
        pages: 2
      })
      const again = yield* cli(["owners", "reconcile", ALICE], env)
      expect(again.code).toBe(0)
      expect(lines(again.stdout)).toEqual([`reconciled ${ALICE}: 2 records (1 invalid omitted), 1 written, 0 deleted`])

      // a private PDS endpoint: an operational failure with the kind, nothing else
      const failed = yield* cli(["owners", "reconcile", BOB], env)
      expect(failed.code).toBe(1)
      expect(failed.stdout).toBe("")
      expect(lines(failed.stderr)).toEqual(["firehook: reconciliation failed: pds_unsafe"])

      const status = yield* cli(["owners", "status", "--json"], env)
      expect(status.code, status.stderr).toBe(0)
      const s = JSON.parse(status.stdout) as {
        counts: Record<string, number>
        failed: Array<{ did: string; failureCount: number; lastFailureKind: string }>
        backfill: unknown
      }
      expect(s.counts).toMatchObject({ complete: 1, failed: 1, scanning: 0 })
      expect(s.failed).toMatchObject([{ did: BOB, failureCount: 1, lastFailureKind: "pds_unsafe" }])
      expect(s.backfill).toBeNull()
      const table = yield* cli(["owners", "status"], env)
      expect(table.code).toBe(0)
      expect(lines(table.stdout)[0]).toMatch(/^owners\s+unknown 0\s+scanning 0\s+complete 1\s+failed 1$/)
      expect(table.stdout).toMatch(/FAILED OWNER\s+FAILURES\s+LAST KIND\s+FAILED AT/)
      expect(table.stdout).toContain(BOB)
      expect(table.stdout).not.toContain("169.254")

      // with --json the outcome is printed all the same, and the exit code says it failed
      const failedJson = yield* cli(["owners", "reconcile", BOB, "--json"], env)
      expect(failedJson.code).toBe(1)
      expect(JSON.parse(failedJson.stdout)).toEqual({ did: BOB, outcome: "failed", kind: "pds_unsafe" })
      expect(lines(failedJson.stderr)).toEqual(["firehook: reconciliation failed: pds_unsafe"])
    }), { timeout: 90_000 })
})
