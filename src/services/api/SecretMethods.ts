/**
 * wisp.place's secret methods (SPEC §8.4) over firehook's secret store (`delivery/Secrets`, the
 * same store as the operator CLI `firehook secrets …`), for the caller only:
 * - `create {name}` → `{name, token, createdAt}`: a generated `whsec_` token, shown only here;
 * - `rotate {name}` → `{name, token, rotatedAt}`: the old token stops signing (the delivery
 *   worker's token cache keeps it at most 10 s);
 * - `list` → `{secrets: [{name, createdAt, lastRotatedAt?}]}`, never tokens;
 * - `delete {name}` → `{}`.
 * At most 1,000 secrets per owner (`LimitExceeded`); a caller firehook knows no webhook record of
 * (no `webhooks` and no `rejected_records` row; every DID with a key can call, and DIDs are free to
 * mint) at most 10 (`LimitExceeded`), and all such callers together at most 100,000 (503
 * `NotEnoughResources`, as a full replay store answers; `Secrets.createAsCaller`, under the same
 * advisory locks as the per-owner bound). Without `WEBHOOK_SECRET_ENCRYPTION_KEY`,
 * create and rotate answer 503 `NotConfigured`. The times are the store's own (the database's
 * `created_at` / `rotated_at`), returned by the write itself: no second statement runs after the
 * write commits, so a call whose write took effect answers its token (a read-back that failed
 * answered 500 after a rotation had already replaced the token, and the new token was lost).
 */
import { Effect } from "effect"
import * as SecretLexicon from "../../schemas/SecretLexicon.js"
import { MAX_SECRETS_BEFORE_RECORD, MAX_SECRETS_PER_OWNER, Secrets, type SecretsError } from "../delivery/Secrets.js"
import { recurringWarning } from "./ApiLog.js"
import { method } from "./Methods.js"
import { declared, internal, invalidRequest, notConfigured, XrpcFailure } from "./XrpcError.js"

/** The XRPC error of a store failure; an unexpected one is logged (reason and code only) and is a 500. */
export const secretsFailure = (e: SecretsError): Effect.Effect<never, XrpcFailure> => {
  switch (e.reason) {
    case "already_exists":
      return Effect.fail(declared("AlreadyExists", "a secret with this name already exists"))
    case "not_found":
      return Effect.fail(declared("NotFound", "no secret with this name"))
    case "limit_reached":
      return Effect.fail(declared("LimitExceeded", `an owner may have at most ${MAX_SECRETS_PER_OWNER} secrets`))
    case "limit_before_record":
      return Effect.fail(
        declared("LimitExceeded", `at most ${MAX_SECRETS_BEFORE_RECORD} secrets before your first webhook record`)
      )
    case "before_record_full":
      return Effect.fail(
        new XrpcFailure({
          status: 503,
          error: "NotEnoughResources",
          message: "too many secrets of callers without a webhook record; publish a webhook record first"
        })
      )
    case "no_key":
      return Effect.fail(notConfigured("this service cannot store secrets (no encryption key is configured)"))
    case "invalid_name":
    case "invalid_token":
      return Effect.fail(invalidRequest("invalid secret name"))
    default:
      return recurringWarning("api: the secret store failed", { reason: e.reason, code: e.code ?? "" }).pipe(
        Effect.zipRight(Effect.fail(internal()))
      )
  }
}

export const create = method(SecretLexicon.create, ({ caller, input }) =>
  Effect.gen(function*() {
    const secrets = yield* Secrets
    const issued = yield* secrets.createAsCaller(caller, input.name)
    return { name: input.name, token: issued.token, createdAt: issued.createdAt.toISOString() }
  }).pipe(Effect.catchTag("SecretsError", secretsFailure)))

export const rotate = method(SecretLexicon.rotate, ({ caller, input }) =>
  Effect.gen(function*() {
    const secrets = yield* Secrets
    const issued = yield* secrets.rotate(caller, input.name)
    return { name: input.name, token: issued.token, rotatedAt: issued.rotatedAt.toISOString() }
  }).pipe(Effect.catchTag("SecretsError", secretsFailure)))

export const list = method(SecretLexicon.list, ({ caller }) =>
  Effect.gen(function*() {
    const secrets = yield* Secrets
    const rows = yield* secrets.list(caller)
    return {
      secrets: rows.map((r) => ({
        name: r.name,
        createdAt: r.createdAt.toISOString(),
        ...(r.rotatedAt === undefined ? {} : { lastRotatedAt: r.rotatedAt.toISOString() })
      }))
    }
  }).pipe(Effect.catchTag("SecretsError", secretsFailure)))

export const remove = method(SecretLexicon.remove, ({ caller, input }) =>
  Effect.gen(function*() {
    const secrets = yield* Secrets
    const removed = yield* secrets.remove(caller, input.name)
    if (!removed) return yield* Effect.fail(declared("NotFound", "no secret with this name"))
    return {}
  }).pipe(Effect.catchTag("SecretsError", secretsFailure)))

/** The secret methods, as the API serves them. */
export const SECRET_METHODS = [create, rotate, list, remove] as const
