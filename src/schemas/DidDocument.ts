/**
 * DID documents (SPEC §5.1), as far as firehook reads them: the document's `id` and its `service`
 * entries, to find the account's PDS.
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

/** The envelope: `id` and an optional, bounded `service` array (entries decoded one by one). */
export const DidDocument = Schema.Struct({
  id: Schema.String.pipe(Schema.maxLength(MAX_ID_LENGTH)),
  service: Schema.optional(Schema.Array(Schema.Unknown).pipe(Schema.maxItems(MAX_SERVICES)))
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
