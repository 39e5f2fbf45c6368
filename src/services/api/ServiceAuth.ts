/**
 * Service-auth verification of the owners' API (SPEC §8.2). A caller is the DID whose PDS minted
 * (or, proxying, forwarded) the bearer token; there are no firehook accounts.
 *
 * The token is verified by a kept library, `@atcute/xrpc-server`'s `ServiceJwtVerifier` (with
 * `@atcute/crypto`): it parses the token, refuses `at+jwt` / `refresh+jwt` / `dpop+jwt` and a `kid`
 * other than `#atproto`, checks `exp` (with the clock leeway) and `exp` at most `maxAge` ahead,
 * `aud` ∈ the accepted audiences, `lxm` = the called method, requires `jti`, verifies the signature
 * against the issuer's `#atproto` key (an `alg` that is not the key's own fails), asks again with
 * `noCache` after a failed signature (key rotation), and consults the replay store only for a
 * token whose signature verified. firehook supplies its hooks:
 * - the resolver: {@link Identity} (SPEC §5.1, cached; `noCache` = `resolveSigningKey(did,
 *   { fresh: true })`), turned into the DID document the library reads;
 * - the replay store: a bounded {@link ReplayCache} of `(iss, jti)` kept until the token's `exp`
 *   plus the leeway (the library passes no expiry, so each verification gets a store that knows its
 *   token's `exp`). With a shared store (`JtiStore`, PostgreSQL, every replica), a token fresh to
 *   this process, or any token while the process's cache is full, is then claimed there: already
 *   claimed (by another replica) → replayed; past its `exp` plus the leeway by the database's clock
 *   → `ExpiredToken` (the replicas' clocks may differ, the database's is the one they share: a
 *   replica whose clock is behind would otherwise accept a token whose row already lapsed, once per
 *   replica); the database cannot answer → 503 (the process forgets the `jti`, which was not
 *   accepted, so the same token can be retried). Without a shared store, a full cache → 503.
 * - the caller's rate limits ({@link BeforeReplay}, given by the API pipeline) run at the replay
 *   store's door: after the signature verified, before `(iss, jti)` is claimed, so a call they
 *   refuse (429) takes no replay entry (which lives until the token expires, up to 1 h + 31 s);
 *   they are undone when the claim does not accept the token.
 *
 * Before the library runs, firehook reads the token's header and claims with a Schema
 * (`schemas/ServiceJwt`, no cryptography) and applies the rules of §8.2 the library does not, plus
 * cheap ones it does, so a bad token is refused without any DID resolution: `alg` ES256K or ES256
 * only; `typ` absent or `JWT`; `iss` a canonical DID (no fragment); `aud`, `lxm` present and equal
 * to the method; `jti` present and ≤ 128 printable characters; `exp` not past (30 s leeway) and
 * at most 1 h ahead; `iat`, if present, at most 30 s ahead. These use the Effect `Clock`; the
 * library reads the wall clock for its own `exp` checks (in production they agree).
 *
 * One audience the library cannot read: `<SERVICE_DID>#firehook` when the service DID is a did:web
 * with a port (`did:web:host%3A8443`, which atproto's audience grammar allows only for `localhost`;
 * its token parser refuses the whole token). SPEC §8.2 accepts it, so for that audience firehook
 * takes the library's remaining steps itself ({@link verifyOwn}), in the same order and with the same
 * outcomes: `kid`, `nbf`, `iat` age, the issuer's key through the same resolver (fetched once more
 * after a failed signature), `alg` = the key's, the signature (`@atcute/crypto`'s `verifySig`, as
 * the library calls it), then the same replay stores.
 *
 * Identity lookups of tokens whose signature has not verified are budgeted across the process
 * ({@link IDENTITY_FETCH_BUDGET}: 10 a second, bursts of 100). A forged token names any DID, and a
 * failed lookup is not cached, so each one of a DID that does not exist is a fetch from the PLC
 * directory (or a did:web host); the failed-authentication limit is per client address, and an
 * attacker has many. The budget is charged by every lookup of a verification that would fetch:
 * a (non-`fresh`) lookup is free when Identity says its answer will come from its cache
 * (`Identity.isCached`: cached and not expired, or a fetch of that DID already in flight; an
 * Identity without it is charged for every lookup), so a known owner costs nothing while its
 * document is cached, and one whose document was evicted (Identity's LRU of 10,000 DIDs, shared
 * with the reconciler in the all-in-one process), expired or never fetched, or whose last lookup
 * failed (a failure is not cached), is charged like any other DID: forged tokens naming owners'
 * public DIDs reach the directory only within the budget. A `fresh` lookup (a signature that
 * failed with the cached key) is a fetch: charged, unless this verification already paid (its
 * first lookup was a fetch, and Identity serves the `fresh` one from the document just fetched);
 * forged tokens naming every owner would otherwise reach the directory once per owner per 10 s.
 * The cache is checked just before the lookup: an eviction in between costs at most one fetch
 * outside the budget per check. Past the budget the lookup is not made: `identity_unavailable`
 * (as for a held directory), with the wait until the next token in `retryAfterMs`; the
 * reconciler's lookups and PLC budget are spared.
 *
 * Outcomes: {@link AuthFailure} (401, one of the four error names of §8.2, with a reason for
 * metrics and debug logs, never the token) or {@link AuthUnavailable} (firehook cannot decide now:
 * the issuer's DID document could not be fetched, the replay cache is full and there is no shared
 * store, the shared store is at its bound or cannot answer).
 */
