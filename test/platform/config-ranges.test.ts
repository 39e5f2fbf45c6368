/**
 * Config.load's numeric ranges: each knob's default and both ends of its range, the at-least rules
 * of §5 accepting equality, the SPEC's hard ranges (ends accepted, one past refused), and list
 * variables holding exactly their bound of entries. Out-of-range values: config-invalid.test.ts.
 */
import { describe, expect, it } from "@effect/vitest"
import { Effect, Either } from "effect"
import { MAX_ALLOW_CIDRS } from "../../src/services/delivery/DeliveryConfig.js"
import * as Config from "../../src/services/platform/Config.js"
import { knobs, load } from "./config-support.js"

describe("Config", () => {
  for (const k of knobs) {
    it.effect(`${k.name}: default ${k.def}, accepts ${k.min} and ${k.max}`, () =>
      Effect.gen(function*() {
        expect(k.get(yield* load({ ...k.env }))).toBe(k.def)
        expect(k.get(yield* load({ ...k.env, [k.name]: "" }))).toBe(k.def)
        expect(k.get(yield* load({ ...k.env, [k.name]: String(k.min) }))).toBe(k.min)
        expect(k.get(yield* load({ ...k.env, [k.name]: String(k.max) }))).toBe(k.max)
      }))
  }

  it.effect("WEBHOOK_INTAKE_BACKOFF_MAX_MS may equal WEBHOOK_INTAKE_BACKOFF_BASE_MS", () =>
    Effect.gen(function*() {
      const c = yield* load({ WEBHOOK_INTAKE_BACKOFF_BASE_MS: "600000", WEBHOOK_INTAKE_BACKOFF_MAX_MS: "600000" })
      expect([c.intake.backoffBaseMs, c.intake.backoffMaxMs]).toEqual([600000, 600000])
    }))

  it.effect("each at-least rule of §5 accepts equality", () =>
    Effect.gen(function*() {
      const c = yield* load({
        IDENTITY_CACHE_STALE_MS: "86400000",
        IDENTITY_CACHE_MAX_AGE_MS: "86400000",
        BACKFILL_RETRY_BASE_MS: "600000",
        BACKFILL_RETRY_MAX_MS: "600000",
        RECONCILE_PAGE_MAX_BYTES: "16777216",
        RECONCILE_MAX_BYTES: "16777216"
      })
      expect(c.identity).toEqual({ cacheStaleMs: 86_400_000, cacheMaxAgeMs: 86_400_000 })
      expect([c.backfill.retryBaseMs, c.backfill.retryMaxMs]).toEqual([600_000, 600_000])
      expect([c.reconcile.pageMaxBytes, c.reconcile.maxBytes]).toEqual([16_777_216, 16_777_216])
    }))

  // The ranges the SPEC states as hard (§2.6's hard max, §3.2's 1 KiB–8 MiB frame, §4.3's 1–50
  // attempts, §4.5's 100 ms–30 s, §6.3's 1–120 s, §5.2's 1–4 and §5.4's 1–2 concurrency): each end
  // is accepted, one past it is refused, so a widened range cannot pass unnoticed.
  const hard: ReadonlyArray<
    readonly [string, number, number, (c: Config.FirehookConfigShape) => number, Record<string, string>]
  > = [
    ["REGISTRY_ACTIVE_SUBSCRIPTIONS_MAX", 1, 1_000_000, (c) => c.registry.activeMax, { FIREHOSE_SOURCE: "relay" }],
    ["REGISTRY_ACTIVE_SUBSCRIPTIONS_MAX", 1, 10_000, (c) => c.registry.activeMax, { FIREHOSE_SOURCE: "jetstream" }],
    ["REGISTRY_OWNER_ACTIVE_RECORDS_MAX", 1, 10_000, (c) => c.registry.ownerActiveMax, {}],
    ["REGISTRY_DIRECT_SCOPE_DIDS_MAX", 1, 10_000, (c) => c.registry.directDidsMax, {}],
    ["REGISTRY_BACKLINK_SCOPE_DIDS_MAX", 1, 10_000, (c) => c.registry.backlinkDidsMax, {}],
    ["WEBHOOK_INTAKE_EVENT_MAX_BYTES", 1024, 8_388_608, (c) => c.intake.eventMaxBytes, {}],
    ["DELIVERY_MAX_ATTEMPTS", 1, 50, (c) => c.delivery.maxAttempts, {}],
    ["DELIVERY_TIMEOUT_MS", 100, 30_000, (c) => c.delivery.timeoutMs, {}],
    ["SHUTDOWN_TIMEOUT_MS", 1000, 120_000, (c) => c.shutdownTimeoutMs, {}],
    ["BACKFILL_CONCURRENCY", 1, 4, (c) => c.backfill.concurrency, {}],
    ["RETRY_SCHEDULER_CONCURRENCY", 1, 2, (c) => c.retryScheduler.concurrency, {}]
  ]
  for (const [name, min, max, get, base] of hard) {
    it.effect(`${name}${base["FIREHOSE_SOURCE"] === undefined ? "" : ` (${base["FIREHOSE_SOURCE"]})`}: the SPEC's hard range ${min}..${max}, ends accepted, one past refused`, () =>
      Effect.gen(function*() {
        expect(get(yield* load({ ...base, [name]: String(min) }))).toBe(min)
        expect(get(yield* load({ ...base, [name]: String(max) }))).toBe(max)
        for (const past of [min - 1, max + 1]) {
          const r = yield* Effect.either(load({ ...base, [name]: String(past) }))
          expect(Either.isLeft(r) ? r.left.variable : `accepted ${past}`).toBe(name)
        }
      }))
  }

  // SPEC §6.5: a list variable holds at most its bound of entries; exactly the bound is accepted,
  // one more is a startup error
  describe("list variables: exactly their bound of entries, not one more", () => {
    const cidrs = (n: number) => Array.from({ length: n }, (_, i) => `10.${i >> 8}.${i & 255}.0/24`).join(",")
    const owners = (n: number) => Array.from({ length: n }, (_, i) => `did:web:o${i}.example.com`).join(",")

    it.effect(`DELIVERY_ALLOW_CIDRS: ${MAX_ALLOW_CIDRS} networks`, () =>
      Effect.gen(function*() {
        const c = yield* load({ DELIVERY_ALLOW_CIDRS: cidrs(MAX_ALLOW_CIDRS) })
        expect(c.delivery.allowCidrs).toHaveLength(MAX_ALLOW_CIDRS)
        const over = yield* Effect.either(load({ DELIVERY_ALLOW_CIDRS: cidrs(MAX_ALLOW_CIDRS + 1) }))
        expect(Either.isLeft(over) && over.left.variable).toBe("DELIVERY_ALLOW_CIDRS")
      }))

    it.effect(`BACKFILL_OWNERS: ${Config.MAX_BACKFILL_OWNERS} DIDs`, () =>
      Effect.gen(function*() {
        const c = yield* load({ BACKFILL_OWNERS: owners(Config.MAX_BACKFILL_OWNERS) })
        expect(c.backfill.owners).toHaveLength(Config.MAX_BACKFILL_OWNERS)
        const over = yield* Effect.either(load({ BACKFILL_OWNERS: owners(Config.MAX_BACKFILL_OWNERS + 1) }))
        expect(Either.isLeft(over) && over.left.variable).toBe("BACKFILL_OWNERS")
      }))
  })
})
