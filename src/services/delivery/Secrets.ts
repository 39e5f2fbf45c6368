/**
 * Server-managed signing secrets (SPEC §1.3): `(owner DID, name) → AES-256-GCM envelope`.
 *
 * - `create` / `rotate` seal a token under the keyring's current key and store only the envelope;
 *   the token is returned once and never stored, logged or put in an error. Without a token a fresh
 *   one is generated (`whsec_` + base64 of 32 random bytes); a caller token must be 32–256 printable
 *   ASCII characters without whitespace. The stored times come back from the write itself
 *   (`RETURNING`): no second statement can fail after the write committed and so lose the token.
 * - `resolve` is what the delivery worker calls. Every failure (bad owner or name, missing row,
 *   unknown key id, tampered envelope, database error) is the one generic `SecretUnavailable`.
 * - The keyring is the configured current key (`WEBHOOK_SECRET_ENCRYPTION_KEY`) plus the decrypt-only
 *   previous keys (`WEBHOOK_SECRET_ENCRYPTION_PREVIOUS_KEYS`). Without a current key nothing can be
 *   sealed (`no_key`), but envelopes sealed under a previous key still open.
 * - `reseal` re-seals every envelope not under the current key (same token, `rotated_at` untouched),
 *   so a previous key can be retired (`SecretsReseal`); a pass is bounded and resumable (`from`,
 *   `next`), and `resealPasses` chains passes until one completes.
 *
 * Cache (decision): successful resolutions are kept in memory for at most 10 s (bounded to 1,024
 * entries, least recently used evicted first), counted from when the store read STARTED (its
 * snapshot), not from when it returned: a slow read that saw the envelope from before a rotation
 * keeps it only for what is left of the 10 s, and a read that took the whole TTL is not cached.
 * Failures are never cached, so a secret created a moment ago resolves at once. `create`/`rotate`/`remove` invalidate the entry of the instance that
 * made them at once; any other instance (the delivery worker's, whose layer is not the owners'
 * API's even in one process; a delivery child; the CLI) sees the change within the TTL. The TTL is short on
 * purpose: after a rotation the receiver must verify with the new token, and a long cache would
 * keep signing with the old one.
 *
 * Bound (decision): at most 1,000 secrets per owner (`limit_reached`), so `list` is bounded; through the
 * owners' API (`createAsCaller`), an owner firehook knows no webhook record of (no `webhooks` or `rejected_records`
 * row) at most 10, and all such owners together at most 100,000: DIDs are free to mint (SPEC §7).
 */
import * as SqlClient from "@effect/sql/SqlClient"
import { Clock, Context, Data, Duration, Effect, Either, Layer, Option, Redacted, Ref } from "effect"
import { randomBytes } from "node:crypto"
import { isCanonicalDid } from "../../schemas/AtUri.js"
import { FirehookConfig, type FirehookConfigShape } from "../platform/Config.js"
import { codeOr } from "../platform/ErrorCode.js"
import { SECRETS_OWNER } from "../platform/LockKeys.js"
import * as SecretBox from "./SecretBox.js"
import { SecretUnavailable } from "./SecretBox.js"
import * as Reseal from "./SecretsReseal.js"
import type { EnvelopeSwap, ResealResult, SealedRow, SecretKey } from "./SecretsReseal.js"

export { SecretUnavailable }
export { MAX_RESEAL_PAGES, MAX_RESEAL_PASSES, RESEAL_PAGE_SIZE, RESEAL_START, resealPasses } from "./SecretsReseal.js"
export type { ResealResult, ResealRun, SecretKey } from "./SecretsReseal.js"

/** `secretId` / secret names (SPEC §1). */
export const SECRET_NAME = /^[A-Za-z0-9._-]{1,64}$/

