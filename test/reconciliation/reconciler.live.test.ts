/**
 * Reconciliation of one owner (SPEC §5.3) against a fake PLC and a fake PDS (real HTTP servers on
 * loopback, insecure development mode) and a real PostgreSQL, with live events: fencing against
 * them, and no loss while an owner is scanning or failed.
 */
import { describe, expect, layer } from "@effect/vitest"
import { Effect, Fiber } from "effect"
import { tidFromMicros } from "../../src/schemas/Tid.js"
import { RegistryStore } from "../../src/services/registry/RegistryStore.js"
import { listRecordsRequests } from "../support/fakeAtproto.js"
import { Fakes, reconcileStack, waitFor } from "../support/reconcile.js"
import { ev, plc, rev, whEv, whRecordValue } from "../support/stack.js"
import { hook, json, live, memoryRkeys, ownerState, POST, reconcile, setup, storedRkeys } from "./reconciler-support.js"

/** A post by `scope`: matches every webhook scoped to it. */
let postN = 0
const postBy = (scope: string) => ev(scope, POST, `p${++postN}`, { rev: rev(5_000 + postN) })

describe("Reconciler", () => {
  layer(reconcileStack(), { timeout: "120 seconds", excludeTestServices: true })(
    "fencing against live events",
    (it) => {
      /** Hold `did`'s listRecords until `release()`; returns the release function. */
      const holdPds = (did: string) =>
        Effect.gen(function*() {
          const fakes = yield* Fakes
          let release: () => void = () => undefined
          const gate = new Promise<void>((resolve) => (release = resolve))
          fakes.pds.handler = async (req) => {
            if (req.path === "/xrpc/com.atproto.repo.listRecords" && req.query.get("repo") === did) await gate
            return fakes.defaultPds(req)
          }
          return () => {
            release()
            fakes.pds.handler = fakes.defaultPds
          }
        })

      const scanning = (did: string) =>
        Effect.gen(function*() {
          const fakes = yield* Fakes
          yield* waitFor(() => listRecordsRequests(fakes.pds).some((r) => r.query.get("repo") === did))
          expect((yield* ownerState(did))?.status).toBe("scanning")
        })

      it.effect("a live create during the scan survives the snapshot's completion", () =>
        Effect.gen(function*() {
          const did = plc(201)
          yield* live([whEv(did, "old", hook(), { rev: rev(1) })])
          yield* setup(did, [{ rkey: "old", value: hook() }], { rev: rev(100) })
          const release = yield* holdPds(did)
          const fiber = yield* Effect.fork(reconcile(did))
          yield* scanning(did)
          // created after the snapshot was taken: not in the PDS pages
          yield* live([whEv(did, "fresh", hook("https://fresh.example/hook"), { rev: rev(150) })])
          release()
          expect((yield* Fiber.join(fiber))._tag).toBe("complete")
          expect(yield* storedRkeys(did)).toEqual(["fresh", "old"])
          expect(yield* memoryRkeys(did)).toEqual(["fresh", "old"])
          const { row } = yield* Effect.flatMap(RegistryStore, (s) => s.get(did, "fresh"))
          expect(row?.rev).toBe(rev(150))
        }))

      it.effect("a live delete during the scan is not resurrected by the snapshot", () =>
        Effect.gen(function*() {
          const did = plc(202)
          yield* live([whEv(did, "w", hook(), { rev: rev(1) })])
          // the snapshot still lists w (its rev is older than the delete)
          yield* setup(did, [{ rkey: "w", value: hook() }], { rev: rev(100) })
          const release = yield* holdPds(did)
          const fiber = yield* Effect.fork(reconcile(did))
          yield* scanning(did)
          yield* live([whEv(did, "w", undefined, { operation: "delete", rev: rev(150) })])
          release()
          expect((yield* Fiber.join(fiber))._tag).toBe("complete")
          expect(yield* storedRkeys(did)).toEqual([])
          expect(yield* memoryRkeys(did)).toEqual([])
          const { tombstone } = yield* Effect.flatMap(RegistryStore, (s) => s.get(did, "w"))
          expect(tombstone?.rev).toBe(rev(150))
        }))

      it.effect("with the TID fallback, a live delete during the scan is fenced by the snapshot's rev; a newer one is not resurrected", () =>
        Effect.gen(function*() {
          const did = plc(205)
          yield* live([whEv(did, "w", hook(), { rev: rev(1) })])
          // no getLatestCommit: the snapshot's rev is a TID of the scan's start
          yield* setup(did, [{ rkey: "w", value: hook() }])
          const release = yield* holdPds(did)
          const fiber = yield* Effect.fork(reconcile(did))
          yield* scanning(did)
          // not newer than the snapshot's rev: stored below the scan's token, so the snapshot decides
          // the key (SPEC §3.4; issue 14 item 4 and the audit of 6 December 2026 changed this)
          const older = yield* live([whEv(did, "w", undefined, { operation: "delete", rev: rev(150) })])
          expect(older.outcomes[0]).toMatchObject({ registry: { _tag: "deleted" } })
          // newer than the snapshot's rev (ahead of the scan's start): applied, and the snapshot,
          // which still lists w, does not bring it back
          const newer = tidFromMicros((Date.now() + 60_000) * 1000)
          yield* live([whEv(did, "w", undefined, { operation: "delete", rev: newer })])
          release()
          expect((yield* Fiber.join(fiber))._tag).toBe("complete")
          expect(yield* storedRkeys(did)).toEqual([])
          expect(yield* memoryRkeys(did)).toEqual([])
        }))

      it.effect("a webhook deleted while firehook was down is not brought back by a replay of its old create", () =>
        Effect.gen(function*() {
          const did = plc(203)
          const created = whEv(did, "w", hook(), { rev: rev(1) })
          yield* live([created])
          // the owner deleted it meanwhile: the PDS no longer has it
          yield* setup(did, [], { rev: rev(100) })
          expect((yield* reconcile(did))._tag).toBe("complete")
          expect(yield* storedRkeys(did)).toEqual([])
          // the stream replays the old create (and the delete)
          const replay = yield* live([
            whEv(did, "w", hook(), { rev: rev(1) }),
            whEv(did, "w", undefined, { operation: "delete", rev: rev(50) })
          ])
          expect(replay.outcomes.map((o) => (o._tag === "no_match" ? o.registry?._tag : o._tag))).toEqual([
            "stale",
            "stale"
          ])
          expect(yield* storedRkeys(did)).toEqual([])
          expect(yield* memoryRkeys(did)).toEqual([])
        }))

      it.effect("a newer scan fences an older one: the older one's writes stop", () =>
        Effect.gen(function*() {
          const did = plc(204)
          yield* setup(did, [{ rkey: "a", value: hook() }], { rev: rev(100) })
          const release = yield* holdPds(did)
          const first = yield* Effect.fork(reconcile(did))
          yield* scanning(did)
          release()
          const second = yield* reconcile(did)
          const firstOutcome = yield* Fiber.join(first)
          expect([firstOutcome._tag, second._tag].sort()).toEqual(["complete", "superseded"])
          expect(yield* storedRkeys(did)).toEqual(["a"])
        }))
    }
  )

  layer(reconcileStack(), { timeout: "120 seconds", excludeTestServices: true })(
    "no loss while an owner is scanning or failed",
    (it) => {
      it.effect("events for a scanning owner match its pre-scan registrations", () =>
        Effect.gen(function*() {
          const did = plc(301)
          const scope = plc(8_001)
          const h = whRecordValue(`at://${scope}`)
          const fakes = yield* Fakes
          yield* live([whEv(did, "kept", h, { rev: rev(1) }), whEv(did, "removed", h, { rev: rev(1) })])
          yield* setup(did, [{ rkey: "kept", value: h }], { rev: rev(100) })
          let release: () => void = () => undefined
          const gate = new Promise<void>((resolve) => (release = resolve))
          fakes.pds.handler = async (req) => {
            if (req.path === "/xrpc/com.atproto.repo.listRecords") await gate
            return fakes.defaultPds(req)
          }
          const fiber = yield* Effect.fork(reconcile(did))
          yield* waitFor(() => listRecordsRequests(fakes.pds).some((r) => r.query.get("repo") === did))
          expect((yield* Effect.flatMap(RegistryStore, (s) => s.owner(did)))?.status).toBe("scanning")
          // matched against both pre-scan registrations: nothing dropped because the PDS is slow
          const during = yield* live([postBy(scope)])
          expect(during.outcomes[0]).toMatchObject({ _tag: "enqueued", deliveries: 2 })
          release()
          fakes.pds.handler = fakes.defaultPds
          expect((yield* Fiber.join(fiber))._tag).toBe("complete")
          // after the scan only the webhook the snapshot kept matches
          expect(yield* memoryRkeys(did)).toEqual(["kept"])
          const after = yield* live([postBy(scope)])
          expect(after.outcomes[0]).toMatchObject({ _tag: "enqueued", deliveries: 1 })
        }))

      it.effect("an owner whose PDS is down keeps matching its known webhooks", () =>
        Effect.gen(function*() {
          const did = plc(302)
          const scope = plc(8_002)
          const fakes = yield* Fakes
          yield* live([whEv(did, "w", whRecordValue(`at://${scope}`), { rev: rev(1) })])
          yield* setup(did, [], { rev: rev(100) })
          fakes.pds.handler = (req) =>
            req.query.get("repo") === did || req.query.get("did") === did ? json(503, {}) : fakes.defaultPds(req)
          const outcome = yield* reconcile(did)
          fakes.pds.handler = fakes.defaultPds
          expect(outcome).toEqual({ _tag: "failed", kind: "pds_status" })
          const r = yield* live([postBy(scope)])
          expect(r.outcomes[0]).toMatchObject({ _tag: "enqueued", deliveries: 1 })
          expect(yield* memoryRkeys(did)).toEqual(["w"])
        }))
    }
  )
})
