/**
 * Backfill passes on a database whose default collation is not bytewise (SPEC §5.2): an ICU
 * `en-US` database orders `did:web:ex.com:u` before `did:web:ex.com.au` (`:` sorts before `.`),
 * bytewise order the other way round. The keyset pages come in the database's order, so the
 * frontier must move forward in that order too, or a sweep never gets past such a pair.
 */
import { describe, expect, layer } from "@effect/vitest"
import { Effect, Layer } from "effect"
import * as Config from "../../src/services/platform/Config.js"
import { SafeHttp } from "../../src/services/platform/http/SafeHttp.js"
import * as Backfill from "../../src/services/reconciliation/Backfill.js"
import { Reconciler } from "../../src/services/reconciliation/Reconciler.js"
import { INITIAL_PASS, ReconcileStore } from "../../src/services/reconciliation/ReconcileStore.js"
import * as ReconcileStoreMod from "../../src/services/reconciliation/ReconcileStore.js"
import * as Db from "../support/db.js"
import { COMPLETE } from "../support/reconcile.js"
import { plc, testConfig } from "../support/stack.js"

const calls: Array<string> = []

const env = Layer.mergeAll(
  Layer.succeed(Reconciler, {
    reconcile: (did) => Effect.sync(() => (calls.push(did), COMPLETE)),
    stats: Effect.succeed({ completed: 0, failed: 0, busy: 0, superseded: 0, invalidRecords: 0 })
  }),
  SafeHttp.layerDefault({ allowInsecureDev: true, allowCidrs: [] }),
  Config.layerValue(testConfig({ WEBHOOK_ALLOW_INSECURE_DEV: "1" }))
)

const ICU = "TEMPLATE template0 LOCALE_PROVIDER icu ICU_LOCALE 'en-US' LOCALE 'C.UTF-8'"

describe("Backfill passes on a non-bytewise collation", () => {
  layer(ReconcileStoreMod.layerSql.pipe(Layer.provideMerge(Db.layerWith(ICU))), {
    timeout: "60 seconds",
    excludeTestServices: true
  })("ICU en-US database", (it) => {
    it.scoped("a sweep visits every owner in the database's order and completes", () =>
      Effect.gen(function*() {
        const store = yield* ReconcileStore
        const owners = [plc(1), "did:web:ex.com:u", "did:web:ex.com.au", "did:web:ex.com.b"]
        yield* store.addOwners(owners, "operator")
        const ordered = yield* store.ownersPage(undefined, 10)
        // the database's order is not bytewise order: the case this test is about
        expect(ordered).toEqual([plc(1), "did:web:ex.com:u", "did:web:ex.com.au", "did:web:ex.com.b"])
        expect([...ordered].sort()).not.toEqual(ordered)
        const b = yield* Backfill.make({ repassInterval: null, pageSize: 1, maxOwnersPerPass: 100 })
        const result = yield* b.runPass
        expect(result).toEqual({ owners: 4, failed: 0, completed: true })
        expect(calls).toEqual(ordered)
        const state = yield* store.passState(INITIAL_PASS)
        expect(state?.completedAt).toBeInstanceOf(Date)
        expect(state?.ownersDone).toBe(4)
      }).pipe(Effect.provide(env)))
  })
})
