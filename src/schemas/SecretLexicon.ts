/**
 * wisp.place's server-managed secret methods (SPEC §8.4), as firehook serves them:
 * `place.wisp.v2.secret.create|rotate|list|delete`. The Schemas follow
 * `lexicons/place/wisp/v2/secret/*.json`. Input names are `^[A-Za-z0-9._-]{1,64}$` (SPEC §1.3) and
 * the lexicons' `record-key` format (so never `.` or `..`); output names the pattern alone, as the
 * store holds them (the lexicons' outputs are plain strings).
 *
 * @since 0.1.0
 */
import { Schema } from "effect"
import { contract, Datetime, NoParams, SecretName, StoredSecretName } from "./XrpcContract.js"

export const NameInput = Schema.Struct({ name: SecretName })

/** The token is generated (`whsec_` + base64 of 32 bytes) and shown only in these two outputs. */
const Token = Schema.String.pipe(Schema.minLength(1), Schema.maxLength(512))

export const CreateOutput = Schema.Struct({ name: StoredSecretName, token: Token, createdAt: Datetime })
export const RotateOutput = Schema.Struct({ name: StoredSecretName, token: Token, rotatedAt: Datetime })

export const SecretMeta = Schema.Struct({
  name: StoredSecretName,
  createdAt: Datetime,
  lastRotatedAt: Schema.optional(Datetime)
})
export type SecretMeta = typeof SecretMeta.Type

/** At most 1,000 secrets per owner (SPEC §8.4), so the list is one bounded array. */
export const ListOutput = Schema.Struct({ secrets: Schema.Array(SecretMeta).pipe(Schema.maxItems(1000)) })

export const EmptyOutput = Schema.Struct({})

export const create = contract({
  nsid: "place.wisp.v2.secret.create",
  kind: "procedure",
  params: NoParams,
  input: NameInput,
  output: CreateOutput,
  errors: ["AlreadyExists", "LimitExceeded", "NotConfigured"]
})

export const rotate = contract({
  nsid: "place.wisp.v2.secret.rotate",
  kind: "procedure",
  params: NoParams,
  input: NameInput,
  output: RotateOutput,
  errors: ["NotFound", "NotConfigured"]
})

export const list = contract({
  nsid: "place.wisp.v2.secret.list",
  kind: "query",
  params: NoParams,
  output: ListOutput
})

export const remove = contract({
  nsid: "place.wisp.v2.secret.delete",
  kind: "procedure",
  params: NoParams,
  input: NameInput,
  output: EmptyOutput,
  errors: ["NotFound"]
})

/** The four secret methods. */
export const SECRET_CONTRACTS = [create, rotate, list, remove] as const