/** Hard bound on secrets per owner. */
export const MAX_SECRETS_PER_OWNER = 1_000
/** Secrets an API caller may hold before firehook knows a webhook record of it (`createAsCaller`). */
export const MAX_SECRETS_BEFORE_RECORD = 10
/** Secrets all such callers together may hold (default of `SecretsOptions.beforeRecordTotal`). */
export const MAX_SECRETS_BEFORE_RECORD_TOTAL = 100_000

const MESSAGES = {
  invalid_owner: "the owner must be a canonical DID (did:plc or did:web)",
  invalid_name: "the secret name must match ^[A-Za-z0-9._-]{1,64}$",
  invalid_token: "a caller-supplied token must be 32-256 printable ASCII characters without whitespace",
  already_exists: "a secret with this name already exists for this owner",
  not_found: "no secret with this name exists for this owner",
  limit_reached: `an owner may have at most ${MAX_SECRETS_PER_OWNER} secrets`,
  limit_before_record: `at most ${MAX_SECRETS_BEFORE_RECORD} secrets before your first webhook record`,
  before_record_full: "the secrets of callers without a webhook record are at their overall bound",
  no_key: "WEBHOOK_SECRET_ENCRYPTION_KEY is not set: a current encryption key is needed to create or rotate secrets",
  invalid_key:
    "the secret encryption keyring is invalid (WEBHOOK_SECRET_ENCRYPTION_KEY / WEBHOOK_SECRET_ENCRYPTION_PREVIOUS_KEYS)",
  store: "the secrets table could not be read or written"
}
export type SecretsErrorReason = keyof typeof MESSAGES

/** A failed secrets operation. Carries a reason (and a SQLSTATE for `store`), never a value. */
export class SecretsError extends Data.TaggedError("SecretsError")<{
  readonly reason: SecretsErrorReason
  readonly code?: string
}> {
  override get message(): string {
    return this.code === undefined
      ? `secrets: ${MESSAGES[this.reason]}`
      : `secrets: ${MESSAGES[this.reason]} (${this.code})`
  }
}

/** The times a write stored, as the write itself returned them. */
export interface StoredTimes {
  readonly createdAt: Date
  readonly rotatedAt: Date | undefined
}

export interface SecretInfo extends StoredTimes {
  readonly name: string
}

/** A token just issued by `create` / `rotate` (shown once), with the times its write stored. */
export interface IssuedSecret extends StoredTimes {
  readonly token: string
}

export interface SecretsShape {
  /** The clear token for signing; every failure is the one generic `SecretUnavailable`. */
  readonly resolve: (ownerDid: string, name: string) => Effect.Effect<string, SecretUnavailable>
  /** Store a new secret; returns the token (shown once). Fails `already_exists` if it exists. */
  readonly create: (ownerDid: string, name: string, token?: string) => Effect.Effect<IssuedSecret, SecretsError>
  /** `create` by the owner itself (the owners' API): the before-record bounds apply too (module doc). */
  readonly createAsCaller: (ownerDid: string, name: string) => Effect.Effect<IssuedSecret, SecretsError>
  /** Replace an existing secret's token; returns the new token. Fails `not_found` if missing. */
  readonly rotate: (
    ownerDid: string,
    name: string,
    token?: string
  ) => Effect.Effect<IssuedSecret & { readonly rotatedAt: Date }, SecretsError>
  /** Delete a secret; whether it existed. */
  readonly remove: (ownerDid: string, name: string) => Effect.Effect<boolean, SecretsError>
  /** The owner's secrets by name (names and times only). */
  readonly list: (ownerDid: string) => Effect.Effect<ReadonlyArray<SecretInfo>, SecretsError>
  /**
   * One pass re-sealing the owners' envelopes that are not under the current key, after `from`
   * (default: from the start); a pass that stops at its bound says where (`next`), so the next can
   * go on from there (`resealPasses`). Fails `no_key` without a current key.
   */
  readonly reseal: (from?: SecretKey) => Effect.Effect<ResealResult, SecretsError>
}

