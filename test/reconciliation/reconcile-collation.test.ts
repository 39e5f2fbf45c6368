/**
 * Reconciliation on a database whose default collation does not sort TIDs bytewise (SPEC §3.4,
 * §5.3). Revs are TIDs (`[2-7a-z]`), in time order bytewise only; an ICU Estonian collation puts
 * `z` between `s` and `t` (so do Lithuanian, Danish, Czech/Slovak and Hungarian ones), and the
 * embedded PostgreSQL's initdb takes the host's locale. The snapshot's statements must compare
 * revs as the live path does (`compareTid`, bytewise): otherwise a stored row older than the
 * snapshot compares as newer, and the owner's changed URL is ignored, a webhook the PDS no longer
 * lists keeps matching, a live tombstone holds back a record re-created since, and old tombstones
 * are never pruned.
 */
import * as SqlClient from "@effect/sql/SqlClient"
import { describe, expect, layer } from "@effect/vitest"
import { Effect, Layer } from "effect"
import * as Config from "../../src/services/platform/Config.js"
import { SafeHttp } from "../../src/services/platform/http/SafeHttp.js"
import * as Identity from "../../src/services/reconciliation/Identity.js"
import * as Reconciler from "../../src/services/reconciliation/Reconciler.js"
import * as ReconcileStore from "../../src/services/reconciliation/ReconcileStore.js"
import { RegistryStore } from "../../src/services/registry/RegistryStore.js"
import * as Db from "../support/db.js"
import { fakePlc, type FakeRepo, fakeServer, pdsHandler } from "../support/fakeAtproto.js"
import { Fakes } from "../support/reconcile.js"
import { plc, sqlServices, testConfig, whEv } from "../support/stack.js"
import { hook, live, memoryRkeys, reconcile, setup } from "./reconciler-support.js"

/** A database whose default collation is ICU Estonian. */
const ESTONIAN = "TEMPLATE template0 LOCALE_PROVIDER icu ICU_LOCALE 'et' LOCALE 'C.UTF-8'"

/** Two valid TIDs: OLD < SNAP bytewise (in time order); OLD > SNAP under the Estonian collation. */
const OLD = "3kt2222222222"
const SNAP = "3kz2222222222"

/** The reconcile stack (test/support/reconcile.ts) on a fresh {@link ESTONIAN} database; tombstones are pruned at once. */
const estonianStack = Layer.unwrapScoped(
  Effect.gen(function*() {
    const docs = new Map<string, unknown>()
    const repos = new Map<string, FakeRepo>()
    const plcServer = yield* fakePlc(docs)
    const defaultPds = pdsHandler(repos)
    const pds = yield* fakeServer(defaultPds)
    const env = { WEBHOOK_ALLOW_INSECURE_DEV: "1", PLC_DIRECTORY_URL: plcServer.url }
    return Reconciler.layer({ tombstoneRetentionMs: 0 }).pipe(
      Layer.provideMerge(Identity.layer()),
      Layer.provideMerge(ReconcileStore.layerSql),
      Layer.provideMerge(SafeHttp.layerDefault({ allowInsecureDev: true, allowCidrs: [] })),
      Layer.provideMerge(
        sqlServices().pipe(
          Layer.provideMerge(Layer.mergeAll(Db.layerWith(ESTONIAN), Config.layerValue(testConfig(env))))
        )
      ),
      Layer.merge(Layer.succeed(Fakes, { plc: plcServer, pds, docs, repos, defaultPds }))
    )
  })
)

const storedState = (did: string) =>
  Effect.gen(function*() {
    const sql = yield* SqlClient.SqlClient
    const webhooks = yield* sql<{ rkey: string; url: string; rev: string }>`
      SELECT rkey, url, rev FROM webhooks WHERE owner_did = ${did} ORDER BY rkey`
    const tombstones = yield* sql<{ rkey: string; rev: string }>`
      SELECT rkey, rev FROM tombstones WHERE owner_did = ${did} ORDER BY rkey`
    return {
      webhooks: webhooks.map((r) => `${r.rkey} ${r.url} ${r.rev}`),
      tombstones: tombstones.map((r) => `${r.rkey} ${r.rev}`)
    }
  }).pipe(Effect.orDie)

describe("reconciliation compares revs bytewise whatever the database's collation", () => {
  layer(estonianStack, { timeout: "120 seconds", excludeTestServices: true })("ICU Estonian database", (it) => {
    it.effect("the collation sorts the two TIDs against time order (the premise)", () =>
      Effect.gen(function*() {
        const sql = yield* SqlClient.SqlClient
        const rows = yield* sql<{ newer: boolean; bytewise: boolean }>`
          SELECT ${OLD}::text > ${SNAP}::text AS newer, ${OLD}::text COLLATE "C" > ${SNAP}::text AS bytewise`
        expect(rows).toEqual([{ newer: true, bytewise: false }])
      }))

    it.effect("a snapshot newer than the stored state updates, deletes, re-creates and prunes it: stored rows and memory converge", () =>
      Effect.gen(function*() {
        const did = plc(951)
        // seen on the stream at OLD: a webhook the owner later moved to another URL, one the owner
        // later deleted, and the deletes of two more (one the owner later re-created); firehook saw
        // none of the later events
        yield* live([
          whEv(did, "moved", hook("https://old.example/hook"), { rev: OLD }),
          whEv(did, "deleted", hook("https://old.example/deleted"), { rev: OLD }),
          whEv(did, "again", hook("https://again.example/hook"), { rev: OLD, operation: "delete" }),
          whEv(did, "pruned", hook("https://pruned.example/hook"), { rev: OLD, operation: "delete" })
        ])
        expect(yield* memoryRkeys(did)).toEqual(["deleted", "moved"])
        expect(yield* storedState(did)).toEqual({
          webhooks: [`deleted https://old.example/deleted ${OLD}`, `moved https://old.example/hook ${OLD}`],
          tombstones: [`again ${OLD}`, `pruned ${OLD}`]
        })
        // the PDS at SNAP (newer): "moved" at its new URL, "again" re-created, "deleted" gone
        yield* setup(did, [
          { rkey: "again", value: hook("https://again.example/hook") },
          { rkey: "moved", value: hook("https://new.example/hook") }
        ], { rev: SNAP })
        const outcome = yield* reconcile(did)
        const rows = yield* Effect.flatMap(RegistryStore, (s) => s.ownerRows(did))
        expect({
          outcome: outcome._tag,
          stored: yield* storedState(did),
          ownerRows: rows.map((r) => `${r.rkey} ${r.url}`).sort(),
          memory: yield* memoryRkeys(did)
        }).toEqual({
          outcome: "complete",
          stored: {
            webhooks: [`again https://again.example/hook ${SNAP}`, `moved https://new.example/hook ${SNAP}`],
            // the scan's own tombstone stays (its rev is not older than the snapshot's)
            tombstones: [`deleted ${SNAP}`]
          },
          ownerRows: ["again https://again.example/hook", "moved https://new.example/hook"],
          memory: ["again", "moved"]
        })
      }))
  })
})
