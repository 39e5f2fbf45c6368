/**
 * The SPEC's fixed bounds, by value. Most behaviour tests measure against these constants (so
 * they check the comparison, inclusive or exclusive); this file pins the numbers themselves to the
 * SPEC, so that a constant moved by one (or by a unit: KiB for kB, characters for bytes) fails
 * here even when every test written against the constant still passes.
 */
import { describe, expect, it } from "@effect/vitest"
import { Duration } from "effect"
import * as WebhookLexicon from "../src/schemas/WebhookLexicon.js"
import * as Tail from "../src/services/api/Tail.js"
import * as Xrpc from "../src/services/api/Xrpc.js"
import * as Attempt from "../src/services/delivery/Attempt.js"
import * as DeliveryStore from "../src/services/delivery/DeliveryStore.js"
import * as RetryPolicy from "../src/services/delivery/RetryPolicy.js"
import * as Secrets from "../src/services/delivery/Secrets.js"
import * as WebhookHealthSql from "../src/services/delivery/WebhookHealthSql.js"
import * as Canonical from "../src/services/matching/Canonical.js"
import * as Outbox from "../src/services/matching/Outbox.js"
import * as PriorRefIndex from "../src/services/matching/PriorRefIndex.js"
import * as References from "../src/services/matching/References.js"
import * as Health from "../src/services/platform/Health.js"
import * as Limits from "../src/services/platform/http/Limits.js"
import * as Identity from "../src/services/reconciliation/Identity.js"
import * as Reconciler from "../src/services/reconciliation/Reconciler.js"
import * as RejectedStore from "../src/services/registry/RejectedStore.js"

const KiB = 1024
const MiB = 1024 * KiB

describe("the SPEC's fixed bounds, by value", () => {
  it("§2.3 references walk: depth 32, 2,048 nodes, 256 KiB of strings, 256 keys, 256 references, 100 kept", () => {
    expect(References.ReferenceLimits).toEqual({
      maxDepth: 32,
      maxNodes: 2048,
      maxStringBytes: 256 * KiB,
      maxKeysPerObject: 256,
      maxReferences: 256,
      maxRelevant: 100
    })
  })

  it("§2.4 prior references: ≤ 100 refs, ≤ 32 KiB a row", () => {
    expect([PriorRefIndex.defaultPriorRefLimits.maxRefs, PriorRefIndex.defaultPriorRefLimits.maxBytes]).toEqual([
      100,
      32 * KiB
    ])
  })

  it("§3.5 payload: depth 64, 4,096 keys, keys ≤ 512, strings and body ≤ 512 KiB; 16 MiB events, 1,000-row / 4 MiB chunks", () => {
    expect(Canonical.CanonicalLimits).toEqual({
      maxDepth: 64,
      maxKeysPerObject: 4096,
      maxKeyBytes: 512,
      maxStringBytes: 512 * KiB,
      maxBodyBytes: 512 * KiB
    })
    expect(Outbox.defaultLimits(7)).toMatchObject({
      maxFanout: 7,
      maxEventBytes: 16 * MiB,
      chunkRows: 1000,
      chunkBytes: 4 * MiB
    })
  })

  it("§4.3 / §4.5 delivery: Retry-After ≤ 1 h, 10,000 parked rows, request ≤ 512 KiB, read ≤ 64 KiB, keep 1 KiB", () => {
    expect(RetryPolicy.RETRY_AFTER_CAP_MS).toBe(3_600_000)
    expect(WebhookHealthSql.PARK_MAX).toBe(10_000)
    expect(Limits.DEFAULT_MAX_REQUEST_BYTES).toBe(512 * KiB)
    expect(Attempt.MAX_RESPONSE_BYTES).toBe(64 * KiB)
    expect(DeliveryStore.RESPONSE_EXCERPT_BYTES).toBe(KiB)
  })

  it("§4.6 / §5.3 service calls: 1 MiB DID documents, listRecords pages and bounds", () => {
    expect(Identity.IDENTITY_MAX_RESPONSE_BYTES).toBe(MiB)
    expect(Reconciler.defaultLimits).toMatchObject({
      maxPages: 20,
      maxRecords: 1000,
      maxPageRecords: 100,
      maxPageBytes: 512 * KiB,
      maxTotalBytes: 10 * MiB,
      maxCursorLength: 2048,
      maxCidLength: 256,
      maxOtherScanning: 8,
      batchSize: 100
    })
  })

  it("§6.2 health numbers clamped to 1,000,000", () => {
    expect(Health.CLAMP_MAX).toBe(1_000_000)
  })

  it("§8 owners' API: 64 KiB bodies, 10 s, 1,000 secrets, 100 attempts shown, 10,000 replayed, 100 rejected, 4 tails for 24 h", () => {
    expect(Xrpc.MAX_BODY_BYTES).toBe(64 * KiB)
    expect(Duration.toMillis(Xrpc.CALL_DEADLINE)).toBe(10_000)
    expect(Secrets.MAX_SECRETS_PER_OWNER).toBe(1000)
    expect(WebhookLexicon.MAX_ATTEMPTS_SHOWN).toBe(100)
    expect(WebhookLexicon.REPLAY_MAX).toBe(10_000)
    expect(RejectedStore.REJECTED_LIMITS.perOwner).toBe(100)
    expect(Tail.MAX_CONNECTIONS_PER_DID).toBe(4)
    expect(Duration.toMillis(Tail.MAX_LIFETIME)).toBe(24 * 3_600_000)
  })
})
