/**
 * The webhook owner's side (`firehook hooks …`): `place.wisp.v2.wh` records in one's own atproto
 * repo, written through `@atproto/api` to any PDS with an identifier and an app password. Nothing
 * here needs firehook's database or service configuration: it talks only to the PDS.
 *
 * - Every record is checked with the service's own validation (`validateWhRecord`, SPEC §1) with the
 *   service's insecure-development semantic (`WEBHOOK_ALLOW_INSECURE_DEV=1` only together with
 *   `NODE_ENV=development|test`) BEFORE anything is written; `create` checks its arguments before
 *   it even signs in.
 * - Every PDS call is bounded (`callTimeout`, default 20 s); in-flight requests are aborted when the
 *   scope closes. The session is deleted (best effort, bounded) when the scope closes.
 * - Errors are one-line values: `HooksInvalid` (bad arguments: exit code 2 in the CLI) and
 *   `HooksFailed` (the operation could not be done: exit code 1). They never carry the password,
 *   a signing secret, a webhook URL or free text from the PDS (only its status and error name).
 * - enable/disable and delete are compare-and-swap on the fetched record CID, so a concurrent edit
 *   is never clobbered; `create --rkey` never replaces an existing record.
 *
 * @since 0.1.0
 */
import type { AtpAgent } from "@atproto/api"
import { Clock, Config as EffectConfig, Context, Duration, Effect, Either, Layer, Option, Redacted } from "effect"
import type { Scope } from "effect"
import { isCollection, isRkey } from "../schemas/AtUri.js"
import { isLoopbackHost } from "../schemas/Net.js"
import { type UrlErrorKind, validateWebhookUrl } from "../schemas/WebhookUrl.js"
import { type ValidatedWh, validateWhRecord, WH_COLLECTION, type WhRecordErrorKind } from "../schemas/WhRecord.js"
import * as SecretBox from "../services/delivery/SecretBox.js"
import * as Config from "../services/platform/Config.js"
import { classify, failed, HooksFailed, HooksInvalid, invalid, type Operation, own } from "./HookErrors.js"
import { fetchNoRedirect, isSafeEndpoint } from "./HookErrors.js"

export { HooksFailed, type HooksFailureReason, HooksInvalid } from "./HookErrors.js"

// ---------------------------------------------------------------------------------------------
// Connection and environment

export const DEFAULT_PDS = "https://bsky.social"
/**
 * a service token lives this long (SPEC §8.6): the PDS's default when `getServiceAuth` is given no
 * `exp`, counted by the PDS's clock (the CLI sends none)
 */
export const SERVICE_TOKEN_TTL_SECONDS = 60
/** every PDS call is bounded by this */
export const DEFAULT_CALL_TIMEOUT = Duration.seconds(20)
/** `listRecords` page size and page bound: at most 5000 records are listed */
export const LIST_PAGE_SIZE = 100
export const MAX_LIST_PAGES = 50
export const MAX_IDENTIFIER_LENGTH = 256
/** the session is deleted on the way out within this bound (best effort) */
export const LOGOUT_TIMEOUT = Duration.seconds(5)

export interface Connection {
  /** the PDS (or entryway) base URL */
  readonly pds: string
  /** a handle, a DID or an email */
  readonly identifier: string
  /** an app password (or the account password) */
  readonly password: Redacted.Redacted<string>
}

const parseUrl = (s: string): URL | undefined => {
  try {
    return new URL(s)
  } catch {
    return undefined
  }
}

/**
 * A PDS base URL: `https://host[:port][/path]`, or `http://` to a loopback host (a local PDS; the
 * password travels in clear otherwise). No credentials, query or fragment.
 */
