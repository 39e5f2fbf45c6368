/**
 * The contract of one XRPC method firehook serves (SPEC §8.3): its NSID, its kind, and the Effect
 * Schemas of its query parameters, its input body and its output, which follow the lexicon file of
 * the same NSID in `lexicons/` (a test checks that every value these Schemas accept is valid
 * under the lexicon). The owners' API (`services/api`) decodes requests and encodes responses
 * with them; handlers are attached there.
 *
 * Parameters arrive as a query string: each one a string, or an array of strings when repeated.
 * The shared field Schemas below carry `arbitrary` annotations, so property tests can generate
 * valid values of every contract.
 *
 * @since 0.1.0
 */
import { Schema } from "effect"
import { isRkey } from "./AtUri.js"
import { isRfc3339DateTime } from "./WhRecord.js"

/** The kinds of XRPC methods (the lexicon `main` def types). */
export const XRPC_KINDS = ["query", "procedure", "subscription"] as const
export type XrpcKind = (typeof XRPC_KINDS)[number]

/** Query parameters as received: a string per name, an array when the name is repeated. */
export type RawParams = { readonly [name: string]: string | ReadonlyArray<string> }

/** What a params Schema's encoded side may be: raw query parameters, some of them absent. */
export type ParamsEncoded = { readonly [name: string]: string | ReadonlyArray<string> | undefined }

/**
 * One method. `params` decodes the query string; `input` the JSON body of a procedure (undefined
 * for queries and subscriptions); `output` the JSON response (a subscription's message frames).
 * `errors` are the names the lexicon declares beyond the generic ones.
 */
export interface XrpcContract<P, I, O> {
  readonly nsid: string
  readonly kind: XrpcKind
  readonly params: Schema.Schema<P, unknown>
  readonly input: Schema.Schema<I, unknown> | undefined
  readonly output: Schema.Schema<O, unknown>
  readonly errors: ReadonlyArray<string>
}

/** A contract whose types are not known statically (the method table, generic tests). */
export interface AnyContract {
  readonly nsid: string
  readonly kind: XrpcKind
  readonly params: Schema.Schema.AnyNoContext
  readonly input: Schema.Schema.AnyNoContext | undefined
  readonly output: Schema.Schema.AnyNoContext
  readonly errors: ReadonlyArray<string>
}

/** `schema` decoding from any value (its encoded side typed `unknown`, as a request's data is). */
const fromUnknown = <A, I>(schema: Schema.Schema<A, I>): Schema.Schema<A, unknown> =>
  Schema.compose(Schema.Unknown, schema, { strict: false })

/** Builds a contract, checking its Schemas' shapes (encoded params are raw query parameters). */
export const contract = <P, PI extends ParamsEncoded, I, II, O, OI>(c: {
  readonly nsid: string
  readonly kind: XrpcKind
  readonly params: Schema.Schema<P, PI>
  readonly input?: Schema.Schema<I, II>
  readonly output: Schema.Schema<O, OI>
  readonly errors?: ReadonlyArray<string>
}): XrpcContract<P, I, O> => ({
  nsid: c.nsid,
  kind: c.kind,
  params: fromUnknown(c.params),
  input: c.input === undefined ? undefined : fromUnknown(c.input),
  output: fromUnknown(c.output),
  errors: c.errors ?? []
})

// ---------------------------------------------------------------------------------------------
// Shared fields

/** No query parameters (any given are ignored, as atproto servers do). */
export const NoParams = Schema.Struct({})

const DATETIME =
  /^\d{4}-(0[1-9]|1[0-2])-([0-2]\d|3[01])T([01]\d|2[0-3]):[0-5]\d:([0-5]\d|60)(\.\d+)?(Z|[+-]([01]\d|2[0-3]):[0-5]\d)$/

/**
 * An atproto lexicon `datetime`: RFC 3339 with an upper-case `T`, `Z` or `±hh:mm` (never `-00:00`),
 * at most 64 characters, a real calendar date in years 0000–9999.
 */
export const isDatetime = (s: string): boolean => {
  if (s.length > 64 || s.endsWith("-00:00") || !DATETIME.test(s) || !isRfc3339DateTime(s)) return false
  const ms = Date.parse(s)
  if (Number.isNaN(ms)) return false
  const year = new Date(ms).getUTCFullYear()
  return year >= 0 && year <= 9999
}