export interface SecretsOptions {
  /** how long a resolved token may be reused; 0 disables the cache — default 10 s (max 60 s) */
  readonly cacheTtl?: Duration.DurationInput
  /** cached entries at most — default 1,024 */
  readonly cacheCapacity?: number
  /** `createAsCaller`'s overall bound — default {@link MAX_SECRETS_BEFORE_RECORD_TOTAL} */
  readonly beforeRecordTotal?: number
}

export const DEFAULT_CACHE_TTL = Duration.seconds(10)
export const MAX_CACHE_TTL = Duration.seconds(60)
export const DEFAULT_CACHE_CAPACITY = 1_024

// ---------------------------------------------------------------------------------------------
// Storage (envelopes only; never a clear token)

export interface StoredSecret extends StoredTimes {
  readonly envelope: string
}

/** Raw persistence; errors are SQLSTATE-like codes. */
export interface SecretsStoreShape {
  readonly get: (ownerDid: string, name: string) => Effect.Effect<string | undefined, SecretsError>
  /**
   * the stored `created_at` (from the INSERT itself), or why nothing was inserted; `beforeRecordTotal`
   * (`createAsCaller`): the before-record bounds too (SQL store only: the memory store knows no records)
   */
  readonly insert: (
    ownerDid: string,
    name: string,
    envelope: string,
    beforeRecordTotal?: number
  ) => Effect.Effect<{ readonly createdAt: Date } | InsertRefusal, SecretsError>
  /** the stored times (from the UPDATE itself), or undefined when no row was updated */
  readonly update: (
    ownerDid: string,
    name: string,
    envelope: string
  ) => Effect.Effect<{ readonly createdAt: Date; readonly rotatedAt: Date } | undefined, SecretsError>
  readonly delete: (ownerDid: string, name: string) => Effect.Effect<boolean, SecretsError>
  readonly list: (ownerDid: string) => Effect.Effect<ReadonlyArray<SecretInfo>, SecretsError>
  /**
   * At most `limit` rows after `after` in (owner, name) order whose envelope's key id is not
   * `keyId` (envelope format: `wse1.<keyId>.…`).
   */
  readonly sealedElsewhere: (
    keyId: string,
    after: SecretKey,
    limit: number
  ) => Effect.Effect<ReadonlyArray<SealedRow>, SecretsError>
  /**
   * Replaces each row's envelope `from` by `to`, only where the row still holds `from` (so a
   * concurrent rotate or delete wins); `rotated_at` untouched. How many rows were replaced.
   */
  readonly swap: (rows: ReadonlyArray<EnvelopeSwap>) => Effect.Effect<number, SecretsError>
}

const storeError = (e: unknown) => new SecretsError({ reason: "store", code: codeOr(e) })

/** Every secrets statement is bounded (SPEC §7); a read runs inside a delivery attempt's slot. */
const STORE_TIMEOUT = "15 seconds"
const timedOut = () => new SecretsError({ reason: "store", code: "timeout" })
/** a statement's errors as `store` errors, and its time bounded */
const stored = <A, E, R>(eff: Effect.Effect<A, E, R>): Effect.Effect<A, SecretsError, R> =>
  Effect.timeoutFail(Effect.mapError(eff, storeError), { duration: STORE_TIMEOUT, onTimeout: timedOut })

/** Why `insert` stored nothing. */
export type InsertRefusal = "exists" | "limit" | "limit_before_record" | "before_record_full"

