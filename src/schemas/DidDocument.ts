/**
 * DID documents (SPEC §5.1), as far as firehook reads them: the document's `id`, its `service`
 * entries, to find the account's PDS, and its `verificationMethod` entries, to find the `#atproto`
 * signing key that verifies the account's service tokens (SPEC §8.2).
 *
 * The document is untrusted input from the network: it is decoded with a Schema (unknown fields
 * ignored, sizes bounded), and a service entry that does not decode is skipped rather than failing
 * the whole document (DID Core allows many service shapes; only the atproto PDS entry matters).
 *
 * @since 0.1.0
 */
import { Either, Schema } from "effect"

/** At most this many `service` entries are accepted in one document. */
export const MAX_SERVICES = 64

/** Bound on a service `id` / `type` string. */
const MAX_ID_LENGTH = 2048

/** At most this many `verificationMethod` entries are accepted in one document. */
export const MAX_VERIFICATION_METHODS = 64

/**
 * The envelope: `id` and optional, bounded `service` and `verificationMethod` arrays (entries
 * decoded one by one).
 */
export const DidDocument = Schema.Struct({
  id: Schema.String.pipe(Schema.maxLength(MAX_ID_LENGTH)),
  service: Schema.optional(Schema.Array(Schema.Unknown).pipe(Schema.maxItems(MAX_SERVICES))),
  verificationMethod: Schema.optional(
    Schema.Array(Schema.Unknown).pipe(Schema.maxItems(MAX_VERIFICATION_METHODS))
  )
})
export type DidDocument = typeof DidDocument.Type

/** One service entry; `serviceEndpoint` must be a string for the atproto PDS. */
export const ServiceEntry = Schema.Struct({
  id: Schema.String.pipe(Schema.maxLength(MAX_ID_LENGTH)),
  type: Schema.String.pipe(Schema.maxLength(MAX_ID_LENGTH)),
  serviceEndpoint: Schema.String.pipe(Schema.maxLength(MAX_ID_LENGTH))
})

export const PDS_SERVICE_ID_SUFFIX = "#atproto_pds"
export const PDS_SERVICE_TYPE = "AtprotoPersonalDataServer"

/**
 * The `serviceEndpoint` of the FIRST service whose id ends with `#atproto_pds` and whose type is
 * `AtprotoPersonalDataServer` (both the `#atproto_pds` and `did:…#atproto_pds` id forms), or
 * `undefined`. Entries that do not decode are skipped.
 *
 * @since 0.1.0
 */
export const pdsEndpoint = (doc: DidDocument): string | undefined => {
  const decode = Schema.decodeUnknownEither(ServiceEntry)
  for (const raw of doc.service ?? []) {
    const entry = decode(raw)
    if (Either.isLeft(entry)) continue
    if (entry.right.id.endsWith(PDS_SERVICE_ID_SUFFIX) && entry.right.type === PDS_SERVICE_TYPE) {
      return entry.right.serviceEndpoint
    }
  }
  return undefined
}

/**
 * A public key as a DID document publishes it: the verification method's `type` (`Multikey`, or
 * one of the older `EcdsaSecp256k1VerificationKey2019` / `EcdsaSecp256r1VerificationKey2019`) and
 * its base58btc multibase value. Which key types are usable is the verifier library's decision.
 */
export const SigningKey = Schema.Struct({
  type: Schema.String.pipe(Schema.minLength(1), Schema.maxLength(64)),
  publicKeyMultibase: Schema.String.pipe(Schema.pattern(/^z[1-9A-HJ-NP-Za-km-z]{1,255}$/))
})
export type SigningKey = typeof SigningKey.Type

const VerificationMethodEntry = Schema.Struct({
  id: Schema.String.pipe(Schema.maxLength(MAX_ID_LENGTH)),
  type: Schema.String.pipe(Schema.maxLength(MAX_ID_LENGTH)),
  publicKeyMultibase: Schema.optional(Schema.String.pipe(Schema.maxLength(MAX_ID_LENGTH)))
})

export const ATPROTO_KEY_ID_SUFFIX = "#atproto"

/**
 * The `#atproto` signing key (SPEC §8.2): the FIRST verification method whose id is `#atproto` or
 * `<did>#atproto` and that carries a `publicKeyMultibase` (as atproto's own resolvers pick it), if
 * it decodes as a {@link SigningKey}; `undefined` otherwise. Entries that do not decode are skipped.
 *
 * @since 0.1.0
 */
export const atprotoSigningKey = (doc: DidDocument): SigningKey | undefined => {
  const decode = Schema.decodeUnknownEither(VerificationMethodEntry)
  const full = `${doc.id}${ATPROTO_KEY_ID_SUFFIX}`
  for (const raw of doc.verificationMethod ?? []) {
    const entry = decode(raw)
    if (Either.isLeft(entry)) continue
    const { id, type, publicKeyMultibase } = entry.right
    if ((id !== ATPROTO_KEY_ID_SUFFIX && id !== full) || publicKeyMultibase === undefined) continue
    const key = Schema.decodeUnknownEither(SigningKey)({ type, publicKeyMultibase })
    return Either.isRight(key) ? key.right : undefined
  }
  return undefined
}