/** A lexicon `datetime` string (firehook writes `Date#toISOString()`). */
export const Datetime = Schema.String.pipe(
  Schema.filter(isDatetime, { message: () => "must be an RFC 3339 datetime" }),
  Schema.annotations({
    identifier: "Datetime",
    arbitrary: () => (fc) =>
      fc.date({ min: new Date("1970-01-01T00:00:00Z"), max: new Date("2999-12-31T23:59:59Z"), noInvalidDate: true })
        .map((d) => d.toISOString())
  })
)

/**
 * A stored secret's name as the outputs give it: SPEC §1.3's pattern alone (the lexicons' outputs
 * are plain strings). `.` and `..` match it, and the operator CLI or an embedding program may
 * create them in the same store: list must show them (before, it failed with a 500).
 */
export const StoredSecretName = Schema.String.pipe(
  Schema.pattern(/^[A-Za-z0-9._-]{1,64}$/),
  Schema.annotations({
    identifier: "StoredSecretName",
    arbitrary: () => (fc) => fc.stringMatching(/^[A-Za-z0-9._-]{1,64}$/)
  })
)

/** SPEC §1.3 / §8.4: a secret name as input, also a lexicon `record-key` (so never `.` or `..`). */
export const SecretName = Schema.String.pipe(
  Schema.pattern(/^[A-Za-z0-9._-]{1,64}$/),
  Schema.filter((s) => s !== "." && s !== "..", { message: () => "must not be . or .." }),
  Schema.annotations({
    identifier: "SecretName",
    arbitrary: () => (fc) => fc.stringMatching(/^[A-Za-z0-9_-][A-Za-z0-9._-]{0,63}$/)
  })
)

/**
 * A record key (`place.wisp.v2.wh` rkeys, event rkeys): SPEC §1.1's grammar, the one intake accepts
 * (`AtUri.isRkey`: `[A-Za-z0-9._~:%@+-]{1,512}`, not `.` or `..`), so that every key firehook can
 * store is a valid output and every webhook it can register a valid argument. atproto's
 * `record-key` format is the narrower `[A-Za-z0-9._~:-]` (no `%@+`), so firehook's lexicons
 * declare these fields as bounded strings (1–512) with the grammar in their description, and the
 * arbitrary generates the wider grammar.
 */
export const RecordKey = Schema.String.pipe(
  Schema.filter(isRkey, { message: () => "must be a record key: [A-Za-z0-9._~:%@+-]{1,512}, not . or .." }),
  Schema.annotations({
    identifier: "RecordKey",
    arbitrary: () => (fc) => fc.stringMatching(/^[A-Za-z0-9_~:%@+-][A-Za-z0-9._~:%@+-]{0,31}$/)
  })
)

/** An integer query parameter in `min..max` (decimal digits only). */
export const IntParam = (min: number, max: number) =>
  Schema.String.pipe(
    Schema.pattern(/^(0|[1-9]\d{0,8})$/),
    Schema.compose(Schema.NumberFromString),
    Schema.int(),
    Schema.between(min, max)
  )

/** A boolean query parameter: `true` / `false`. */
export const BooleanParam = Schema.transform(Schema.Literal("true", "false"), Schema.Boolean, {
  strict: true,
  decode: (s) => s === "true",
  encode: (b) => (b ? "true" : "false")
})

/** A bounded string with a printable-ASCII arbitrary (identifiers, cursors, kinds). */
export const Token = (maxLength: number) =>
  Schema.String.pipe(
    Schema.pattern(/^[\x21-\x7e]+$/),
    Schema.maxLength(maxLength),
    Schema.annotations({
      arbitrary: () => (fc) => fc.stringMatching(new RegExp(`^[A-Za-z0-9_.:-]{1,${Math.min(maxLength, 64)}}$`))
    })
  )

/** A non-negative integer. */
export const Count = Schema.Int.pipe(Schema.between(0, Number.MAX_SAFE_INTEGER))

/** An HTTP status code. */
export const HttpStatus = Schema.Int.pipe(Schema.between(100, 599))

/**
 * A receiver's stored status as the outward views show it ({@link HttpStatus}): the status, or
 * undefined when it is not an integer in 100–599. A receiver may answer any three digits (999);
 * firehook classifies such a status `http_5xx` and stores it as it came, and its views say the kind alone.
 */
export const reportableStatus = (status: number | null | undefined): number | undefined =>
  typeof status === "number" && Number.isInteger(status) && status >= 100 && status <= 599 ? status : undefined
