/**
 * A valid `place.wisp.v2.wh` record that PostgreSQL cannot store (a NUL, or a lone surrogate, in
 * any of its strings or in its cid) is refused on the registry stream as `unstorable`, as
 * reconciliation refuses it: the previous registration of its key is revoked, the refusal is
 * listed, it is counted, and the batch commits (SPEC §3.3: poison never blocks a stream). Before,
 * the row's write failed (`jsonb` refuses `\u0000`), the batch failed three times, and the stream
 * reconnected from its cursor to fail again, forever.
 */
import { describe, expect, it, type Vitest } from "@effect/vitest"
import { Duration, Effect, Layer, Ref, Stream } from "effect"
import type { RecordEvent } from "../../src/schemas/RecordEvent.js"
import * as FirehoseSource from "../../src/services/intake/FirehoseSource.js"
import * as Intake from "../../src/services/intake/Intake.js"
import { Processor } from "../../src/services/matching/Processor.js"
import { Registry } from "../../src/services/registry/Registry.js"
import * as RegistryStore from "../../src/services/registry/RegistryStore.js"
import * as RejectedStore from "../../src/services/registry/RejectedStore.js"
import { eventually } from "../support/eventually.js"
import { commitFrame, startFakeJetstream } from "../support/fakeJetstream.js"
import { ev, memoryStack, plc, rev, sqlStack, WH, whRecordValue } from "../support/stack.js"

const BOB = plc(9_000)
const valid = (o: Parameters<typeof whRecordValue>[1] = {}) => whRecordValue(`at://${BOB}`, o)

const wh = (
  owner: string,
  rkey: string,
  n: number,
  record: unknown,
  o: { readonly operation?: "create" | "update"; readonly cid?: string } = {}
) => ev(owner, WH, rkey, { record, rev: rev(n), cid: o.cid ?? `bafy${rkey}${n}`, operation: o.operation ?? "create" })

/** Process events as one registry-stream batch; each event's registry outcome (tag, and kind if invalid). */
const live = (events: ReadonlyArray<RecordEvent>) =>
  Effect.flatMap(Processor, (p) => p.processEvents(events, { registryWriter: true })).pipe(
    Effect.map((r) =>
      r.outcomes.map((o) => {
        const reg = "registry" in o ? o.registry : undefined
        if (reg === undefined) return o._tag
        return reg._tag === "invalid" ? `invalid:${reg.kind}` : reg._tag
      })
    )
  )

const listed = (owner: string) =>
  Effect.flatMap(RejectedStore.RejectedStore, (s) => s.list(owner)).pipe(
    Effect.map((entries) => entries.map((e) => ({ rkey: e.rkey, rev: e.rev, cid: e.cid, reason: e.reason })))
  )

const indexed = (owner: string) => Effect.map(Registry, (r) => r.index.byOwner(owner).map((w) => w.rkey).sort())
const stored = (owner: string, rkey: string) => Effect.flatMap(RegistryStore.RegistryStore, (s) => s.get(owner, rkey))

const memory = () => {
  const state = RegistryStore.emptyMemoryState()
  return Layer.fresh(
    memoryStack({
      registryStore: Layer.effect(
        RegistryStore.RegistryStore,
        Effect.map(Ref.make(state), RegistryStore.makeMemoryOver)
      )
    }).pipe(Layer.merge(Layer.succeed(RejectedStore.RejectedStore, RejectedStore.makeMemoryOver(state.rejected))))
  )
}
const sql = () => Layer.fresh(RejectedStore.layerSql.pipe(Layer.provideMerge(sqlStack())))

type Stack = Processor | Registry | RegistryStore.RegistryStore | RejectedStore.RejectedStore

