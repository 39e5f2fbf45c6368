/**
 * What an owner sees of the cap of their stored records (`RECONCILE_MAX_RECORDS`, here 3) through
 * `dev.firehook.webhook.list` on a real server over PostgreSQL, with the records written through the
 * intake's processor (the registry stream's path): a new key over the cap is listed as `rejected`
 * with `limit_owner_records` (no URL, no scope: firehook stored nothing of it) next to the stored
 * records; once the owner deletes one and writes the refused key again, it is listed as a stored
 * record and no longer as rejected.
 */
import { describe, expect, layer } from "@effect/vitest"
import { Effect } from "effect"
import { run } from "../delivery/worker-support.js"
import { ev, plc, rev, sqlServices, WH, whRecordValue } from "../support/stack.js"
import { apiLayerWith, callAs, newOwner } from "./support.js"

const W = "dev.firehook.webhook"
const paused = whRecordValue(`at://${plc(9)}`, { enabled: false })

type View = { readonly [k: string]: unknown }
const listOf = (body: { readonly [k: string]: unknown }) =>
  (body["webhooks"] as ReadonlyArray<View>).map((w) => ({
    rkey: w["rkey"],
    state: w["state"],
    stateReason: w["stateReason"],
    url: w["url"]
  })).sort((a, b) => String(a.rkey).localeCompare(String(b.rkey)))

describe("list: the cap of an owner's stored records", () => {
  layer(apiLayerWith(sqlServices(), { env: { RECONCILE_MAX_RECORDS: "3" } }), {
    excludeTestServices: true,
    timeout: "60 seconds"
  })((it) => {
    it.effect("a new record over the cap is listed as rejected (limit_owner_records) until room is made", () =>
      Effect.gen(function*() {
        const alice = yield* newOwner()
        const wh = (rkey: string, n: number, operation: "create" | "update" = "create") =>
          ev(alice.did, WH, rkey, { record: paused, rev: rev(n), cid: `bafy${rkey}${n}`, operation })
        yield* run([wh("a", 1), wh("b", 2), wh("c", 3), wh("d", 4)])
        const url = "https://receiver.example/hook"
        const at = yield* callAs(alice, `${W}.list`)
        expect(at.status, at.text).toBe(200)
        expect(listOf(at.body)).toEqual([
          { rkey: "a", state: "disabled", stateReason: "record_disabled", url },
          { rkey: "b", state: "disabled", stateReason: "record_disabled", url },
          { rkey: "c", state: "disabled", stateReason: "record_disabled", url },
          { rkey: "d", state: "rejected", stateReason: "limit_owner_records", url: "" }
        ])
        // the owner deletes a record and writes the refused one again: it is stored and listed as such
        yield* run([ev(alice.did, WH, "a", { operation: "delete", rev: rev(5) })])
        yield* run([wh("d", 6, "update")])
        const after = yield* callAs(alice, `${W}.list`)
        expect(after.status, after.text).toBe(200)
        expect(listOf(after.body)).toEqual([
          { rkey: "b", state: "disabled", stateReason: "record_disabled", url },
          { rkey: "c", state: "disabled", stateReason: "record_disabled", url },
          { rkey: "d", state: "disabled", stateReason: "record_disabled", url }
        ])
      }))
  })
})