import { type FoundPublicKey, getPublicKeyFromDidController, verifySig } from "@atcute/crypto"
import { type DidDocument as AtcuteDidDocument, isAtprotoAudience } from "@atcute/identity"
import type { DidDocumentResolver } from "@atcute/identity-resolver"
import type { Did, Nsid } from "@atcute/lexicons"
import { type AtprotoAudience, isDid, isNsid } from "@atcute/lexicons/syntax"
import { AuthRequiredError } from "@atcute/xrpc-server"
import { ServiceJwtVerifier } from "@atcute/xrpc-server/auth"
import { Clock, Data, Effect, Either, Encoding, Runtime } from "effect"
import { isCanonicalDid } from "../../schemas/AtUri.js"
import { ATPROTO_KEY_ID_SUFFIX, type SigningKey } from "../../schemas/DidDocument.js"
import { type JwtClaims, readServiceJwt, type ServiceJwtParts } from "../../schemas/ServiceJwt.js"
import * as RateLimitedLog from "../platform/RateLimitedLog.js"
import { Identity, IdentityError } from "../reconciliation/Identity.js"
import type { JtiStoreShape } from "./JtiStore.js"
import { makeBuckets, type Rate } from "./RateLimiter.js"
import { DEFAULT_REPLAY_CAPACITY, makeReplayCache, type ReplayVerdict } from "./ReplayCache.js"

/** The 401 error names of SPEC §8.2. */
export const AUTH_ERRORS = ["AuthenticationRequired", "InvalidToken", "BadJwtSignature", "ExpiredToken"] as const
export type AuthError = (typeof AUTH_ERRORS)[number]

/** The token does not authenticate the call (401). `reason` is a fixed code, never token data. */
export class AuthFailure extends Data.TaggedError("AuthFailure")<{
  readonly error: AuthError
  readonly reason: string
}> {}

/** firehook cannot decide now (503 / 502): the issuer's identity is unreachable, or the replay cache is full. */
export class AuthUnavailable extends Data.TaggedError("AuthUnavailable")<{
  readonly reason: "identity_unavailable" | "replay_cache_full" | "replay_store_full" | "replay_store_unavailable"
  /** the wait (ms) the issuer's identity lookup was given: its document host's, or the lookup budget's */
  readonly retryAfterMs?: number | undefined
}> {}

