/**
 * Admission (SPEC §2.6) judges what a commit leaves, not the order of its operations: one commit
 * (one repo rev) that creates a webhook and deletes another of an owner at its limit leaves the
 * owner within the limit, so the new webhook is admitted whichever operation the commit lists
 * first (`applyWrites` keeps the client's order; Jetstream and the relay deliver it as is).
 * Real PostgreSQL.
 */
import * as SqlClient from "@effect/sql/SqlClient"
import { describe, expect, it } from "@effect/vitest"
import { Effect } from "effect"
import { Registry } from "../../src/services/registry/Registry.js"
import { eventually, outboxRows, run } from "../delivery/worker-support.js"
import { ev, plc, rev, sqlStack, whEv, whRecordValue } from "../support/stack.js"

const OWNER = plc(1)
const BOB = plc(2)
const ENV = { WEBHOOK_ALLOW_INSECURE_DEV: "1", REGISTRY_OWNER_ACTIVE_RECORDS_MAX: "2" }

describe("admission of one commit's operations (SPEC §2.6)", () => {
  it.scopedLive("an owner at its limit replaces a webhook in one commit listing the create first: admitted", () =>
    Effect.gen(function*() {
      const registry = yield* Registry
      const sql = yield* SqlClient.SqlClient
      yield* run([
        whEv(OWNER, "y", whRecordValue(`at://${BOB}`, { url: "https://receiver.example/y" }), { rev: rev(1) }),
        whEv(OWNER, "z", whRecordValue(`at://${BOB}`, { url: "https://receiver.example/z" }), { rev: rev(2) })
      ])
      // one commit (one rev): create x, then delete y
      yield* run([
        whEv(OWNER, "x", whRecordValue(`at://${BOB}`, { url: "https://receiver.example/x" }), { rev: rev(3) }),
        whEv(OWNER, "y", undefined, { operation: "delete", rev: rev(3) })
      ])
      expect(registry.index.byOwner(OWNER).map((w) => w.rkey).sort()).toEqual(["x", "z"])
      const stored = yield* sql<{ rkey: string; active: boolean }>`SELECT rkey, active FROM webhooks ORDER BY rkey`
      expect(stored).toEqual([{ rkey: "x", active: true }, { rkey: "z", active: true }])
      expect(yield* sql`SELECT rkey FROM rejected_records`).toEqual([])
      expect(yield* sql`SELECT rkey FROM tombstones ORDER BY rkey`).toEqual([{ rkey: "y" }])
      // the new webhook matches the owner's next event
      yield* run([ev(BOB, "app.bsky.feed.post", "p1", { rev: rev(10) })])
      const rows = yield* eventually("enqueued", outboxRows, (rs) => rs.length === 2)
      expect(rows.map((r) => r.webhook_rkey)).toEqual(["x", "z"])
    }).pipe(Effect.scoped, Effect.provide(sqlStack({ env: ENV }))))

  it.scopedLive("a commit that creates more than the room a delete frees still refuses the excess", () =>
    Effect.gen(function*() {
      const registry = yield* Registry
      const sql = yield* SqlClient.SqlClient
      yield* run([
        whEv(OWNER, "y", whRecordValue(`at://${BOB}`), { rev: rev(1) }),
        whEv(OWNER, "z", whRecordValue(`at://${BOB}`), { rev: rev(2) })
      ])
      yield* run([
        whEv(OWNER, "v", whRecordValue(`at://${BOB}`), { rev: rev(3) }),
        whEv(OWNER, "w", whRecordValue(`at://${BOB}`), { rev: rev(3) }),
        whEv(OWNER, "y", undefined, { operation: "delete", rev: rev(3) })
      ])
      expect(registry.index.byOwner(OWNER).map((w) => w.rkey).sort()).toEqual(["v", "z"])
      expect(yield* sql`SELECT rkey, reason FROM rejected_records`).toEqual([{ rkey: "w", reason: "limit_owner" }])
    }).pipe(Effect.scoped, Effect.provide(sqlStack({ env: ENV }))))

  it.scopedLive("one commit that resumes a paused webhook and pauses another at the limit: both applied", () =>
    Effect.gen(function*() {
      const registry = yield* Registry
      yield* run([
        whEv(OWNER, "y", whRecordValue(`at://${BOB}`), { rev: rev(1) }),
        whEv(OWNER, "z", whRecordValue(`at://${BOB}`), { rev: rev(2) }),
        whEv(OWNER, "x", whRecordValue(`at://${BOB}`, { enabled: false }), { rev: rev(3) })
      ])
      expect(registry.index.byOwner(OWNER).map((w) => w.rkey).sort()).toEqual(["y", "z"])
      yield* run([
        whEv(OWNER, "x", whRecordValue(`at://${BOB}`), { operation: "update", rev: rev(4) }),
        whEv(OWNER, "y", whRecordValue(`at://${BOB}`, { enabled: false }), { operation: "update", rev: rev(4) })
      ])
      expect(registry.index.byOwner(OWNER).map((w) => w.rkey).sort()).toEqual(["x", "z"])
    }).pipe(Effect.scoped, Effect.provide(sqlStack({ env: ENV }))))

  it.scopedLive("a relay commit whose operations on other collections sit between the create and the delete", () =>
    Effect.gen(function*() {
      const registry = yield* Registry
      yield* run([
        whEv(OWNER, "y", whRecordValue(`at://${BOB}`), { rev: rev(1) }),
        whEv(OWNER, "z", whRecordValue(`at://${BOB}`), { rev: rev(2) })
      ])
      yield* run([
        whEv(OWNER, "x", whRecordValue(`at://${BOB}`), { rev: rev(3) }),
        ev(OWNER, "app.bsky.feed.post", "p1", { rev: rev(3) }),
        whEv(OWNER, "y", undefined, { operation: "delete", rev: rev(3) })
      ])
      expect(registry.index.byOwner(OWNER).map((w) => w.rkey).sort()).toEqual(["x", "z"])
    }).pipe(Effect.scoped, Effect.provide(sqlStack({ env: ENV }))))
})
