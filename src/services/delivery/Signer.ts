/**
 * Request signatures for the `webhook` destination preset (SPEC §4.5).
 *
 * Two schemes are sent on every signed request:
 *
 * - wisp-compatible: `X-Webhook-Signature: sha256=<lowercase hex HMAC-SHA256(secret, body)>`, where the
 *   HMAC key is the UTF-8 bytes of the secret string exactly as configured (a `whsec_` secret is NOT
 *   decoded for this scheme; wisp.place receivers use the raw string).
 * - Standard Webhooks v1: `webhook-id`, `webhook-timestamp` and
 *   `webhook-signature: v1,<base64 HMAC-SHA256(key, "<id>.<timestamp>.<body>")>`.
 *
 * Everything here is pure and synchronous. Bodies and secrets are hashed as UTF-8.
 *
 * @since 0.1.0
 */
import { createHmac } from "node:crypto"

/** Prefix of Standard Webhooks symmetric secrets. */
export const WHSEC_PREFIX = "whsec_"

const encoder = new TextEncoder()

const STRICT_BASE64 = /^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}(?:==)?|[A-Za-z0-9+/]{3}=?)?$/

/**
 * The wisp-compatible signature header value: `sha256=<lowercase hex HMAC-SHA256(secret, body)>`.
 */
export const wispSignature = (secret: string, body: string): string =>
  "sha256=" + createHmac("sha256", secret).update(body, "utf8").digest("hex")

/**
 * The Standard Webhooks HMAC key for a secret.
 *
 * - `whsec_<base64>`: the base64-decoded bytes after the prefix (standard alphabet, padding optional).
 * - anything else: the UTF-8 bytes of the whole secret.
 *
 * Decision (spec silent): a `whsec_` secret whose remainder is not valid base64, or decodes to zero
 * bytes, is treated like any other plain secret (UTF-8 bytes of the WHOLE string, prefix included), so
 * signing never fails; a receiver must then verify with the raw key.
 */
export const standardWebhooksKey = (secret: string): Uint8Array => {
  if (secret.startsWith(WHSEC_PREFIX)) {
    const rest = secret.slice(WHSEC_PREFIX.length)
    if (rest.length > 0 && STRICT_BASE64.test(rest)) {
      const decoded = Buffer.from(rest, "base64")
      if (decoded.length > 0) {
        return new Uint8Array(decoded.buffer, decoded.byteOffset, decoded.byteLength)
      }
    }
  }
  return encoder.encode(secret)
}

/**
 * The Standard Webhooks v1 signature: `v1,<base64 HMAC-SHA256(key, "<id>.<timestampSeconds>.<body>")>`.
 * `timestampSeconds` is truncated to an integer (the header carries integer unix seconds).
 */
export const standardWebhooksSignature = (
  key: Uint8Array,
  id: string,
  timestampSeconds: number,
  body: string
): string =>
  "v1," +
  createHmac("sha256", key)
    .update(`${id}.${Math.trunc(timestampSeconds)}.`, "utf8")
    .update(body, "utf8")
    .digest("base64")

/** Input of {@link signatureHeaders}. */
export interface SignatureInput {
  readonly secret: string
  readonly deliveryId: string
  readonly timestampSeconds: number
  readonly body: string
}

/**
 * All signature headers of one signed attempt:
 * `X-Webhook-Signature`, `webhook-id`, `webhook-timestamp`, `webhook-signature`.
 */
export const signatureHeaders = (input: SignatureInput): Record<string, string> => {
  const timestamp = Math.trunc(input.timestampSeconds)
  return {
    "X-Webhook-Signature": wispSignature(input.secret, input.body),
    "webhook-id": input.deliveryId,
    "webhook-timestamp": String(timestamp),
    "webhook-signature": standardWebhooksSignature(
      standardWebhooksKey(input.secret),
      input.deliveryId,
      timestamp,
      input.body
    )
  }
}
