/**
 * Step 4 of an owner's reconciliation prunes the owner's tombstones older than
 * `RETENTION_TOMBSTONES_MS`, the retention maintenance keeps them for (before, a fixed 7 days: with
 * a 30-day retention configured, every reconciliation of an owner deleted its tombstones older than
 * 7 days). Real PostgreSQL.
 */
import * as SqlClient from "@effect/sql/SqlClient"
import { describe, expect, layer } from "@effect/vitest"
import { Effect } from "effect"
import { RegistryStore } from "../../src/services/registry/RegistryStore.js"
import { reconcileStack } from "../support/reconcile.js"
import { plc, rev, whEv } from "../support/stack.js"
import { hook, live, reconcile, setup, storedRkeys } from "./reconciler-support.js"

const DAY_MS = 86_400_000

/** an owner whose hook `a` was deleted by a scan at rev 100, its tombstone aged `days`, then scanned again */
const tombstoneAfterRescan = (n: number, days: number) =>
  Effect.gen(function*() {
    const sql = yield* SqlClient.SqlClient
    const store = yield* RegistryStore
    const did = plc(n)
    yield* live([whEv(did, "a", hook(), { rev: rev(1) })])
    yield* setup(did, [], { rev: rev(100) })
    expect(yield* reconcile(did)).toMatchObject({ _tag: "complete", deleted: 1 })
    expect(yield* storedRkeys(did)).toEqual([])
    expect((yield* store.get(did, "a")).tombstone?.rev).toBe(rev(100))
    yield* sql`UPDATE tombstones SET deleted_at = now() - make_interval(days => ${days}) WHERE owner_did = ${did}`
    yield* setup(did, [], { rev: rev(200) })
    expect(yield* reconcile(did)).toMatchObject({ _tag: "complete" })
    return (yield* store.get(did, "a")).tombstone?.rev
  })

describe("tombstone retention in reconciliation", () => {
  layer(
    reconcileStack({ env: { RETENTION_TOMBSTONES_MS: String(30 * DAY_MS) } }),
    { timeout: "120 seconds", excludeTestServices: true }
  )("RETENTION_TOMBSTONES_MS = 30 days", (it) => {
    it.effect("a 10-day-old tombstone survives its owner's scan; a 31-day-old one is pruned", () =>
      Effect.gen(function*() {
        expect(yield* tombstoneAfterRescan(7_401, 10)).toBe(rev(100))
        expect(yield* tombstoneAfterRescan(7_402, 31)).toBeUndefined()
      }))
  })

  layer(reconcileStack(), { timeout: "120 seconds", excludeTestServices: true })("the default (7 days)", (it) => {
    it.effect("a 10-day-old tombstone is pruned by its owner's scan; a 3-day-old one is kept", () =>
      Effect.gen(function*() {
        expect(yield* tombstoneAfterRescan(7_403, 10)).toBeUndefined()
        expect(yield* tombstoneAfterRescan(7_404, 3)).toBe(rev(100))
      }))
  })
})