export const makeSqlStore = Effect.gen(function*() {
  const sql = yield* SqlClient.SqlClient
  const store: SecretsStoreShape = {
    get: (ownerDid, name) =>
      sql<{ envelope: string }>`SELECT envelope FROM secrets WHERE owner_did = ${ownerDid} AND name = ${name}`.pipe(
        Effect.map((rows) => rows[0]?.envelope),
        stored
      ),
    insert: (ownerDid, name, envelope, beforeRecordTotal) =>
      Effect.gen(function*() {
        // One owner's creates one at a time, until commit (another owner whose DID hashes alike
        // waits too, harmlessly): the INSERT's snapshot, taken after the lock (READ COMMITTED, the
        // default), counts every create committed before it, so concurrent creates cannot pass the
        // bound together. The INSERT checks the bound and uniqueness in one statement. `known`:
        // firehook knows a webhook record of the owner (a valid one, or one it refused).
        const [owner] = yield* sql<{ known: boolean }>`
          SELECT pg_advisory_xact_lock(${SECRETS_OWNER}::int, hashtext(${ownerDid})), (
            EXISTS (SELECT 1 FROM webhooks WHERE owner_did = ${ownerDid})
            OR EXISTS (SELECT 1 FROM rejected_records WHERE owner_did = ${ownerDid})) AS known`
        const refused = (why: InsertRefusal) =>
          Effect.map(
            sql`SELECT 1 AS n FROM secrets WHERE owner_did = ${ownerDid} AND name = ${name}`,
            (rows) => (rows.length > 0 ? ("exists" as const) : why)
          )
        let bound = MAX_SECRETS_PER_OWNER
        if (beforeRecordTotal !== undefined && owner?.known !== true) {
          // and all creates of owners without a record, one at a time (after the owner's lock: no deadlock)
          yield* sql`SELECT pg_advisory_xact_lock(${SECRETS_OWNER}::int, -1)`
          const held = yield* sql<{ n: number }>`SELECT count(*)::int AS n FROM (
            SELECT 1 FROM secrets s WHERE NOT EXISTS (SELECT 1 FROM webhooks w WHERE w.owner_did = s.owner_did)
              AND NOT EXISTS (SELECT 1 FROM rejected_records r WHERE r.owner_did = s.owner_did)
            LIMIT ${beforeRecordTotal}) pending`
          if ((held[0]?.n ?? 0) >= beforeRecordTotal) return yield* refused("before_record_full")
          bound = MAX_SECRETS_BEFORE_RECORD
        }
        const inserted = yield* sql<{ created_at: Date }>`
          INSERT INTO secrets (owner_did, name, envelope)
          SELECT ${ownerDid}, ${name}, ${envelope}
          WHERE (SELECT count(*) FROM secrets WHERE owner_did = ${ownerDid}) < ${bound}
          ON CONFLICT (owner_did, name) DO NOTHING
          RETURNING created_at`
        const row = inserted[0]
        if (row !== undefined) return { createdAt: new Date(row.created_at) }
        return yield* refused(bound === MAX_SECRETS_PER_OWNER ? "limit" : "limit_before_record")
      }).pipe(sql.withTransaction, stored),
    update: (ownerDid, name, envelope) =>
      sql<{ created_at: Date; rotated_at: Date }>`
        UPDATE secrets SET envelope = ${envelope}, rotated_at = now()
        WHERE owner_did = ${ownerDid} AND name = ${name}
        RETURNING created_at, rotated_at`.pipe(
        Effect.map(([row]) =>
          row === undefined ? undefined : { createdAt: new Date(row.created_at), rotatedAt: new Date(row.rotated_at) }
        ),
        stored
      ),
    delete: (ownerDid, name) =>
      sql<{ name: string }>`DELETE FROM secrets WHERE owner_did = ${ownerDid} AND name = ${name} RETURNING name`.pipe(
        Effect.map((rows) => rows.length > 0),
        stored
      ),
    list: (ownerDid) =>
      sql<{ name: string; created_at: Date; rotated_at: Date | null }>`
        SELECT name, created_at, rotated_at FROM secrets WHERE owner_did = ${ownerDid}
        ORDER BY name LIMIT ${MAX_SECRETS_PER_OWNER}`.pipe(
        Effect.map((rows) =>
          rows.map((r) => ({
            name: r.name,
            createdAt: new Date(r.created_at),
            rotatedAt: r.rotated_at === null ? undefined : new Date(r.rotated_at)
          }))
        ),
        stored
      ),
    sealedElsewhere: (keyId, after, limit) =>
      sql<{ owner_did: string; name: string; envelope: string }>`
        SELECT owner_did, name, envelope FROM secrets
        WHERE (owner_did, name) > (${after.ownerDid}, ${after.name}) AND split_part(envelope, '.', 2) <> ${keyId}
        ORDER BY owner_did, name LIMIT ${limit}`.pipe(
        Effect.map((rows) => rows.map((r) => ({ ownerDid: r.owner_did, name: r.name, envelope: r.envelope }))),
        stored
      ),
    swap: (rows) =>
      rows.length === 0 ? Effect.succeed(0) : sql<{ name: string }>`
        UPDATE secrets s SET envelope = v.next
        FROM unnest(${rows.map((r) => r.ownerDid)}::text[], ${rows.map((r) => r.name)}::text[],
          ${rows.map((r) => r.from)}::text[], ${rows.map((r) => r.to)}::text[]) AS v(owner_did, name, prev, next)
        WHERE s.owner_did = v.owner_did AND s.name = v.name AND s.envelope = v.prev
        RETURNING s.name`.pipe(
        Effect.map((updated) => updated.length),
        stored
      )
  }
  return store
})

