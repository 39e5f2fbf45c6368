/**
 * The owners' API under test: real keypairs (`@atcute/crypto`), their DID documents on a fake PLC
 * directory (a real HTTP server, test/support/fakeAtproto.ts), tokens minted with the library's own
 * creator or forged with any header and payload, and the API served on a real Node HTTP server
 * (`NodeHttpServer.layerTest`) over a fresh PostgreSQL database with the real Identity and Secrets.
 */
import type { PrivateKey } from "@atcute/crypto"
import { P256PrivateKeyExportable, Secp256k1PrivateKeyExportable } from "@atcute/crypto"
import type { Did, Nsid } from "@atcute/lexicons"
import { createServiceJwt } from "@atcute/xrpc-server/auth"
import { type LexiconDoc, parseLexiconDoc } from "@atproto/lexicon"
import * as NodeHttpServer from "@effect/platform-node/NodeHttpServer"
import * as HttpClient from "@effect/platform/HttpClient"
import * as HttpClientRequest from "@effect/platform/HttpClientRequest"
import * as HttpServer from "@effect/platform/HttpServer"
import type * as PgClient from "@effect/sql-pg/PgClient"
import type * as SqlClient from "@effect/sql/SqlClient"
import { Clock, Effect, Layer, Logger, Redacted } from "effect"
import { randomBytes } from "node:crypto"
import * as Fs from "node:fs"
import * as Http from "node:http"
import * as Path from "node:path"
import pg from "pg"
import { expect } from "vitest"
import * as Api from "../../src/services/api/Api.js"
import type { MethodTable } from "../../src/services/api/Methods.js"
import * as TailHub from "../../src/services/api/Tail.js"
import * as DeliveryOutcomes from "../../src/services/delivery/DeliveryOutcomes.js"
import * as Config from "../../src/services/platform/Config.js"
import * as Database from "../../src/services/platform/Database.js"
import * as Health from "../../src/services/platform/Health.js"
import { SafeHttp } from "../../src/services/platform/http/SafeHttp.js"
import * as Lifecycle from "../../src/services/platform/Lifecycle.js"
import * as Identity from "../../src/services/reconciliation/Identity.js"
import * as Db from "../support/db.js"
import { fakePlc, type FakeServer } from "../support/fakeAtproto.js"
import { ROOT } from "../support/proc.js"
import { testConfig } from "../support/stack.js"

export const SERVICE_DID = "did:web:firehook.test"
export const KEY = randomBytes(32).toString("base64")

const B32 = "abcdefghijklmnopqrstuvwxyz234567"
/** A fresh did:plc. */
export const newDid = (): string => "did:plc:" + Array.from(randomBytes(24), (b) => B32[b % 32]).join("")

export interface Owner {
  readonly did: string
  readonly key: PrivateKey
}

/** DID documents served by the fake PLC (shared by reference: add owners at any time). */
export const docs = new Map<string, unknown>()

export const didDocument = (did: string, multikey: string) => ({
  "@context": ["https://www.w3.org/ns/did/v1", "https://w3id.org/security/multikey/v1"],
  id: did,
  alsoKnownAs: ["at://someone.test"],
  verificationMethod: [{ id: `${did}#atproto`, type: "Multikey", controller: did, publicKeyMultibase: multikey }],
  service: [{ id: "#atproto_pds", type: "AtprotoPersonalDataServer", serviceEndpoint: "https://pds.example" }]
})

export const keypair = (kind: "k256" | "p256" = "k256"): Effect.Effect<PrivateKey & { multikey: string }> =>
  Effect.promise(async () => {
    const key = kind === "k256"
      ? await Secp256k1PrivateKeyExportable.createKeypair()
      : await P256PrivateKeyExportable.createKeypair()
    return Object.assign(key, { multikey: await key.exportPublicKey("multikey") })
  })

/** A new owner whose DID document (with its key) the fake PLC serves. */
export const newOwner = (kind: "k256" | "p256" = "k256"): Effect.Effect<Owner> =>
  Effect.map(keypair(kind), (key) => {
    const did = newDid()
    docs.set(did, didDocument(did, key.multikey))
    return { did, key }
  })

/**
 * A genuine token of `owner` for `lxm` (the library's own creator: typ JWT, a fresh jti), issued
 * at the Effect Clock's time (under TestClock, the service's time; tests set it to the wall clock,
 * which the verifier library reads).
 */
export const mint = (
  owner: Owner,
  lxm: string,
  options: { readonly aud?: string; readonly expiresIn?: number; readonly issuedAt?: number } = {}
): Effect.Effect<string> =>
  Effect.flatMap(Clock.currentTimeMillis, (now) =>
    Effect.promise(() =>
      createServiceJwt({
        keypair: owner.key,
        issuer: owner.did as Did,
        audience: (options.aud ?? SERVICE_DID) as Did,
        lxm: lxm as Nsid,
        issuedAt: options.issuedAt ?? Math.floor(now / 1000),
        ...(options.expiresIn === undefined ? {} : { expiresIn: options.expiresIn })
      })
    ))