export const parsePdsUrl = (s: string, source = "--pds"): Either.Either<string, HooksInvalid> => {
  const u = /[\s\u0000-\u001f\u007f]/.test(s) ? undefined : parseUrl(s)
  const rule =
    `invalid ${source}: must be an https:// URL (http:// only to a loopback host: localhost, 127.0.0.0/8 or [::1]) without credentials, query or fragment`
  if (
    u === undefined || u.hostname === "" || u.username !== "" || u.password !== "" || u.search !== "" || u.hash !== ""
  ) {
    return Either.left(invalid(rule))
  }
  if (u.protocol === "https:" || (u.protocol === "http:" && isLoopbackHost(u.hostname))) {
    return Either.right(u.toString())
  }
  return Either.left(invalid(rule))
}

const env = (name: string): Effect.Effect<Option.Option<string>, HooksInvalid> =>
  EffectConfig.option(EffectConfig.string(name)).pipe(
    Effect.mapError(() => invalid(`${name} could not be read`)),
    Effect.map(Option.filter((s) => s.length > 0))
  )

/**
 * The connection from the command line, falling back to the environment: `--pds` / `ATPROTO_PDS`
 * (default https://bsky.social), `--identifier` / `ATPROTO_IDENTIFIER`, `--password` /
 * `ATPROTO_APP_PASSWORD`.
 */
export const connection = (given: {
  readonly pds: Option.Option<string>
  readonly identifier: Option.Option<string>
  readonly password: Option.Option<Redacted.Redacted<string>>
}): Effect.Effect<Connection, HooksInvalid> =>
  Effect.gen(function*() {
    const pdsText = Option.isSome(given.pds)
      ? given.pds.value
      : Option.getOrElse(yield* env("ATPROTO_PDS"), () => DEFAULT_PDS)
    const pds = yield* parsePdsUrl(pdsText, Option.isSome(given.pds) ? "--pds" : "--pds (ATPROTO_PDS)")
    const identifier = Option.isSome(given.identifier)
      ? Option.some(given.identifier.value)
      : yield* env("ATPROTO_IDENTIFIER")
    if (Option.isNone(identifier)) {
      return yield* invalid("missing --identifier (or ATPROTO_IDENTIFIER): the handle, DID or email to sign in as")
    }
    const id = identifier.value
    if (id.length === 0 || id.length > MAX_IDENTIFIER_LENGTH || /[\s\u0000-\u001f\u007f]/.test(id)) {
      return yield* invalid(
        `invalid ${
          Option.isSome(given.identifier) ? "--identifier" : "--identifier (ATPROTO_IDENTIFIER)"
        }: must be a handle, DID or email of 1-${MAX_IDENTIFIER_LENGTH} characters without spaces`
      )
    }
    const password = Option.isSome(given.password)
      ? Option.some(given.password.value)
      : Option.map(yield* env("ATPROTO_APP_PASSWORD"), Redacted.make)
    if (Option.isNone(password) || Redacted.value(password.value).length === 0) {
      return yield* invalid("missing password: set ATPROTO_APP_PASSWORD (or pass --password)")
    }
    return { pds, identifier: id, password: password.value }
  })

/**
 * The service's insecure development mode, read exactly as the service reads it (`Config.load`):
 * `WEBHOOK_ALLOW_INSECURE_DEV` ∈ {0, 1}, `NODE_ENV` ∈ {production, development, test} (default
 * production), and `1` is refused with production.
 */
export const allowInsecureDevFromEnv: Effect.Effect<boolean, HooksInvalid> = Effect.gen(function*() {
  const nodeEnv = yield* Config.readEnum<Config.NodeEnv>(
    "NODE_ENV",
    ["production", "development", "test"],
    "production"
  )
  const flag = yield* Config.readEnum("WEBHOOK_ALLOW_INSECURE_DEV", ["0", "1"], "0")
  if (flag === "1" && nodeEnv === "production") {
    return yield* Effect.fail(
      new Config.ConfigInvalid({
        variable: "WEBHOOK_ALLOW_INSECURE_DEV",
        rule: "requires NODE_ENV=development or test"
      })
    )
  }
  return flag === "1"
}).pipe(Effect.mapError((e) => invalid(e.message)))