/** An in-memory store (tests and embedding); times come from the Effect `Clock`. */
export const makeMemoryStore = Effect.gen(function*() {
  type Rows = ReadonlyMap<string, StoredSecret & { readonly ownerDid: string; readonly name: string }>
  const rows = yield* Ref.make<Rows>(new Map())
  const now = Effect.map(Clock.currentTimeMillis, (ms) => new Date(ms))
  const store: SecretsStoreShape = {
    get: (ownerDid, name) => Ref.get(rows).pipe(Effect.map((m) => m.get(cacheKey(ownerDid, name))?.envelope)),
    insert: (ownerDid, name, envelope) =>
      Effect.flatMap(
        now,
        (createdAt) =>
          Ref.modify(rows, (m): readonly [{ readonly createdAt: Date } | InsertRefusal, Rows] => {
            const key = cacheKey(ownerDid, name)
            if (m.has(key)) return ["exists", m]
            let owned = 0
            for (const r of m.values()) if (r.ownerDid === ownerDid) owned++
            if (owned >= MAX_SECRETS_PER_OWNER) return ["limit", m]
            return [{ createdAt }, new Map(m).set(key, { ownerDid, name, envelope, createdAt, rotatedAt: undefined })]
          })
      ),
    update: (ownerDid, name, envelope) =>
      Effect.flatMap(now, (rotatedAt) =>
        Ref.modify(rows, (m) => {
          const key = cacheKey(ownerDid, name)
          const old = m.get(key)
          if (old === undefined) return [undefined, m]
          return [{ createdAt: old.createdAt, rotatedAt }, new Map(m).set(key, { ...old, envelope, rotatedAt })]
        })),
    delete: (ownerDid, name) =>
      Ref.modify(rows, (m) => {
        const next = new Map(m)
        return [next.delete(cacheKey(ownerDid, name)), next]
      }),
    list: (ownerDid) =>
      Ref.get(rows).pipe(
        Effect.map((m) =>
          [...m.values()]
            .filter((r) => r.ownerDid === ownerDid)
            .sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0))
            .map((r) => ({ name: r.name, createdAt: r.createdAt, rotatedAt: r.rotatedAt }))
        )
      ),
    sealedElsewhere: (keyId, after, limit) =>
      Effect.map(Ref.get(rows), (m) => Reseal.pageOf([...m.values()], keyId, after, limit)),
    swap: (swaps) =>
      Ref.modify(rows, (m) => {
        const next = new Map(m)
        const n = Reseal.applySwaps(swaps, (s) => {
          const key = cacheKey(s.ownerDid, s.name)
          const old = next.get(key)
          if (old === undefined || old.envelope !== s.from) return false
          next.set(key, { ...old, envelope: s.to })
          return true
        })
        return [n, next]
      })
  }
  return store
})

