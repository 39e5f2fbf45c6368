/**
 * The reconciliation layers as the service composes them (src/layers/Reconciliation.ts): health
 * sections, the initial backfill switching the phase to `live`, a reconciliation done by another
 * process (the CLI) swapped into this process's memory by the RetryScheduler's next round, and the
 * shutdown stages.
 */
import * as SqlClient from "@effect/sql/SqlClient"
import { describe, expect, it } from "@effect/vitest"
import { Context, Effect, Layer } from "effect"
import { identityLayer, reconciliationLayer } from "../../src/layers/Reconciliation.js"
import { Processor } from "../../src/services/matching/Processor.js"
import * as Config from "../../src/services/platform/Config.js"
import * as Health from "../../src/services/platform/Health.js"
import { SafeHttp } from "../../src/services/platform/http/SafeHttp.js"
import * as Lifecycle from "../../src/services/platform/Lifecycle.js"
import * as Backfill from "../../src/services/reconciliation/Backfill.js"
import * as Identity from "../../src/services/reconciliation/Identity.js"
import * as Reconciler from "../../src/services/reconciliation/Reconciler.js"
import * as ReconcileStore from "../../src/services/reconciliation/ReconcileStore.js"
import { Registry } from "../../src/services/registry/Registry.js"
import { didDoc, fakePlc, type FakeRepo, fakeServer, pdsHandler } from "../support/fakeAtproto.js"
import { waitFor } from "../support/reconcile.js"
import { plc, rev, sqlStack, testConfig, whEv, whRecordValue } from "../support/stack.js"

const ALICE = plc(1)
const BOB = plc(2)
const hook = whRecordValue(`at://${plc(3)}`)

describe("reconciliation wiring", () => {
  it.scopedLive(
    "startup phases, health, swap of an owner reconciled elsewhere, shutdown",
    () =>
      Effect.gen(function*() {
        const docs = new Map<string, unknown>()
        const repos = new Map<string, FakeRepo>()
        const plcServer = yield* fakePlc(docs)
        const pds = yield* fakeServer(pdsHandler(repos))
        for (const did of [ALICE, BOB]) docs.set(did, didDoc(did, pds.url))
        repos.set(ALICE, { rev: rev(100), records: [{ rkey: "a", value: hook }] })
        repos.set(BOB, { rev: rev(100), records: [] })
        const env = {
          WEBHOOK_ALLOW_INSECURE_DEV: "1",
          PLC_DIRECTORY_URL: plcServer.url,
          BACKFILL_OWNERS: ALICE,
          RETRY_SCHEDULER_INTERVAL_MS: "1000"
        }
        const config = testConfig(env)
        const core = sqlStack({ env }).pipe(
          Layer.provideMerge(Health.layer),
          Layer.provideMerge(Lifecycle.layer({ shutdownTimeout: "10 seconds" }))
        )
        const app = reconciliationLayer({ backfill: { repassInterval: null } }).pipe(
          Layer.provideMerge(identityLayer(config)),
          Layer.provideMerge(core)
        )
        const ctx = yield* Layer.build(app)
        const lifecycle = Context.get(ctx, Lifecycle.Lifecycle)
        const health = Context.get(ctx, Health.Health)
        const backfill = Context.get(ctx, Backfill.Backfill)
        const registry = Context.get(ctx, Registry)

        // BOB is known from the stream, with a webhook its PDS no longer has
        yield* Effect.flatMap(
          Processor,
          (p) => p.processEvents([whEv(BOB, "old", hook, { rev: rev(1) })], { registryWriter: true })
        ).pipe(
          Effect.provide(ctx)
        )

        // SPEC §6.1 step 5: reconciling-live while the initial backfill runs, then live
        yield* lifecycle.setPhase("reconciling-live")
        yield* backfill.start
        yield* backfill.awaitInitialPass
        yield* lifecycle.setPhase("live")
        const report = yield* health.report
        expect(report.ready).toBe(true)
        expect(report.body["backfill"]).toMatchObject({
          infrastructureHealthy: true,
          initialPassDone: true,
          ownersDone: 2
        })
        expect(report.body["retryScheduler"]).toMatchObject({ running: true })
        expect(registry.index.byOwner(ALICE).map((w) => w.rkey)).toEqual(["a"])
        expect(registry.index.byOwner(BOB)).toEqual([])

        // another process (the CLI) reconciles ALICE after her PDS changed: this process's memory
        // follows within one RetryScheduler round once the completion has settled
        repos.set(ALICE, { rev: rev(200), records: [{ rkey: "a", value: hook }, { rkey: "b", value: hook }] })
        const cli = Reconciler.layerWithoutRegistry().pipe(
          Layer.provideMerge(Identity.layer()),
          Layer.provideMerge(ReconcileStore.layerSql),
          Layer.provideMerge(SafeHttp.layerDefault({ allowInsecureDev: true, allowCidrs: [] })),
          Layer.provideMerge(Config.layerValue(config))
        )
        const outcome = yield* Effect.flatMap(Reconciler.Reconciler, (r) => r.reconcile(ALICE)).pipe(
          Effect.provide(cli),
          Effect.provide(ctx)
        )
        expect(outcome._tag).toBe("complete")
        expect(registry.index.byOwner(ALICE).map((w) => w.rkey)).toEqual(["a"])
        // a completion is read once it has settled (COMPLETION_SETTLE_MS, 90 s after completed_at):
        // let that time pass by moving the completion back
        yield* Effect.flatMap(
          SqlClient.SqlClient,
          (sql) => sql`UPDATE owners SET completed_at = completed_at - interval '100 seconds' WHERE did = ${ALICE}`
        ).pipe(Effect.provide(ctx))
        yield* waitFor(() => registry.index.byOwner(ALICE).length === 2, 5_000)

        // shutdown: backfill stopped, the scheduler stopped (drained), clean
        const shutdown = yield* lifecycle.shutdown
        expect(shutdown).toEqual({ clean: true, unclean: [] })
        const after = yield* health.report
        expect(after.body["retryScheduler"]).toMatchObject({ running: false })
      }),
    { timeout: 60_000 }
  )
})