// ---------------------------------------------------------------------------------------------
// The record from arguments

export type ScopeInput =
  | { readonly _tag: "AtUri"; readonly aturi: string }
  /** shorthand: `at://<own did>/<collection>` */
  | { readonly _tag: "Collection"; readonly collection: string }

export type Signing =
  | { readonly _tag: "None" }
  | { readonly _tag: "Secret"; readonly secret: Redacted.Redacted<string> }
  | { readonly _tag: "SecretId"; readonly name: string }
  /** a fresh `whsec_` token (32 random bytes), returned once by `create` */
  | { readonly _tag: "Generate" }

export interface Draft {
  readonly scope: ScopeInput
  readonly backlinks: boolean
  /** empty = all operations */
  readonly events: ReadonlyArray<string>
  readonly url: string
  readonly signing: Signing
  readonly enabled: boolean
  readonly rkey: Option.Option<string>
}

/** any canonical DID, for checking a `--collection` draft before the own DID is known */
const PLACEHOLDER_DID = "did:plc:aaaaaaaaaaaaaaaaaaaaaaaa"
const PLACEHOLDER_SECRET = SecretBox.tokenFromBytes(new Uint8Array(32))
const PLACEHOLDER_CREATED_AT = "2000-01-01T00:00:00.000Z"

const URL_RULES: Record<UrlErrorKind, string> = {
  not_string: "must be a URL",
  too_long: "must be at most 2048 characters",
  unparseable: "must be an absolute URL without spaces",
  no_host: "must have a host name",
  credentials: "must not contain a user name or password",
  fragment: "must not contain a #fragment",
  scheme: "must be https://",
  blocked_host: "this host is never allowed (localhost, *.localhost, metadata.google.internal)",
  non_public_ip: "a literal IP address must be public"
}

const urlRule = (url: string, allowInsecureDev: boolean): string => {
  const result = validateWebhookUrl(url, { allowInsecureDev })
  if (Either.isRight(result)) return "rejected"
  const kind = result.left
  if (kind === "scheme" || kind === "blocked_host" || kind === "non_public_ip") {
    const dev = allowInsecureDev
      ? " (insecure development mode allows http:// to a loopback host only)"
      : " (http:// to a loopback host needs WEBHOOK_ALLOW_INSECURE_DEV=1 with NODE_ENV=development or test)"
    return URL_RULES[kind] + dev
  }
  return URL_RULES[kind]
}

/** The one-line message for a record built from arguments that the service would refuse. */
const draftInvalid = (draft: Draft, kind: WhRecordErrorKind, allowInsecureDev: boolean): HooksInvalid => {
  switch (kind) {
    case "scope":
      return invalid(
        draft.scope._tag === "Collection"
          ? "invalid --collection: must be a collection NSID (app.bsky.feed.post) or a glob (app.bsky.feed.*)"
          : "invalid --scope: must be at://<did>[/<collection>[/<rkey>]] with a canonical DID (did:plc:… or did:web:…, not a handle), without query or fragment"
      )
    case "url":
      return invalid(`invalid --url: ${urlRule(draft.url, allowInsecureDev)}`)
    case "events":
      return invalid("invalid --events: a comma-separated list of create, update, delete, each at most once")
    case "secret":
      return invalid("invalid --secret: must be 1-256 characters")
    case "secret_id":
      return invalid("invalid --secret-id: must match ^[A-Za-z0-9._-]{1,64}$")
    default:
      return invalid(`the record built from the arguments is invalid (${kind})`)
  }
}

/** The record value a draft stands for (before validation). */
const recordOf = (
  draft: Draft,
  ownDid: string,
  createdAt: string,
  secret: string | undefined
): Record<string, unknown> => {
  const aturi = draft.scope._tag === "AtUri" ? draft.scope.aturi : `at://${ownDid}/${draft.scope.collection}`
  return {
    $type: WH_COLLECTION,
    scope: { aturi, ...(draft.backlinks ? { backlinks: true } : {}) },
    url: draft.url,
    ...(draft.events.length > 0 ? { events: [...draft.events] } : {}),
    ...(secret !== undefined ? { secret } : {}),
    ...(draft.signing._tag === "SecretId" ? { secretId: draft.signing.name } : {}),
    ...(draft.enabled ? {} : { enabled: false }),
    createdAt
  }
}