// ---------------------------------------------------------------------------------------------
// Keyring

/** The keyring of the configuration: current key (may be absent) + previous keys. */
export const keyringFromConfig = (
  config: Pick<FirehookConfigShape, "secrets">
): Either.Either<SecretBox.Keyring, SecretsError> => {
  const { encryptionKey: key, previousKeys: keys } = config.secrets
  return Either.gen(function*() {
    const current = Option.isSome(key) ? yield* SecretBox.parseKey(Redacted.value(key.value)) : undefined
    const previous = Option.isSome(keys) ? yield* SecretBox.parseKeyList(Redacted.value(keys.value)) : []
    return yield* SecretBox.makeKeyring(current, previous)
  }).pipe(Either.mapLeft(() => new SecretsError({ reason: "invalid_key" })))
}

// ---------------------------------------------------------------------------------------------
// Cache

/**
 * The resolved tokens of one service: least recently used evicted first, each kept for the TTL.
 * Only touched inside Effect.sync blocks (one JS thread), so no lock is needed.
 */
interface TokenCache {
  /** false when the TTL or the capacity is 0 */
  readonly on: boolean
  /** bumped by every local write, so a resolve that raced with it never caches the old token */
  readonly generation: () => number
  readonly get: (key: string, now: number) => string | undefined
  /**
   * keep `token` until `readAt` + TTL (`readAt`: when the store read that found it started), unless
   * that is already `now` or past, or a local write happened since the resolve saw `generation`
   */
  readonly put: (key: string, token: string, readAt: number, now: number, generation: number) => void
  readonly invalidate: (key: string) => Effect.Effect<void>
}

const makeTokenCache = (options: SecretsOptions): TokenCache => {
  const ttlMs = Math.min(
    Duration.toMillis(Duration.decode(options.cacheTtl ?? DEFAULT_CACHE_TTL)),
    Duration.toMillis(MAX_CACHE_TTL)
  )
  const capacity = Math.max(0, Math.floor(options.cacheCapacity ?? DEFAULT_CACHE_CAPACITY))
  const cacheOn = ttlMs > 0 && capacity > 0
  const cache = new Map<string, { readonly token: string; readonly expiresAt: number }>()
  let generation = 0
  return {
    on: cacheOn,
    generation: () => generation,
    get: (key, now) => {
      const hit = cache.get(key)
      if (hit === undefined) return undefined
      cache.delete(key)
      if (hit.expiresAt <= now) return undefined
      cache.set(key, hit) // most recently used last
      return hit.token
    },
    put: (key, token, readAt, now, seen) => {
      const expiresAt = readAt + ttlMs
      if (!cacheOn || seen !== generation || expiresAt <= now) return
      cache.delete(key)
      while (cache.size >= capacity) {
        const oldest = cache.keys().next()
        if (oldest.done === true) break
        cache.delete(oldest.value)
      }
      cache.set(key, { token, expiresAt })
    },
    invalidate: (key) =>
      Effect.sync(() => {
        generation++
        cache.delete(key)
      })
  }
}

/** A new envelope for `token` (or a fresh token) under the keyring's current key. */
const sealNew = (
  keyring: SecretBox.Keyring,
  token: string | undefined
): Effect.Effect<{ token: string; envelope: string }, SecretsError> => {
  if (token !== undefined && !SecretBox.validateCallerToken(token)) {
    return Effect.fail(new SecretsError({ reason: "invalid_token" }))
  }
  if (keyring.current === undefined) return Effect.fail(new SecretsError({ reason: "no_key" }))
  return Effect.flatMap(
    Effect.sync(() => token ?? SecretBox.generateToken()),
    (t) =>
      Either.match(SecretBox.sealRandom(keyring, t), {
        onLeft: () => Effect.fail(new SecretsError({ reason: "no_key" })),
        onRight: (envelope) => Effect.succeed({ token: t, envelope })
      })
  )
}

