/**
 * The XRPC responses backfill reads from a PDS and a relay (SPEC §5.2–5.3), as Schemas. Bounds that
 * are part of the protocol rules (records per page, cursor length, cid length) are checked by the
 * caller so that each violation has its own failure kind; the Schemas bound only what could make
 * decoding itself expensive.
 *
 * @since 0.1.0
 */
import { Schema } from "effect"

/** Upper bound on any string firehook reads from these responses before the caller's checks. */
const MAX_STRING = 64 * 1024

/** Decoding bound on a listRecords page (the rule is ≤ 100; the caller reports the violation). */
const MAX_DECODED_RECORDS = 10_000

/** `com.atproto.repo.listRecords` output: `{ records: [{ uri, cid, value }], cursor? }`. */
export const ListRecordsPage = Schema.Struct({
  records: Schema.Array(
    Schema.Struct({
      uri: Schema.String.pipe(Schema.maxLength(MAX_STRING)),
      cid: Schema.String.pipe(Schema.maxLength(MAX_STRING)),
      value: Schema.Unknown
    })
  ).pipe(Schema.maxItems(MAX_DECODED_RECORDS)),
  cursor: Schema.optional(Schema.String.pipe(Schema.maxLength(MAX_STRING)))
})
export type ListRecordsPage = typeof ListRecordsPage.Type

/** `com.atproto.sync.getLatestCommit` output: `{ cid, rev }`. */
export const LatestCommit = Schema.Struct({
  cid: Schema.String.pipe(Schema.maxLength(MAX_STRING)),
  rev: Schema.String.pipe(Schema.maxLength(64))
})

/** `com.atproto.sync.listReposByCollection` output: `{ repos: [{ did }], cursor? }`. */
export const ReposByCollectionPage = Schema.Struct({
  repos: Schema.Array(Schema.Struct({ did: Schema.String.pipe(Schema.maxLength(MAX_STRING)) })).pipe(
    Schema.maxItems(MAX_DECODED_RECORDS)
  ),
  cursor: Schema.optional(Schema.String.pipe(Schema.maxLength(MAX_STRING)))
})
export type ReposByCollectionPage = typeof ReposByCollectionPage.Type

/** A surrogate that is not half of a pair (the regex reads UTF-16 code units). */
const LONE_SURROGATE = /[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/

/**
 * Whether a string is well-formed UTF-16 (no lone surrogate), so that it can be put in a URL: a
 * JSON string may hold a lone surrogate (`"\ud800"`), on which `encodeURIComponent` throws.
 *
 * @since 0.1.0
 */
export const isWellFormedText = (s: string): boolean => !LONE_SURROGATE.test(s)

/** An XRPC error body: `{ error, message? }`. */
export const XrpcError = Schema.Struct({
  error: Schema.String.pipe(Schema.maxLength(MAX_STRING)),
  message: Schema.optional(Schema.String.pipe(Schema.maxLength(MAX_STRING)))
})

/**
 * Parses a JSON body (UTF-8 bytes) and decodes it with `schema`; `undefined` when the bytes are not
 * UTF-8 JSON or do not match. Never throws.
 *
 * @since 0.1.0
 */
export const decodeJsonBody = <A, I>(schema: Schema.Schema<A, I>, body: Uint8Array): A | undefined => {
  let parsed: unknown
  try {
    parsed = JSON.parse(new TextDecoder("utf-8", { fatal: true }).decode(body))
  } catch {
    return undefined
  }
  const decoded = Schema.decodeUnknownEither(schema)(parsed)
  return decoded._tag === "Right" ? decoded.right : undefined
}
