/**
 * An owner's test delivery (SPEC §8.5 `dev.firehook.webhook.test`): one outbox row for the owner's
 * webhook, written through the outbox store's own enqueue statement (`insertBatch`: the body, the
 * row and the NOTIFY that wakes the workers), so the normal worker → destination → transport path
 * delivers it, signed like any other delivery. Its body is `Canonical.buildTestPayload`'s (event
 * `test`, `record: null`); the row carries the webhook's URL, signing and fingerprint as stored now,
 * so the worker's subscription check passes while the record stays as it is.
 *
 * A record firehook does not hold for the owner is `NotFound`; a disabled record (the worker would
 * cancel the row without a request), one marked gone (410, until its record changes or it is
 * resumed) or one auto-disabled by its failure streak (SPEC §4.3: the worker would park the row as a
 * dead letter without a request, until it is resumed) is `Inactive`, and nothing is enqueued.
 *
 * @since 0.1.0
 */
import { Clock, Data, Effect, Either, Random } from "effect"
import { WH_COLLECTION } from "../../schemas/WhRecord.js"
import { buildTestPayload, sha256Hex } from "../matching/Canonical.js"
import { type OutboxRow, OutboxStore } from "../matching/Outbox.js"
import { RegistryStore } from "../registry/RegistryStore.js"

export type TestDeliveryResult = Data.TaggedEnum<{
  Enqueued: { readonly deliveryId: string }
  NotFound: {}
  Inactive: { readonly reason: "disabled" | "gone" | "auto_disabled" }
}>
export const TestDeliveryResult = Data.taggedEnum<TestDeliveryResult>()

/** 128 random bits as hex (the test event's nonce). */
const nonce = Effect.map(
  Effect.all(Array.from({ length: 4 }, () => Random.nextIntBetween(0, 0x1_0000_0000))),
  (words) => words.map((w) => w.toString(16).padStart(8, "0")).join("")
)

/** Enqueue a test delivery to `owner`'s webhook `rkey`. */
export const enqueue = Effect.fn("TestDelivery.enqueue")(function*(owner: string, rkey: string) {
  const registry = yield* RegistryStore
  const outbox = yield* OutboxStore
  const { row } = yield* registry.get(owner, rkey)
  if (row === undefined) return TestDeliveryResult.NotFound()
  if (row.gone) return TestDeliveryResult.Inactive({ reason: "gone" })
  if (row.autoDisabled === true) return TestDeliveryResult.Inactive({ reason: "auto_disabled" })
  if (!row.active || !row.enabled) return TestDeliveryResult.Inactive({ reason: "disabled" })
  const timeUs = (yield* Clock.currentTimeMillis) * 1000
  const payload = buildTestPayload({ ownerDid: owner, rkey, timeUs, nonce: yield* nonce })
  // a record key and a DID are far below every canonical bound: a failure here is a bug
  if (Either.isLeft(payload)) return yield* Effect.dieMessage(`test payload: ${payload.left}`)
  const { body, deliveryId, eventId } = payload.right
  const outboxRow: OutboxRow = {
    deliveryId,
    eventId,
    ownerDid: owner,
    webhookRkey: rkey,
    matchKind: "direct",
    eventDid: owner,
    eventCollection: WH_COLLECTION,
    eventRkey: rkey,
    eventOperation: "test",
    targetUrl: row.url,
    signingMode: row.signingMode,
    secretId: row.secretId,
    fingerprint: row.fingerprint
  }
  yield* outbox.insertBatch([{ eventId, body, sha256: sha256Hex(body) }], [outboxRow])
  return TestDeliveryResult.Enqueued({ deliveryId })
})