// ---------------------------------------------------------------------------------------------
// The service

const cacheKey = (ownerDid: string, name: string): string => `${ownerDid}\u0000${name}`

const checkIds = (ownerDid: string, name: string): Effect.Effect<void, SecretsError> =>
  !isCanonicalDid(ownerDid)
    ? Effect.fail(new SecretsError({ reason: "invalid_owner" }))
    : !SECRET_NAME.test(name)
    ? Effect.fail(new SecretsError({ reason: "invalid_name" }))
    : Effect.void

/** The service over a store and a keyring. */
export const make = (
  store: SecretsStoreShape,
  keyring: SecretBox.Keyring,
  options: SecretsOptions = {}
): Effect.Effect<SecretsShape> =>
  Effect.sync(() => {
    const cache = makeTokenCache(options)

    const resolve = Effect.fn("Secrets.resolve")(function*(ownerDid: string, name: string) {
      if (!isCanonicalDid(ownerDid) || !SECRET_NAME.test(name)) return yield* Effect.fail(new SecretUnavailable())
      const key = cacheKey(ownerDid, name)
      const generation = cache.generation()
      // taken before the store read: a token is kept for the TTL counted from the read's snapshot
      let readAt = 0
      if (cache.on) {
        readAt = yield* Clock.currentTimeMillis
        const hit = cache.get(key, readAt)
        if (hit !== undefined) return hit
      }
      const envelope = yield* store.get(ownerDid, name).pipe(Effect.mapError(() => new SecretUnavailable()))
      if (envelope === undefined) return yield* Effect.fail(new SecretUnavailable())
      const token = yield* Either.match(SecretBox.open(keyring, envelope), {
        onLeft: () => Effect.fail(new SecretUnavailable()),
        onRight: (t) => Effect.succeed(t)
      })
      if (cache.on) {
        const now = yield* Clock.currentTimeMillis
        cache.put(key, token, readAt, now, generation)
      }
      return token
    })

    const create = Effect.fn("Secrets.create")(function*(owner: string, name: string, token?: string, total?: number) {
      yield* checkIds(owner, name)
      const sealed = yield* sealNew(keyring, token)
      const result = yield* store.insert(owner, name, sealed.envelope, total)
      if (result === "exists") return yield* Effect.fail(new SecretsError({ reason: "already_exists" }))
      if (result === "limit") return yield* Effect.fail(new SecretsError({ reason: "limit_reached" }))
      if (typeof result === "string") return yield* Effect.fail(new SecretsError({ reason: result }))
      yield* cache.invalidate(cacheKey(owner, name))
      return { token: sealed.token, createdAt: result.createdAt, rotatedAt: undefined }
    })

    const rotate = Effect.fn("Secrets.rotate")(function*(ownerDid: string, name: string, token?: string) {
      yield* checkIds(ownerDid, name)
      const sealed = yield* sealNew(keyring, token)
      const updated = yield* store.update(ownerDid, name, sealed.envelope)
      yield* cache.invalidate(cacheKey(ownerDid, name))
      if (updated === undefined) return yield* Effect.fail(new SecretsError({ reason: "not_found" }))
      return { token: sealed.token, createdAt: updated.createdAt, rotatedAt: updated.rotatedAt }
    })

    const remove = Effect.fn("Secrets.remove")(function*(ownerDid: string, name: string) {
      yield* checkIds(ownerDid, name)
      const removed = yield* store.delete(ownerDid, name)
      yield* cache.invalidate(cacheKey(ownerDid, name))
      return removed
    })

    const list = Effect.fn("Secrets.list")(function*(ownerDid: string) {
      if (!isCanonicalDid(ownerDid)) return yield* Effect.fail(new SecretsError({ reason: "invalid_owner" }))
      return yield* store.list(ownerDid)
    })

    const shape: SecretsShape = {
      resolve,
      create: (ownerDid, name, token) => create(ownerDid, name, token),
      createAsCaller: (did, name) =>
        create(did, name, undefined, options.beforeRecordTotal ?? MAX_SECRETS_BEFORE_RECORD_TOTAL),
      rotate: (ownerDid, name, token) => rotate(ownerDid, name, token),
      remove,
      list,
      reseal: (from) =>
        keyring.current === undefined
          ? Effect.fail(new SecretsError({ reason: "no_key" }))
          : Reseal.resealAll(store, keyring, keyring.current.id, from)
    }
    return shape
  })