export const ALGORITHMS: ReadonlyArray<string> = ["ES256K", "ES256"]
/** SPEC §8.2: `exp` at most 1 h ahead. */
export const MAX_AGE_SECONDS = 3600
/** SPEC §8.2: 30 s of clock skew for `exp` and `iat`. */
export const CLOCK_LEEWAY_SECONDS = 30
export const MAX_JTI_LENGTH = 128
/** The service id in `aud` (`<SERVICE_DID>#firehook`) and in `/.well-known/did.json`. */
export const SERVICE_ID = "firehook"

/**
 * Identity lookups for tokens not yet verified that may fetch a DID document, across the process:
 * 100 per 10 s (10 a second sustained, bursts of 100). Legitimate ones are rare (an owner's first
 * call since this process started, in a day or since Identity evicted its document; a rotated
 * key): a restart with a cold cache admits 100 owners at once and 600 a minute after; the
 * sustained rate stays far from what a directory tolerates from one client, so the reconciler's
 * own lookups keep theirs.
 */
export const IDENTITY_FETCH_BUDGET: Rate = { limit: 100, perMs: 10_000 }
/** The issuer's `#atproto` key for one verification (`fresh`: fetched once more), through the budget. */
type KeyLookup = (did: string, fresh: boolean) => Effect.Effect<SigningKey | undefined, IdentityError>

/** The 503 of a lookup that could not be made or answered now (its wait, if any). */
const identityUnavailable = (e: IdentityError) =>
  new AuthUnavailable(
    e.retryAfterMs === undefined
      ? { reason: "identity_unavailable" }
      : { reason: "identity_unavailable", retryAfterMs: e.retryAfterMs }
  )

export interface ServiceAuthOptions {
  /** the service DID: tokens must be addressed to it or to `<it>#firehook` */
  readonly serviceDid: string
  /** `(iss, jti)` pairs kept at most — default 100,000 */
  readonly replayCapacity?: number
  /** the replay store shared by the replicas (checked after this process's cache) */
  readonly sharedReplay?: JtiStoreShape
}

export interface Verified {
  /** the caller: the only owner this call can see or act on */
  readonly did: string
}

/**
 * What runs once a token's signature has verified and before its `(iss, jti)` is claimed in the
 * replay stores (the caller's rate limits: a call they refuse must not take a replay entry, which
 * lives until the token expires). Failing refuses the call with its error, nothing claimed;
 * succeeding gives what undoes it, run when the claim does not accept the token (a replay, a token
 * the shared store holds as expired, a store that is full or cannot answer).
 */
export type BeforeReplay<E> = (iss: string) => Effect.Effect<Effect.Effect<void>, E>

export interface ServiceAuthShape {
  /** Verify the `Authorization` header of a call of `nsid` (`beforeReplay`: see {@link BeforeReplay}). */
  readonly verify: <E = never>(
    authorization: string | undefined,
    nsid: string,
    beforeReplay?: BeforeReplay<E>
  ) => Effect.Effect<Verified, AuthFailure | AuthUnavailable | E>
  /** `(iss, jti)` pairs held by the replay cache */
  readonly replayEntries: Effect.Effect<number>
}

const refuse = (error: AuthError, reason: string) => Either.left(new AuthFailure({ error, reason }))

/** The bearer token of an `Authorization` header (scheme case-insensitive), or undefined. */
export const bearerToken = (authorization: string | undefined): string | undefined => {
  if (authorization === undefined) return undefined
  const m = /^bearer +(\S+) *$/i.exec(authorization)
  return m?.[1]
}

/**
 * The rules of SPEC §8.2 that need no key (pure; `nowMs` from the Clock). Right: the claims, for
 * the library to verify.
 */