const behaviour = (it: Vitest.MethodsNonLive<Stack>, base: number) => {
  it.effect("a NUL in the secret: refused as unstorable, the previous version revoked, the batch goes on", () =>
    Effect.gen(function*() {
      const owner = plc(base + 1)
      const before = (yield* (yield* Registry).stats).invalidRecords
      expect(yield* live([wh(owner, "a", 1, valid())])).toEqual(["active"])
      expect(
        yield* live([
          wh(owner, "a", 2, valid({ secret: "abc\u0000def" }), { operation: "update" }),
          wh(owner, "b", 3, valid({ secret: "goodsecret" }))
        ])
      ).toEqual(["invalid:unstorable", "active"])
      // revoked as for an invalid version: no row, a tombstone at the refused rev, not indexed
      const a = yield* stored(owner, "a")
      expect(a.row).toBeUndefined()
      expect(a.tombstone?.rev).toBe(rev(2))
      expect(yield* indexed(owner)).toEqual(["b"])
      expect(yield* listed(owner)).toEqual([{ rkey: "a", rev: rev(2), cid: "bafya2", reason: "unstorable" }])
      expect((yield* (yield* Registry).stats).invalidRecords).toBe(before + 1)
    }))

  it.effect("a lone surrogate in the URL (a valid URL) or a NUL in the cid: unstorable too; disabled or not", () =>
    Effect.gen(function*() {
      const owner = plc(base + 2)
      expect(
        yield* live([
          wh(owner, "u", 1, valid({ url: "https://receiver.example/\ud800" })),
          wh(owner, "d", 2, valid({ secret: "\u0000", enabled: false })),
          wh(owner, "c", 3, valid(), { cid: "bafy\u0000" }),
          // an invalid record whose cid cannot be stored: listed with its error kind, without the cid
          wh(owner, "i", 4, valid({ url: "http://receiver.example/hook" }), { cid: "bafy\ud800" }),
          wh(owner, "ok", 5, valid())
        ])
      ).toEqual(["invalid:unstorable", "invalid:unstorable", "invalid:unstorable", "invalid:url", "active"])
      expect(yield* indexed(owner)).toEqual(["ok"])
      expect((yield* stored(owner, "d")).row).toBeUndefined()
      expect((yield* listed(owner)).sort((x, y) => x.rkey.localeCompare(y.rkey))).toEqual([
        { rkey: "c", rev: rev(3), cid: undefined, reason: "unstorable" },
        { rkey: "d", rev: rev(2), cid: "bafyd2", reason: "unstorable" },
        { rkey: "i", rev: rev(4), cid: undefined, reason: "url" },
        { rkey: "u", rev: rev(1), cid: "bafyu1", reason: "unstorable" }
      ])
    }))

  it.effect("another webhook watching the owner still gets the refused record's event (the batch commits)", () =>
    Effect.gen(function*() {
      const owner = plc(base + 4)
      const watcher = plc(base + 5)
      expect(yield* live([wh(watcher, "w", 1, whRecordValue(`at://${owner}`))])).toEqual(["active"])
      const r = yield* Effect.flatMap(Processor, (p) =>
        p.processEvents([
          wh(owner, "a", 2, valid({ secret: "abc\u0000def" })),
          wh(owner, "b", 3, valid({ url: "https://receiver.example/\udc00" }))
        ], { registryWriter: true }))
      expect(r.outcomes.map((o) => ("registry" in o && o.registry?._tag === "invalid" ? o.registry.kind : o._tag)))
        .toEqual(["unstorable", "unstorable"])
      expect(r.inserted).toBe(2)
    }))

  it.effect("a storable version afterwards registers the key and clears the refusal", () =>
    Effect.gen(function*() {
      const owner = plc(base + 3)
      expect(yield* live([wh(owner, "a", 1, valid({ secret: "x\u0000" }))])).toEqual(["invalid:unstorable"])
      expect(yield* live([wh(owner, "a", 2, valid({ secret: "x" }), { operation: "update" })])).toEqual(["active"])
      expect(yield* indexed(owner)).toEqual(["a"])
      expect(yield* listed(owner)).toEqual([])
    }))
}