const b64 = (v: unknown) => Buffer.from(JSON.stringify(v), "utf8").toString("base64url")

/** A token with any header and payload, signed by `key`. */
export const forge = (key: PrivateKey, header: object, payload: object): Effect.Effect<string> =>
  Effect.promise(async () => {
    const message = `${b64(header)}.${b64(payload)}`
    const sig = await key.sign(new TextEncoder().encode(message))
    return `${message}.${Buffer.from(sig).toString("base64url")}`
  })

/** The claims of a genuine token of `owner` for `lxm`, now (wall clock: the library reads it). */
export const claims = (owner: Owner, lxm: string, extra: object = {}) => {
  const now = Math.floor(Date.now() / 1000)
  return {
    iss: owner.did,
    aud: SERVICE_DID,
    lxm,
    iat: now,
    exp: now + 60,
    jti: randomBytes(12).toString("hex"),
    ...extra
  }
}

// ---------------------------------------------------------------------------------------------
// The API on a real server

export interface ApiTestOptions {
  readonly env?: Record<string, string>
  readonly methods?: MethodTable<Api.ServedRequirements>
  readonly api?: Api.ApiOptions
  readonly tail?: TailHub.TailOptions
  /**
   * Session defaults of the fresh database (`ALTER DATABASE … SET name = 'value'`, before anything
   * connects to it): `{ DateStyle: "SQL, DMY" }` …
   */
  readonly databaseSettings?: Record<string, string>
}

/** A fresh migrated database whose sessions start with `settings`. */
const databaseWith = (settings: Record<string, string>) =>
  Layer.unwrapScoped(Effect.gen(function*() {
    const { name, url } = yield* Db.freshDatabase
    yield* Effect.promise(async () => {
      const client = new pg.Client({ connectionString: Redacted.value(url) })
      await client.connect()
      try {
        for (const [k, v] of Object.entries(settings)) {
          await client.query(`ALTER DATABASE ${name} SET ${k} = ${client.escapeLiteral(v)}`)
        }
      } finally {
        await client.end()
      }
    })
    return Database.layerUrl(url)
  }))

/** What {@link apiLayerWith}'s extra services may use: the API's database, configuration and core. */
export type CoreServices =
  | Config.FirehookConfig
  | SqlClient.SqlClient
  | PgClient.PgClient
  | Health.Health
  | Lifecycle.Lifecycle

/** The fake PLC, shared by every API test layer of a file. */
export class Plc extends Effect.Tag("test/Plc")<Plc, FakeServer>() {}

/**
 * The API (its methods over their real stores on a fresh database, the real Identity over the
 * SSRF-safe transport in insecure development mode to the fake PLC) served on a Node test server,
 * with health and the HttpClient of the server.
 */
export const apiLayer = (options: ApiTestOptions = {}) => apiLayerWith(Layer.empty, options)

/** {@link apiLayer} with `extra` services over the same database and configuration (the intake's processor …). */
export const apiLayerWith = <A, E>(extra: Layer.Layer<A, E, CoreServices>, options: ApiTestOptions = {}) =>
  Layer.unwrapScoped(
    Effect.gen(function*() {
      const plc = yield* fakePlc(docs)
      const config = testConfig({
        WEBHOOK_ALLOW_INSECURE_DEV: "1",
        PLC_DIRECTORY_URL: plc.url,
        SERVICE_DID,
        WEBHOOK_SECRET_ENCRYPTION_KEY: KEY,
        ...options.env
      })
      const core = Layer.mergeAll(
        Config.layerValue(config),
        Health.layer.pipe(Layer.provideMerge(Lifecycle.layer({ shutdownTimeout: "5 seconds" }))),
        options.databaseSettings === undefined ? Db.layer() : databaseWith(options.databaseSettings)
      )
      const identity = Identity.layer().pipe(
        Layer.provide(SafeHttp.layerDefault({ allowInsecureDev: true, allowCidrs: [] }))
      )
      const tail = TailHub.layer(options.tail).pipe(Layer.provideMerge(DeliveryOutcomes.layerMemory))
      const api = Api.layer(options.methods ?? Api.SERVED_METHODS, options.api).pipe(
        Layer.provideMerge(Layer.mergeAll(Api.methodsLayerSql, identity, tail))
      )
      return Api.serve(NodeHttpServer.layerTest).pipe(
        Layer.provideMerge(api),
        Layer.provideMerge(extra.pipe(Layer.provideMerge(core))),
        Layer.merge(Layer.succeed(Plc, plc))
      )
    })
  )

export interface Answer {
  readonly status: number
  readonly body: { readonly [k: string]: unknown }
  readonly text: string
  readonly headers: { readonly [k: string]: string }
}

