/**
 * Backfill passes of two replicas on one PostgreSQL (SPEC §6.4): the shared continuation only moves
 * forward, and a pass whose page was overtaken continues from the newer stored value instead of
 * scanning the owners the other replica already scanned (issue 14 item 12).
 */
import { describe, expect, layer } from "@effect/vitest"
import { Deferred, Effect, Fiber, Layer } from "effect"
import * as Config from "../../src/services/platform/Config.js"
import { SafeHttp } from "../../src/services/platform/http/SafeHttp.js"
import * as Backfill from "../../src/services/reconciliation/Backfill.js"
import { type ReconcileOutcome, Reconciler } from "../../src/services/reconciliation/Reconciler.js"
import { INITIAL_PASS, ReconcileStore } from "../../src/services/reconciliation/ReconcileStore.js"
import * as ReconcileStoreMod from "../../src/services/reconciliation/ReconcileStore.js"
import * as Db from "../support/db.js"
import { waitFor } from "../support/reconcile.js"
import { plc, testConfig } from "../support/stack.js"

const COMPLETE: ReconcileOutcome = {
  _tag: "complete",
  records: 0,
  invalid: 0,
  written: 0,
  deleted: 0,
  pages: 1,
  repoFound: true
}

interface Recon {
  readonly calls: Array<string>
  hook: (did: string) => Effect.Effect<void>
}

const newRecon = (): Recon => ({ calls: [], hook: () => Effect.void })

/** One replica's Backfill environment (its own reconciler; the store is the shared database). */
const replica = (recon: Recon) =>
  Layer.mergeAll(
    Layer.succeed(Reconciler, {
      reconcile: (did) =>
        Effect.gen(function*() {
          recon.calls.push(did)
          yield* recon.hook(did)
          return COMPLETE
        }),
      stats: Effect.succeed({ completed: 0, failed: 0, busy: 0, superseded: 0, invalidRecords: 0 })
    }),
    SafeHttp.layerDefault({ allowInsecureDev: true, allowCidrs: [] }),
    Config.layerValue(testConfig({ WEBHOOK_ALLOW_INSECURE_DEV: "1" }))
  )

const options = (maxOwnersPerPass: number): Backfill.BackfillOptions => ({
  repassInterval: null,
  infraRetryBase: "10 millis",
  infraRetryMax: "50 millis",
  busyRetries: 0,
  pageSize: 10,
  maxOwnersPerPass
})

const passState = Effect.flatMap(ReconcileStore, (s) => s.passState(INITIAL_PASS))

describe("Backfill passes of two replicas", () => {
  layer(ReconcileStoreMod.layerSql.pipe(Layer.provideMerge(Db.layer())), {
    timeout: "60 seconds",
    excludeTestServices: true
  })("on PostgreSQL", (it) => {
    it.scoped(
      "a pass overtaken by another replica never moves the continuation backwards and does not rescan its owners",
      () => {
        const a = newRecon()
        const b = newRecon()
        const owners = Array.from({ length: 60 }, (_, i) => plc(500 + i)).sort()
        return Effect.gen(function*() {
          const store = yield* ReconcileStore
          yield* store.addOwners(owners, "operator")
          const gate = yield* Deferred.make<void>()
          a.hook = (did) => (did === owners[0] ? Deferred.await(gate) : Effect.void)
          const replicaA = yield* Backfill.make(options(20)).pipe(Effect.provide(replica(a)))
          const replicaB = yield* Backfill.make(options(30)).pipe(Effect.provide(replica(b)))
          // replica A starts the sweep and is slow on its first page
          const fiberA = yield* Effect.fork(replicaA.runPass)
          yield* waitFor(() => a.calls.includes(owners[0] ?? ""))
          // replica B meanwhile scans three pages (a capped pass)
          expect(yield* replicaB.runPass).toEqual({ owners: 30, failed: 0, completed: false })
          expect(b.calls).toEqual(owners.slice(0, 30))
          expect(yield* passState).toMatchObject({ continuation: owners[29], ownersDone: 30 })
          // A finishes its first page: its older continuation must not overwrite B's
          yield* Deferred.succeed(gate, undefined)
          const resultA = yield* Fiber.join(fiberA)
          expect(resultA).toEqual({ owners: 20, failed: 0, completed: false })
          // A went on from B's continuation, not over the owners B had scanned
          expect(a.calls).toEqual([...owners.slice(0, 10), ...owners.slice(30, 40)])
          expect(yield* passState).toMatchObject({ continuation: owners[39], ownersDone: 40, completedAt: undefined })
          // the sweep still finishes, and a finished sweep starts over from the beginning
          expect(yield* replicaB.runPass).toEqual({ owners: 20, failed: 0, completed: true })
          expect(b.calls.slice(30)).toEqual(owners.slice(40))
          const done = yield* passState
          expect(done).toMatchObject({ continuation: undefined, ownersDone: 60 })
          expect(done?.completedAt).toBeInstanceOf(Date)
          a.calls.length = 0
          expect(yield* replicaA.runPass).toEqual({ owners: 20, failed: 0, completed: false })
          expect(a.calls).toEqual(owners.slice(0, 20))
          expect(yield* passState).toMatchObject({ continuation: owners[19], ownersDone: 20, completedAt: undefined })
        })
      },
      60_000
    )
  })
})