export class Secrets extends Context.Tag("firehook/Secrets")<Secrets, SecretsShape>() {
  /**
   * PostgreSQL, keyring from the configuration, default cache. The configuration was validated by
   * `Config.load`, so an invalid keyring here is a programming error (a defect).
   */
  static readonly layerSqlWith = (
    options: SecretsOptions = {}
  ): Layer.Layer<Secrets, never, SqlClient.SqlClient | FirehookConfig> =>
    Layer.effect(
      Secrets,
      Effect.gen(function*() {
        const config = yield* FirehookConfig
        const keyring = yield* Effect.orDie(keyringFromConfig(config))
        const store = yield* makeSqlStore
        return yield* make(store, keyring, options)
      })
    )

  /** PostgreSQL, keyring from the configuration (the production layer). */
  static readonly layerSql: Layer.Layer<Secrets, never, SqlClient.SqlClient | FirehookConfig> = Secrets.layerSqlWith()

  /** PostgreSQL with an explicit keyring (tests, embedding). */
  static readonly layerSqlWithKeyring = (
    keyring: SecretBox.Keyring,
    options: SecretsOptions = {}
  ): Layer.Layer<Secrets, never, SqlClient.SqlClient> =>
    Layer.effect(Secrets, Effect.flatMap(makeSqlStore, (store) => make(store, keyring, options)))

  /**
   * In memory, pre-filled with `entries` (tests and embedding). The entries' tokens are sealed as
   * given (no caller-token rules, so tests may use short tokens). Without a keyring a fresh random
   * key is used. Invalid owners or names in `entries` are a programming error (a defect).
   */
  static readonly layerMemory = (
    entries: ReadonlyArray<{ readonly ownerDid: string; readonly name: string; readonly token: string }> = [],
    options: SecretsOptions & { readonly keyring?: SecretBox.Keyring } = {}
  ): Layer.Layer<Secrets> =>
    Layer.effect(
      Secrets,
      Effect.gen(function*() {
        const keyring = options.keyring ??
          (yield* Effect.orDie(
            Either.mapLeft(SecretBox.makeKeyring(randomKey(), []), () => new SecretsError({ reason: "invalid_key" }))
          ))
        const store = yield* makeMemoryStore
        for (const e of entries) {
          yield* Effect.orDie(checkIds(e.ownerDid, e.name))
          const envelope = yield* Effect.orDie(
            Either.mapLeft(SecretBox.sealRandom(keyring, e.token), () => new SecretsError({ reason: "no_key" }))
          )
          yield* Effect.orDie(store.insert(e.ownerDid, e.name, envelope))
        }
        return yield* make(store, keyring, options)
      })
    )
}

/** The layers of {@link Secrets}, at module level too (see the class for each). */
export const layerSqlWith = Secrets.layerSqlWith
export const layerSql = Secrets.layerSql
export const layerSqlWithKeyring = Secrets.layerSqlWithKeyring
export const layerMemory = Secrets.layerMemory

const randomKey = (): Uint8Array => Uint8Array.from(randomBytes(SecretBox.KEY_BYTES))