const draftSecret = (draft: Draft, generated: string): string | undefined => {
  switch (draft.signing._tag) {
    case "Secret":
      return Redacted.value(draft.signing.secret)
    case "Generate":
      return generated
    default:
      return undefined
  }
}

const validateDraft = (
  draft: Draft,
  ownDid: string,
  createdAt: string,
  generated: string,
  allowInsecureDev: boolean
): Either.Either<ValidatedWh, HooksInvalid> => {
  if (draft.scope._tag === "Collection" && !isCollection(draft.scope.collection)) {
    return Either.left(draftInvalid(draft, "scope", allowInsecureDev))
  }
  return Either.mapLeft(
    validateWhRecord(recordOf(draft, ownDid, createdAt, draftSecret(draft, generated)), { allowInsecureDev }),
    (kind) => draftInvalid(draft, kind, allowInsecureDev)
  )
}

/**
 * Checks a draft without the PDS: the same validation `create` runs once signed in (with the own
 * DID), so an invalid draft fails before any credentials are used.
 */
export const checkDraft = (draft: Draft, allowInsecureDev: boolean): Either.Either<void, HooksInvalid> => {
  if (Option.isSome(draft.rkey) && !isRkey(draft.rkey.value)) {
    return Either.left(
      invalid("invalid --rkey: must be a record key ([A-Za-z0-9._~:%@+-], 1-512 characters, not . or ..)")
    )
  }
  return Either.map(
    validateDraft(draft, PLACEHOLDER_DID, PLACEHOLDER_CREATED_AT, PLACEHOLDER_SECRET, allowInsecureDev),
    () => undefined
  )
}

/** `--events create,update`: the list as given (the record validation judges it). */
export const parseEvents = (s: string): ReadonlyArray<string> => s.split(",").map((e) => e.trim())

export const checkRkey = (rkey: string): Either.Either<string, HooksInvalid> =>
  isRkey(rkey) ? Either.right(rkey) : Either.left(invalid("invalid <rkey>: must be a record key"))

// ---------------------------------------------------------------------------------------------
// Listing: a summary of a stored record that never contains its secret

export type SigningKind = "none" | "secret" | "secretId"

export interface WebhookSummary {
  readonly rkey: string
  readonly uri: string
  readonly cid: string
  /** `scope.aturi` as stored (undefined when not a string) */
  readonly scope: string | undefined
  readonly backlinks: boolean
  /** `scope.backlinksOnly`: fires for backlinks only, never for the scope's own records */
  readonly backlinksOnly: boolean
  /** as stored; empty = all operations */
  readonly events: ReadonlyArray<string>
  readonly enabled: boolean
  readonly signing: SigningKind
  readonly secretId: string | undefined
  readonly createdAt: string | undefined
  /** the webhook URL: print only on request */
  readonly url: string | undefined
  /** whether firehook would accept the record (`"ok"`), or the validation error kind */
  readonly validation: "ok" | WhRecordErrorKind
}

const rkeyOf = (uri: string): string => uri.slice(uri.lastIndexOf("/") + 1)