export interface CallOptions {
  readonly token?: string
  readonly body?: unknown
  /** raw body bytes (as given) */
  readonly raw?: Uint8Array
  readonly contentType?: string
  readonly query?: string
  readonly method?: "GET" | "POST" | "PUT"
  readonly headers?: Record<string, string>
}

/** Call `/xrpc/<nsid>` (POST when there is a body). */
export const call = (nsid: string, options: CallOptions = {}) =>
  Effect.gen(function*() {
    const client = yield* HttpClient.HttpClient
    const hasBody = options.body !== undefined || options.raw !== undefined
    const method = options.method ?? (hasBody ? "POST" : "GET")
    const url = `/xrpc/${nsid}${options.query === undefined ? "" : `?${options.query}`}`
    let req = HttpClientRequest.make(method)(url)
    if (options.token !== undefined) req = HttpClientRequest.setHeader(req, "authorization", `Bearer ${options.token}`)
    for (const [k, v] of Object.entries(options.headers ?? {})) req = HttpClientRequest.setHeader(req, k, v)
    if (options.raw !== undefined) {
      req = HttpClientRequest.bodyUint8Array(req, options.raw, options.contentType ?? "application/json")
    } else if (options.body !== undefined) {
      const bytes = new TextEncoder().encode(JSON.stringify(options.body))
      req = HttpClientRequest.bodyUint8Array(req, bytes, options.contentType ?? "application/json")
    }
    const res = yield* client.execute(req)
    const text = yield* res.text
    let body: { readonly [k: string]: unknown } = {}
    try {
      body = JSON.parse(text) as typeof body
    } catch {
      body = {}
    }
    return { status: res.status, body, text, headers: res.headers } satisfies Answer
  }).pipe(Effect.scoped, Effect.orDie)

/** A genuine call of `owner`. */
export const callAs = (owner: Owner, nsid: string, options: Omit<CallOptions, "token"> = {}) =>
  Effect.flatMap(mint(owner, nsid), (token) => call(nsid, { ...options, token }))

/** The listening address of the test server. */
export const serverPort = Effect.map(
  HttpServer.HttpServer,
  (s) => (s.address._tag === "TcpAddress" ? s.address.port : 0)
)

/**
 * A POST whose body never completes: headers announce `declared` bytes, `sent` of them are written
 * and the request is left open. Resolves with the status and body if the server answers without
 * waiting for the rest (it never reads it), or `"no answer"` after `waitMs`.
 */
export const unfinishedPost = (
  port: number,
  nsid: string,
  headers: Record<string, string>,
  options: { readonly declared?: number; readonly sent?: string; readonly waitMs?: number } = {}
) =>
  Effect.async<{ status: number; body: string } | "no answer">((resume) => {
    const req = Http.request({
      host: "127.0.0.1",
      port,
      method: "POST",
      path: `/xrpc/${nsid}`,
      headers: {
        "content-type": "application/json",
        "content-length": String(options.declared ?? 10_000),
        ...headers
      }
    })
    const timer = setTimeout(() => {
      req.destroy()
      resume(Effect.succeed("no answer"))
    }, options.waitMs ?? 3000)
    req.on("response", (res) => {
      let body = ""
      res.on("data", (d: Buffer) => (body += d.toString("utf8")))
      res.on("end", () => {
        clearTimeout(timer)
        req.destroy()
        resume(Effect.succeed({ status: res.statusCode ?? 0, body }))
      })
    })
    req.on("error", () => {})
    req.write(options.sent ?? "{\"name\":")
    return Effect.sync(() => {
      clearTimeout(timer)
      req.destroy()
    })
  })

export const healthApi = Effect.flatMap(Health.Health, (h) => h.report).pipe(
  Effect.map((r) => r.body["api"])
)

// ---------------------------------------------------------------------------------------------
// Lexicons

const LEXICONS = Path.join(ROOT, "lexicons")

const walk = (d: string): Array<string> =>
  Fs.readdirSync(d, { withFileTypes: true }).flatMap((e) =>
    e.isDirectory() ? walk(Path.join(d, e.name)) : e.name.endsWith(".json") ? [Path.join(d, e.name)] : []
  )

/** Every lexicon document in `lexicons/`, parsed by atproto's own schema of lexicon documents. */
export const lexiconDocs = (): Array<LexiconDoc> =>
  walk(LEXICONS).map((file) => {
    const doc = parseLexiconDoc(JSON.parse(Fs.readFileSync(file, "utf8")))
    // the file's path is its NSID
    expect(Path.relative(LEXICONS, file).replace(/\.json$/, "").split(Path.sep).join(".")).toBe(doc.id)
    return doc
  })

/** A logger that keeps every line's level and message (`lines`), to count what a test logged. */
export const captureLogs = () => {
  const lines: Array<{ level: string; message: string }> = []
  const capture = Logger.make(({ logLevel, message }) =>
    void lines.push({
      level: logLevel.label,
      message: Array.isArray(message) ? message.join(" ") : String(message)
    })
  )
  return { lines, capture }
}