export const checkClaims = (
  parts: ServiceJwtParts,
  context: { readonly nowMs: number; readonly nsid: string; readonly audiences: ReadonlyArray<string> }
): Either.Either<JwtClaims, AuthFailure> => {
  const { header, claims } = parts
  const now = context.nowMs / 1000
  if (!ALGORITHMS.includes(header.alg)) return refuse("InvalidToken", "alg")
  if (header.typ !== undefined && header.typ !== "JWT") return refuse("InvalidToken", "typ")
  if (!isCanonicalDid(claims.iss)) return refuse("InvalidToken", "iss")
  if (!context.audiences.includes(claims.aud)) return refuse("InvalidToken", "aud")
  if (claims.lxm === undefined) return refuse("InvalidToken", "lxm_missing")
  if (claims.lxm !== context.nsid) return refuse("InvalidToken", "lxm")
  if (claims.jti === undefined || !/^[\x21-\x7e]{1,128}$/.test(claims.jti)) return refuse("InvalidToken", "jti")
  if (claims.exp + CLOCK_LEEWAY_SECONDS < now) return refuse("ExpiredToken", "expired")
  if (claims.exp - now > MAX_AGE_SECONDS) return refuse("InvalidToken", "exp_too_far")
  if (claims.iat !== undefined && claims.iat > now + CLOCK_LEEWAY_SECONDS) return refuse("InvalidToken", "iat_future")
  return Either.right(claims)
}

/** The DID document the library reads: the issuer and its `#atproto` key, if it has one. */
const documentOf = (did: Did, key: SigningKey | undefined): AtcuteDidDocument => ({
  "@context": ["https://www.w3.org/ns/did/v1"],
  id: did,
  verificationMethod: key === undefined
    ? []
    : [{ id: `${did}#atproto`, type: key.type, controller: did, publicKeyMultibase: key.publicKeyMultibase }]
})

/** The library's refusal code, from the `WWW-Authenticate` challenge of its error. */
const libraryCode = (e: unknown): string | undefined => {
  if (!(e instanceof AuthRequiredError) || !(e.headers instanceof Headers)) return undefined
  const challenge = e.headers.get("www-authenticate")
  if (challenge === null) return undefined
  return /error="([A-Za-z]{1,64})"/.exec(challenge)?.[1] ?? "none"
}

/** The §8.2 error name of a library refusal. */
const fromLibrary = (code: string | undefined): AuthFailure => {
  if (code === "none" || code === "MissingBearer") {
    return new AuthFailure({ error: "AuthenticationRequired", reason: "missing" })
  }
  if (code === "JwtExpired") return new AuthFailure({ error: "ExpiredToken", reason: "expired" })
  if (code === "BadJwtSignature") return new AuthFailure({ error: "BadJwtSignature", reason: "signature" })
  return new AuthFailure({ error: "InvalidToken", reason: code === undefined ? "verifier" : code.toLowerCase() })
}

/** What the library's token parser reads as an audience (else: {@link verifyOwn}). */
const libraryReadsAudience = (aud: string): boolean => isAtprotoAudience(aud) || isDid(aud)

/**
 * The replay check of a token whose signature verified: this process's cache, then the shared
 * store (`expired`: past its expiry by the store's database clock; `store_full`: the store is at
 * its bound; `unavailable`: it could not answer).
 */
type ReplayCheck = (
  iss: string,
  jti: string,
  expiresAtMs: number,
  nowMs: number
) => Effect.Effect<ReplayOutcome>

type ReplayOutcome = ReplayVerdict | "expired" | "store_full" | "unavailable"

/** The reason a token could not be checked now, or undefined. */
const unavailableReason = (outcome: ReplayOutcome | undefined): AuthUnavailable["reason"] | undefined =>
  outcome === "full"
    ? "replay_cache_full"
    : outcome === "store_full"
    ? "replay_store_full"
    : outcome === "unavailable"
    ? "replay_store_unavailable"
    : undefined

const sameBytes = (a: Uint8Array, b: Uint8Array): boolean => a.length === b.length && a.every((x, i) => x === b[i])

/**
 * The library's steps after its parser, for a token whose `aud` the parser refuses (see the module
 * documentation); `checkClaims` has already passed it (alg, typ, iss, aud, lxm, jti, exp, iat).
 * Failures carry the library's codes, so they map to the same §8.2 names.
 */
