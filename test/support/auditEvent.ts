/** A sample audit event for the publisher's tests (`overrides` replace its fields). */
import type * as Publisher from "../../src/services/delivery/Publisher.js"

export const auditEvent = (overrides: Partial<Publisher.AuditEvent> = {}): Publisher.AuditEvent => ({
  deliveryId: "whd_v1_abc",
  eventId: "whe_v1_def",
  ownerDid: "did:plc:owner",
  webhookRkey: "3kwebhook",
  did: "did:plc:subject",
  collection: "app.bsky.feed.post",
  rkey: "3kpost",
  operation: "create",
  status: "delivered",
  httpStatus: 200,
  errorKind: null,
  url: "[redacted]",
  time: "2026-01-01T00:00:00.000Z",
  ...overrides
})