export const summarize = (
  rec: { readonly uri: string; readonly cid: string; readonly value: unknown },
  allowInsecureDev: boolean
): WebhookSummary => {
  const v = rec.value
  const scope = own(v, "scope")
  const aturi = own(scope, "aturi")
  const events = own(v, "events")
  const secretId = own(v, "secretId")
  const createdAt = own(v, "createdAt")
  const url = own(v, "url")
  const validated = validateWhRecord(v, { allowInsecureDev })
  return {
    rkey: rkeyOf(rec.uri),
    uri: rec.uri,
    cid: rec.cid,
    scope: typeof aturi === "string" ? aturi : undefined,
    backlinks: own(scope, "backlinks") === true || own(scope, "backlinksOnly") === true,
    backlinksOnly: own(scope, "backlinksOnly") === true,
    events: Array.isArray(events) ? events.filter((e): e is string => typeof e === "string") : [],
    enabled: own(v, "enabled") !== false,
    signing: own(v, "secret") !== undefined ? "secret" : secretId !== undefined ? "secretId" : "none",
    secretId: typeof secretId === "string" ? secretId : undefined,
    createdAt: typeof createdAt === "string" ? createdAt : undefined,
    url: typeof url === "string" ? url : undefined,
    validation: Either.isRight(validated) ? "ok" : validated.left
  }
}

// ---------------------------------------------------------------------------------------------
// The service

export interface HooksOptions {
  /** the service's insecure development mode (`allowInsecureDevFromEnv`) */
  readonly allowInsecureDev: boolean
  readonly callTimeout?: Duration.DurationInput
}

export interface Created {
  readonly did: string
  readonly uri: string
  readonly rkey: string
  readonly cid: string
  /** the generated signing secret (`Generate` only): show it once */
  readonly secret: Option.Option<Redacted.Redacted<string>>
}

export interface ListResult {
  readonly did: string
  readonly webhooks: ReadonlyArray<WebhookSummary>
  /** more records exist beyond the bound (`LIST_PAGE_SIZE * MAX_LIST_PAGES`): probed, see listIn */
  readonly truncated: boolean
}

export interface Toggled {
  readonly uri: string
  readonly rkey: string
  readonly enabled: boolean
  /** false when the record already was in that state (nothing written) */
  readonly changed: boolean
  readonly cid: string
}

export interface HooksShape {
  /** the signed-in account */
  readonly did: string
  readonly create: (draft: Draft) => Effect.Effect<Created, HooksInvalid | HooksFailed>
  readonly list: Effect.Effect<ListResult, HooksFailed>
  readonly setEnabled: (rkey: string, enabled: boolean) => Effect.Effect<Toggled, HooksInvalid | HooksFailed>
  readonly remove: (
    rkey: string
  ) => Effect.Effect<{ readonly uri: string; readonly rkey: string }, HooksInvalid | HooksFailed>
  /** a service token from the PDS for one call of `lxm` at `aud` (SPEC §8.6: 60 s) */
  readonly serviceToken: (aud: string, lxm: string) => Effect.Effect<Redacted.Redacted<string>, HooksFailed>
}

export class Hooks extends Context.Tag("firehook/Hooks")<Hooks, HooksShape>() {}

/** A signed-in session: the account, its agent, and the bounded call every request goes through. */
interface Session {
  readonly agent: AtpAgent
  readonly did: string
  readonly allowInsecureDev: boolean
  readonly call: <A>(op: Operation, f: (signal: AbortSignal) => Promise<A>) => Effect.Effect<A, HooksFailed>
}

/** The record `rkey` of the account, with its CID (the swap value of a later write). */
const getRecordIn = ({ agent, call, did }: Session) => (rkey: string) =>
  call(
    "getRecord",
    (signal) => agent.com.atproto.repo.getRecord({ repo: did, collection: WH_COLLECTION, rkey }, { signal })
  ).pipe(
    Effect.mapError((e) => (e.reason === "not_found" ? failed("not_found", `no webhook record ${rkey}`) : e)),
    Effect.flatMap((res) => {
      const cid = res.data.cid
      return cid === undefined
        ? Effect.fail(failed("invalid_response", "the PDS sent an invalid response to getRecord"))
        : Effect.succeed({ uri: res.data.uri, cid, value: res.data.value })
    })
  )