const verifyOwn = <E>(
  keyLookup: KeyLookup,
  replayCheck: ReplayCheck,
  beforeReplay: BeforeReplay<E> | undefined,
  token: string,
  parts: ServiceJwtParts,
  nowMs: number
): Effect.Effect<{ readonly issuer: string; readonly lxm: string | undefined }, AuthFailure | AuthUnavailable | E> =>
  Effect.gen(function*() {
    const { claims, header } = parts
    const refused = (code: string) => Effect.fail(fromLibrary(code))
    const now = Math.floor(nowMs / 1000)
    if ((header.kid ?? ATPROTO_KEY_ID_SUFFIX) !== ATPROTO_KEY_ID_SUFFIX) return yield* refused("BadJwtIssuer")
    if (claims.iat !== undefined && claims.exp <= claims.iat) return yield* refused("BadJwt")
    if (claims.nbf !== undefined && now < claims.nbf - CLOCK_LEEWAY_SECONDS) return yield* refused("JwtNotYetValid")
    if (claims.iat !== undefined && now - claims.iat > MAX_AGE_SECONDS) return yield* refused("JwtTooOld")
    const [head = "", payload = "", sig = ""] = token.split(".")
    const signature = Encoding.decodeBase64Url(sig)
    if (Either.isLeft(signature)) return yield* refused("BadJwt")
    const message = new TextEncoder().encode(`${head}.${payload}`)
    const keyOf = (fresh: boolean): Effect.Effect<FoundPublicKey, AuthFailure | AuthUnavailable> =>
      keyLookup(claims.iss, fresh).pipe(
        Effect.mapError((e) =>
          e.kind === "identity_unavailable" ? identityUnavailable(e) : fromLibrary("DidResolutionFailed")
        ),
        Effect.flatMap((key) => {
          const found = key === undefined
            ? Either.left(undefined)
            : Either.try(() => getPublicKeyFromDidController(key))
          return Either.isRight(found) ? Effect.succeed(found.right) : refused("BadJwtIssuer")
        })
      )
    const verifies = (key: FoundPublicKey) =>
      Effect.tryPromise({
        try: () => verifySig(key, new Uint8Array(signature.right), message, { allowMalleableSig: true }),
        catch: () => fromLibrary("BadJwtSignature")
      })
    const key = yield* keyOf(false)
    let valid = key.jwtAlg === header.alg ? yield* verifies(key) : false
    if (!valid) {
      // the owner may have rotated its key: once more, fresh
      const fresh = yield* keyOf(true)
      if (fresh.jwtAlg !== header.alg) return yield* refused("BadJwtIssuer")
      if (!sameBytes(fresh.publicKeyBytes, key.publicKeyBytes)) valid = yield* verifies(fresh)
    }
    if (!valid) return yield* refused("BadJwtSignature")
    const jti = claims.jti ?? ""
    // the signature verified: the caller's limits, before the replay entry is taken
    const undo = beforeReplay === undefined ? Effect.void : yield* beforeReplay(claims.iss)
    const verdict = yield* replayCheck(claims.iss, jti, (claims.exp + CLOCK_LEEWAY_SECONDS + 1) * 1000, nowMs)
    if (verdict !== "fresh") yield* undo
    const unavailable = unavailableReason(verdict)
    if (unavailable !== undefined) return yield* Effect.fail(new AuthUnavailable({ reason: unavailable }))
    if (verdict === "replayed") return yield* refused("NonceNotUnique")
    if (verdict === "expired") return yield* refused("JwtExpired")
    return { issuer: claims.iss, lxm: claims.lxm }
  })

