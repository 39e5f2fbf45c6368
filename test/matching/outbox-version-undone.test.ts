/**
 * An untried row cancelled `subscription_changed` while its webhook was at an intermediate version
 * is revived by the registration replay of its event when the webhook comes back to the row's own
 * version (URL1 → URL2 → URL1: an edit undone, or a pause then a resume with the same settings),
 * on real PostgreSQL through the processor and the delivery store. Before, the move required
 * another fingerprint (`o.fingerprint IS DISTINCT FROM r.fingerprint`) for cancelled rows too, so
 * the row stayed cancelled and the event, never sent anywhere, was lost for that webhook only.
 *
 * w1: URL1 → URL2 → URL1; w2 (control): URL1 → URL2 → URL3. A post P is enqueued for both under
 * URL1; a worker claims both rows while the webhooks are at URL2 and cancels them
 * `subscription_changed` (no request). The registry then writes the third versions and the direct
 * stream replays P: both rows are pending again, each at its webhook's current version.
 */
import * as SqlClient from "@effect/sql/SqlClient"
import { describe, expect, it } from "@effect/vitest"
import { Effect, Layer } from "effect"
import { DeliveryStore, layerSql as deliveryLayerSql } from "../../src/services/delivery/DeliveryStore.js"
import { Processor } from "../../src/services/matching/Processor.js"
import { ev, plc, rev, sqlStack, whEv, whRecordValue } from "../support/stack.js"

const OWNER = plc(1)
const ALICE = plc(2)
const URL1 = "https://one.example/hook"
const URL2 = "https://two.example/hook"
const URL3 = "https://three.example/hook"

describe("outbox: a webhook back at the version of a row cancelled subscription_changed", () => {
  it.scoped("the replay of the event revives the untried row at that version (and moves the control's)", () =>
    Effect.gen(function*() {
      const p = yield* Processor
      const ds = yield* DeliveryStore
      const sql = yield* SqlClient.SqlClient
      const register = (rkey: string, url: string, n: number) =>
        p.processEvents([whEv(OWNER, rkey, whRecordValue(`at://${ALICE}`, { url }), { rev: rev(n) })], {
          registryWriter: true
        })
      yield* register("w1", URL1, 1)
      yield* register("w2", URL1, 1)
      const post = ev(ALICE, "app.bsky.feed.post", "p1", { rev: rev(2), stream: "direct" })
      expect((yield* p.processEvents([post], { registryWriter: false })).inserted).toBe(2)
      // the webhooks' second versions
      yield* register("w1", URL2, 3)
      yield* register("w2", URL2, 3)
      // a worker claims both rows and its fresh subscription check cancels them (no request)
      const claimed = yield* ds.claim("host:w:1", 10, 60_000)
      expect(claimed.rows).toHaveLength(2)
      for (const r of claimed.rows) {
        expect(yield* ds.cancel(r.deliveryId, r.leaseToken, "subscription_changed")).toBe(true)
      }
      // third versions: w1 back to URL1 (its first version again), w2 to URL3
      yield* register("w1", URL1, 4)
      yield* register("w2", URL3, 4)
      // the direct stream's replay for the new registrations reads P again: both rows count
      expect((yield* p.processEvents([post], { registryWriter: false })).inserted).toBe(2)
      const rows = yield* sql<{ webhook_rkey: string; status: string; target_url: string; attempt_count: number }>`
        SELECT webhook_rkey, status, target_url, attempt_count FROM outbox ORDER BY webhook_rkey`
      expect(rows).toEqual([
        { webhook_rkey: "w1", status: "pending", target_url: URL1, attempt_count: 0 },
        { webhook_rkey: "w2", status: "pending", target_url: URL3, attempt_count: 0 }
      ])
      // both are claimable now, each at its webhook's current URL
      const again = yield* ds.claim("host:w:1", 10, 60_000)
      expect(again.rows.map((r) => r.targetUrl).sort()).toEqual([URL1, URL3].sort())
    }).pipe(Effect.provide(Layer.provideMerge(deliveryLayerSql, sqlStack()))))
})