const createIn = ({ agent, allowInsecureDev, call, did }: Session) =>
  Effect.fn("Hooks.create")(function*(draft: Draft) {
    yield* checkDraft(draft, allowInsecureDev)
    const generated = draft.signing._tag === "Generate"
      ? yield* Effect.sync(SecretBox.generateToken)
      : PLACEHOLDER_SECRET
    const createdAt = new Date(yield* Clock.currentTimeMillis).toISOString()
    const { record } = yield* validateDraft(draft, did, createdAt, generated, allowInsecureDev)
    const written = yield* Option.match(draft.rkey, {
      onNone: () =>
        call(
          "createRecord",
          (signal) =>
            agent.com.atproto.repo.createRecord({ repo: did, collection: WH_COLLECTION, record: { ...record } }, {
              signal
            })
        ),
      onSome: (rkey) =>
        call("putRecord", (signal) =>
          agent.com.atproto.repo.putRecord(
            // swapRecord null: only if no record has this key (never replace one)
            { repo: did, collection: WH_COLLECTION, rkey, record: { ...record }, swapRecord: null },
            { signal }
          )).pipe(
            Effect.mapError((e) =>
              e.reason === "conflict" ? failed("exists", `a webhook record ${rkey} already exists; nothing written`) : e
            )
          )
    })
    return {
      did,
      uri: written.data.uri,
      rkey: rkeyOf(written.data.uri),
      cid: written.data.cid,
      secret: draft.signing._tag === "Generate" ? Option.some(Redacted.make(generated)) : Option.none()
    }
  })

const listIn = ({ agent, allowInsecureDev, call, did }: Session) => {
  const page = (limit: number, cursor: string | undefined, at = cursor === undefined ? {} : { cursor }) =>
    call(
      "listRecords",
      (s) => agent.com.atproto.repo.listRecords({ repo: did, collection: WH_COLLECTION, limit, ...at }, { signal: s })
    )
  return Effect.gen(function*() {
    const webhooks: Array<WebhookSummary> = []
    let cursor: string | undefined
    for (let n = 0; n < MAX_LIST_PAGES; n++) {
      const res = yield* page(LIST_PAGE_SIZE, cursor)
      const next = res.data.cursor
      if (next !== undefined && next === cursor) return { did, webhooks, truncated: false } // the last page again
      for (const r of res.data.records) webhooks.push(summarize(r, allowInsecureDev))
      if (next === undefined || res.data.records.length === 0) return { did, webhooks, truncated: false }
      cursor = next
    }
    // a PDS sends a cursor with every page that has records, the last one too: probe past it
    return { did, webhooks, truncated: (yield* page(1, cursor)).data.records.length > 0 }
  }).pipe(Effect.withSpan("Hooks.list"))
}

const setEnabledIn = (s: Session) => {
  const { agent, allowInsecureDev, call, did } = s
  const getRecord = getRecordIn(s)
  return Effect.fn("Hooks.setEnabled")(function*(rkey: string, enabled: boolean) {
    yield* checkRkey(rkey)
    const current = yield* getRecord(rkey)
    // unknown fields are kept as they are; only `enabled` changes
    const next: Record<string, unknown> = { ...current.value, enabled }
    const checked = validateWhRecord(next, { allowInsecureDev })
    if (Either.isLeft(checked)) {
      return yield* failed(
        "invalid_record",
        `webhook record ${rkey} is not valid for firehook (${checked.left}); nothing written (delete it and create it again)`
      )
    }
    if ((own(current.value, "enabled") !== false) === enabled) {
      return { uri: current.uri, rkey, enabled, changed: false, cid: current.cid }
    }
    const res = yield* call("putRecord", (signal) =>
      agent.com.atproto.repo.putRecord(
        { repo: did, collection: WH_COLLECTION, rkey, record: next, swapRecord: current.cid },
        { signal }
      ))
    return { uri: res.data.uri, rkey, enabled, changed: true, cid: res.data.cid }
  })
}