export const make = (options: ServiceAuthOptions) =>
  Effect.gen(function*() {
    const identity = yield* Identity
    const runtime = yield* Effect.runtime<never>()
    const replay = makeReplayCache(options.replayCapacity ?? DEFAULT_REPLAY_CAPACITY)
    // a store that cannot answer fails every call: logged once a minute, not once per call
    const storeLog = RateLimitedLog.make()
    // identity lookups of unverified tokens (IDENTITY_FETCH_BUDGET), one bucket for the process
    const lookupBudget = makeBuckets(IDENTITY_FETCH_BUDGET, 1)
    const budgetLog = RateLimitedLog.make()
    // a normal lookup Identity answers from its cache is free (without `isCached`: never)
    const cached = (did: string): Effect.Effect<boolean> =>
      identity.isCached === undefined ? Effect.succeed(false) : identity.isCached(did)
    /** A lookup the budget refuses: not made, `identity_unavailable` as for a held host (logged once a minute). */
    const overBudget = (retryAfterMs: number) => {
      const warn = (suppressed: number) =>
        Effect.annotateLogs(Effect.logWarning("api: identity lookups of unverified tokens are over budget"), {
          suppressed
        })
      const refused = new IdentityError({ kind: "identity_unavailable", held: true, retryAfterMs })
      return Effect.zipRight(budgetLog.run("identity_budget", warn), Effect.fail(refused))
    }
    /** The key lookups of one verification begun at `nowMs` (see the module documentation). */
    const keyLookup = (nowMs: number): KeyLookup => {
      let charged = false
      return (did, fresh) =>
        Effect.gen(function*() {
          if (!charged && (fresh || !(yield* cached(did)))) {
            const decision = lookupBudget.take("identity", nowMs)
            if (!decision.allowed) return yield* overBudget(decision.retryAfterMs)
            charged = true
          }
          return yield* identity.resolveSigningKey(did, { fresh })
        })
    }
    const serviceDid = options.serviceDid
    const audiences: Array<Did | AtprotoAudience> = []
    if (isDid(serviceDid)) {
      // both forms of §8.2, also for a did:web with a port (its fragment form is verified by verifyOwn)
      audiences.push(serviceDid, `${serviceDid}#${SERVICE_ID}` as AtprotoAudience)
    }

    /**
     * A verified token's `(iss, jti)`: this process's cache, then the shared store (already claimed
     * there → replayed; expired by the database's clock → expired; cannot be checked → unavailable;
     * in both last cases the process forgets the `jti`, which was not accepted). When this process's cache is full, the shared
     * store alone decides: it is the authority across replicas, so a replay is still refused and
     * nothing is forgotten early, and a cache filled by one caller's many DIDs does not refuse every
     * other owner (without a shared store, full stays 503: the cache is then the only record).
     */
    const replayCheck: ReplayCheck = (iss, jti, expiresAtMs, nowMs) => {
      const local = replay.check(iss, jti, expiresAtMs, nowMs)
      const shared = options.sharedReplay
      if (local === "replayed" || shared === undefined) return Effect.succeed(local)
      // a token the store did not record (at its bound, or unreachable) was not accepted: this
      // process forgets it too, so the same token can be retried
      const notAccepted = Effect.sync(() => {
        if (local === "fresh") replay.forget(iss, jti)
      })
      return shared.claim(iss, jti, expiresAtMs).pipe(
        Effect.flatMap((verdict): Effect.Effect<ReplayOutcome> =>
          verdict === "full"
            ? Effect.as(notAccepted, "store_full" as const)
            : verdict === "expired"
            ? Effect.as(notAccepted, "expired" as const)
            : Effect.succeed(verdict)
        ),
        Effect.catchAll((e) =>
          notAccepted.pipe(
            Effect.zipRight(
              storeLog.run(
                e.code,
                (suppressed) =>
                  Effect.logWarning("api: the shared replay store could not be checked").pipe(
                    Effect.annotateLogs({ code: e.code, suppressed })
                  )
              )
            ),
            Effect.as("unavailable" as const)
          )
        )
      )
    }

    /**
     * Ask the library; what the hooks saw decides between a refusal and "cannot decide now".
     * `beforeReplay` runs in the call's own runtime (`callRuntime`: its Clock, its context).
     */
    const library = <E>(
      token: string,
      nsid: Nsid,
      claims: JwtClaims,
      nowMs: number,
      beforeReplay: BeforeReplay<E> | undefined,
      callRuntime: Runtime.Runtime<never>
    ) => {
      const seen: {
        resolution?: IdentityError
        replay?: ReplayOutcome
        issuer?: "other"
        refused?: { readonly error: E }
      } = {}
      const lookup = keyLookup(nowMs)
      const resolver: DidDocumentResolver = {
        resolve: (did, opts) =>
          Runtime.runPromise(runtime)(
            lookup(did, opts?.noCache === true).pipe(
              Effect.map((key) => documentOf(did, key)),
              Effect.tapError((e) => Effect.sync(() => void (seen.resolution = e)))
            ),
            opts?.signal === undefined ? {} : { signal: opts.signal }
          )
      }
      const expiresAtMs = (claims.exp + CLOCK_LEEWAY_SECONDS + 1) * 1000
      const verifier = new ServiceJwtVerifier({
        acceptAudiences: audiences,
        resolver,
        maxAge: MAX_AGE_SECONDS,
        clockLeeway: CLOCK_LEEWAY_SECONDS,
        replayStore: {
          // the library's last step, once the signature verified: the caller's limits, then the claim
          check: async (key) => {
            if (key.iss !== claims.iss) {
              // not the issuer firehook read (never expected): refused, nothing taken or claimed
              seen.issuer = "other"
              return false
            }
            let undo: Effect.Effect<void> = Effect.void
            if (beforeReplay !== undefined) {
              const admitted = await Runtime.runPromise(callRuntime)(Effect.either(beforeReplay(key.iss)))
              if (Either.isLeft(admitted)) {
                seen.refused = { error: admitted.left }
                return false
              }
              undo = admitted.right
            }
            const verdict = await Runtime.runPromise(runtime)(replayCheck(key.iss, key.jti, expiresAtMs, nowMs))
            seen.replay = verdict
            if (verdict !== "fresh") await Runtime.runPromise(callRuntime)(undo)
            return verdict === "fresh"
          }
        }
      })
      const request = new Request(`https://${SERVICE_ID}.invalid/xrpc/${nsid}`, {
        headers: { authorization: `Bearer ${token}` }
      })
      return Effect.tryPromise({
        try: (signal) => verifier.verifyRequest(request, { lxm: nsid, signal }),
        catch: (e): AuthFailure | AuthUnavailable | E => {
          const unavailable = unavailableReason(seen.replay)
          return seen.refused !== undefined
            ? seen.refused.error
            : seen.issuer !== undefined
            ? new AuthFailure({ error: "InvalidToken", reason: "verifier" })
            : unavailable !== undefined
            ? new AuthUnavailable({ reason: unavailable })
            : seen.replay === "expired"
            ? fromLibrary("JwtExpired")
            : seen.resolution?.kind === "identity_unavailable"
            ? identityUnavailable(seen.resolution)
            : fromLibrary(libraryCode(e))
        }
      })
    }

    const verify = <E = never>(authorization: string | undefined, nsid: string, beforeReplay?: BeforeReplay<E>) =>
      Effect.gen(function*() {
        const token = bearerToken(authorization)
        if (token === undefined) {
          return yield* Effect.fail(new AuthFailure({ error: "AuthenticationRequired", reason: "missing" }))
        }
        const parts = readServiceJwt(token)
        if (parts === undefined) {
          return yield* Effect.fail(new AuthFailure({ error: "InvalidToken", reason: "malformed" }))
        }
        if (!isNsid(nsid)) return yield* Effect.fail(new AuthFailure({ error: "InvalidToken", reason: "lxm" }))
        const nowMs = yield* Clock.currentTimeMillis
        const claims = yield* checkClaims(parts, { nowMs, nsid, audiences })
        const verified = yield* (libraryReadsAudience(claims.aud)
          ? Effect.flatMap(
            Effect.runtime<never>(),
            (callRuntime) => library(token, nsid, claims, nowMs, beforeReplay, callRuntime)
          )
          : verifyOwn(keyLookup(nowMs), replayCheck, beforeReplay, token, parts, nowMs))
        if (verified.issuer !== claims.iss || verified.lxm !== nsid) {
          return yield* Effect.fail(new AuthFailure({ error: "InvalidToken", reason: "verifier" }))
        }
        return { did: claims.iss }
      }).pipe(Effect.withSpan("ServiceAuth.verify"))

    const shape: ServiceAuthShape = { verify, replayEntries: Effect.sync(() => replay.size()) }
    return shape
  })