describe("isStorableText / isStorableRow (the one check of the stream and reconciliation)", () => {
  it("refuses a NUL and a lone surrogate; accepts a pair and the text of an escape", () => {
    expect(RegistryStore.isStorableText("abc")).toBe(true)
    expect(RegistryStore.isStorableText("a\u0000")).toBe(false)
    expect(RegistryStore.isStorableText("\ud800")).toBe(false)
    expect(RegistryStore.isStorableText("x\udc00y")).toBe(false)
    expect(RegistryStore.isStorableText("\udc00\ud800")).toBe(false)
    expect(RegistryStore.isStorableText("\ud83d\ude00")).toBe(true)
    // a backslash followed by `u0000` is six storable characters, not a NUL
    expect(RegistryStore.isStorableText("\\u0000 \\ud800")).toBe(true)
  })
})

describe("unstorable wh records on the registry stream (memory)", () => {
  it.layer(memory())("refusals", (it) => behaviour(it, 0))
})

describe("unstorable wh records on the registry stream (PostgreSQL)", () => {
  it.layer(sql(), { timeout: "120 seconds" })("refusals", (it) => behaviour(it, 1_000))
})

// ---------------------------------------------------------------------------------------------
// The stream itself (real WebSockets, real PostgreSQL): the audit's reproduction

const T0 = 1_750_000_000_000_000

describe("the registry stream does not stall on an unstorable record (PostgreSQL, Jetstream)", () => {
  it.scopedLive(
    "a NUL-secret record is refused; the valid record after it is registered; one connection",
    () =>
      Effect.gen(function*() {
        const fake = yield* Effect.acquireRelease(
          Effect.promise(() => startFakeJetstream()),
          (f) => Effect.promise(() => f.close())
        )
        const registry = yield* Registry
        const spec: Intake.StreamSpec = {
          name: "registry",
          relay: "ws://127.0.0.1",
          registryWriter: true,
          initialCursor: 0n,
          rewind: 2_000_000n,
          cursorIsTime: true,
          connect: (cursor) =>
            FirehoseSource.connectJetstream({
              url: fake.url,
              cursor,
              stream: "registry",
              relay: "ws://127.0.0.1",
              maxBytes: 1 << 20,
              connectTimeoutMs: 5000,
              allowInsecure: true
            }).pipe(Stream.map(Intake.jetstreamItem))
        }
        const tuning: Intake.IntakeTuning = {
          ...Intake.defaultTuning(64, 128),
          batchRetryBase: Duration.millis(5),
          backoffBase: Duration.millis(10),
          backoffCap: Duration.millis(50),
          poisonBackoff: Duration.millis(20)
        }
        const runner = yield* Intake.makeStreamRunner(spec, tuning)
        yield* Effect.forkScoped(runner.run)
        yield* eventually(Effect.sync(() => fake.connections.some((c) => c.options.length > 0)), "subscribed")
        const attacker = plc(7_001)
        const owner = plc(7_002)
        fake.publish([
          commitFrame(attacker, T0 + 1000, WH, "3kaaaaaaaaaa2", "create", valid({ secret: "abc\u0000def" }))
        ])
        fake.publish([commitFrame(owner, T0 + 2000, WH, "3kbbbbbbbbbb2", "create", valid({ secret: "goodsecret" }))])
        yield* eventually(
          Effect.map(Ref.get(runner.state), (s) => s.durableCursor === BigInt(T0 + 2000)),
          "the cursor passed both records"
        )
        expect(registry.index.byOwner(owner).map((w) => w.rkey)).toEqual(["3kbbbbbbbbbb2"])
        expect(registry.index.byOwner(attacker)).toEqual([])
        const state = yield* Ref.get(runner.state)
        expect(state.failureKind).toBeUndefined()
        expect(fake.connections.length).toBe(1)
        const refused = yield* Effect.flatMap(RejectedStore.RejectedStore, (s) => s.list(attacker))
        expect(refused.map((e) => ({ rkey: e.rkey, reason: e.reason, source: e.source }))).toEqual([
          { rkey: "3kaaaaaaaaaa2", reason: "unstorable", source: "stream" }
        ])
      }).pipe(Effect.provide(sql())),
    60_000
  )
})