const removeIn = (s: Session) => {
  const { agent, call, did } = s
  const getRecord = getRecordIn(s)
  return Effect.fn("Hooks.remove")(function*(rkey: string) {
    yield* checkRkey(rkey)
    const current = yield* getRecord(rkey)
    yield* call(
      "deleteRecord",
      (signal) =>
        agent.com.atproto.repo.deleteRecord({ repo: did, collection: WH_COLLECTION, rkey, swapRecord: current.cid }, {
          signal
        })
    )
    return { uri: current.uri, rkey }
  })
}

/**
 * Signs in and returns the service; the session is deleted (best effort, bounded) and in-flight
 * requests are aborted when the scope closes.
 */
export const make = (conn: Connection, options: HooksOptions): Effect.Effect<HooksShape, HooksFailed, Scope.Scope> =>
  Effect.gen(function*() {
    const timeout = Duration.decode(options.callTimeout ?? DEFAULT_CALL_TIMEOUT)
    const seconds = Math.round(Duration.toMillis(timeout) / 100) / 10
    const allowInsecureDev = options.allowInsecureDev
    const host = new URL(conn.pds).host
    const api = yield* Effect.tryPromise({
      try: () => import("@atproto/api"),
      catch: () => failed("unreachable", "could not load @atproto/api")
    })
    // every request of this session is aborted when the scope closes (login accepts no signal)
    const controller = yield* Effect.acquireRelease(
      Effect.sync(() => new AbortController()),
      (c) => Effect.sync(() => c.abort())
    )
    const boundFetch = (input: Parameters<typeof fetch>[0], init?: RequestInit): Promise<Response> =>
      fetchNoRedirect(input, {
        ...init,
        signal: init?.signal ? AbortSignal.any([init.signal, controller.signal]) : controller.signal
      })
    const agent: AtpAgent = new api.AtpAgent({ service: conn.pds, fetch: boundFetch })

    const call = <A>(op: Operation, f: (signal: AbortSignal) => Promise<A>): Effect.Effect<A, HooksFailed> =>
      // interruptible even inside a finalizer, so the bound always holds
      Effect.interruptible(Effect.tryPromise({ try: f, catch: (e) => classify(op, host, e) })).pipe(
        Effect.timeoutFail({
          duration: timeout,
          onTimeout: () => failed("timeout", `the PDS at ${host} did not answer ${op} within ${seconds} s`)
        })
      )

    yield* call("login", () => agent.login({ identifier: conn.identifier, password: Redacted.value(conn.password) }))
    // the session is not kept: delete it on the way out (best effort, bounded)
    yield* Effect.addFinalizer(() =>
      call("logout", () => agent.logout()).pipe(Effect.timeout(LOGOUT_TIMEOUT), Effect.ignore)
    )
    const did = agent.session?.did
    if (did === undefined) return yield* failed("invalid_response", "the PDS sent an invalid response to login")
    // the access token goes to the PDS in the account's DID document: never over clear http
    if (!isSafeEndpoint(agent.pdsUrl)) return yield* failed("pds", "the account's PDS (DID document) is not https://")

    const session: Session = { agent, did, allowInsecureDev, call }
    // no `exp`: the PDS gives the token iat + 60 s by its own clock (an `exp` from this machine's
    // clock is refused when the clock is slow, and lives too long when it is fast)
    const serviceToken = (aud: string, lxm: string) =>
      call("getServiceAuth", (signal) => agent.com.atproto.server.getServiceAuth({ aud, lxm }, { signal })).pipe(
        Effect.map((res) => Redacted.make(res.data.token))
      )
    return {
      did,
      create: createIn(session),
      list: listIn(session),
      setEnabled: setEnabledIn(session),
      remove: removeIn(session),
      serviceToken
    } satisfies HooksShape
  })

/** The service for one signed-in session (see `make`). */
export const layer = (conn: Connection, options: HooksOptions): Layer.Layer<Hooks, HooksFailed> =>
  Layer.scoped(Hooks, make(conn, options))
