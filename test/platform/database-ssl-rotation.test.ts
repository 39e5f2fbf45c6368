/**
 * The certificate files named in `DATABASE_URL` (`sslrootcert`, `sslcert`, `sslkey`) are read for
 * each new connection, the pool's and the LISTEN connection's (DatabaseSsl.connectingClient): a
 * client certificate rotated on disk (cert-manager, Vault) or a renewed CA bundle is used by the
 * next connection, without a restart. Between 903f727 and this fix they were read once, at startup,
 * and every later connection used the files as they were then (once the startup certificate
 * expired, reconnects failed until a restart).
 *
 * A real PostgreSQL behind a TLS front of this process (PostgreSQL's SSLRequest answered `S`, TLS
 * with the server certificate of the moment, the client's certificate asked for and recorded, then
 * the bytes passed to the server in the clear). The rotation moves everything to another CA: the
 * server's certificate, the CA file, and the client's certificate and key; a connection made with
 * the startup files would refuse the new server certificate.
 */
import * as PgClient from "@effect/sql-pg/PgClient"
import * as SqlClient from "@effect/sql/SqlClient"
import { describe, expect, it } from "@effect/vitest"
import { Effect, Either, Exit, Fiber, Layer, Option, Redacted, Stream } from "effect"
import Fs from "node:fs"
import * as Net from "node:net"
import * as Os from "node:os"
import * as Path from "node:path"
import * as Tls from "node:tls"
import { afterAll, inject, vi } from "vitest"
import * as Database from "../../src/services/platform/Database.js"
import * as DatabaseSsl from "../../src/services/platform/DatabaseSsl.js"
import * as ErrorCode from "../../src/services/platform/ErrorCode.js"
import * as Db from "../support/db.js"
import { eventually } from "../support/eventually.js"
import { makeTestPki, type Pem } from "../support/testPki.js"

const pkiA = makeTestPki("rotation-a")
const pkiB = makeTestPki("rotation-b")
const SERVER_A = pkiA.signed("server-a", ["DNS:localhost", "IP:127.0.0.1"])
const SERVER_B = pkiB.signed("server-b", ["DNS:localhost", "IP:127.0.0.1"])
const CLIENT_A = pkiA.signed("client-a", ["DNS:client-a"])
const CLIENT_B = pkiB.signed("client-b", ["DNS:client-b"])
afterAll(() => {
  pkiA.remove()
  pkiB.remove()
})

const SSL_REQUEST = 80877103

interface TlsFront {
  readonly port: number
  /** the CN of the client certificate of each completed handshake, in order */
  readonly clients: () => ReadonlyArray<string>
  /** the certificate presented from the next handshake on */
  readonly present: (pem: Pem) => void
  /** close every connection (the pool's and the LISTEN connection's) */
  readonly dropAll: () => void
}

/** A TLS front on 127.0.0.1 for the PostgreSQL at `upstream`, for the scope. */
const tlsFront = (upstream: URL, first: Pem) =>
  Effect.acquireRelease(
    Effect.async<{ readonly front: TlsFront; readonly close: () => Promise<void> }>((resume) => {
      let context = Tls.createSecureContext({ key: first.key, cert: first.cert })
      const clients: Array<string> = []
      const sockets = new Set<Net.Socket>()
      const track = (s: Net.Socket) => {
        sockets.add(s)
        s.on("error", () => {})
        s.on("close", () => sockets.delete(s))
      }
      const server = Net.createServer((socket) => {
        track(socket)
        let head = Buffer.alloc(0)
        const onHead = (d: Buffer) => {
          head = Buffer.concat([head, d])
          if (head.length < 8) return
          socket.off("data", onHead)
          if (head.length !== 8 || head.readInt32BE(0) !== 8 || head.readInt32BE(4) !== SSL_REQUEST) {
            return void socket.destroy()
          }
          socket.write("S")
          const secure = new Tls.TLSSocket(socket, {
            isServer: true,
            secureContext: context,
            requestCert: true,
            // the test CA's leaves are for servers: the certificate is recorded, not judged
            rejectUnauthorized: false
          })
          track(secure)
          secure.on("secure", () => {
            const cn: unknown = secure.getPeerCertificate().subject?.CN
            clients.push(typeof cn === "string" ? cn : "")
            const up = Net.connect({ host: upstream.hostname, port: Number(upstream.port || 5432) })
            track(up)
            up.setTimeout(10_000, () => up.destroy())
            up.on("connect", () => up.setTimeout(0))
            up.on("close", () => secure.destroy())
            secure.on("close", () => up.destroy())
            secure.pipe(up)
            up.pipe(secure)
          })
        }
        socket.on("data", onHead)
      })
      server.listen(0, "127.0.0.1", () => {
        const address = server.address()
        const port = typeof address === "object" && address !== null ? address.port : 0
        resume(Effect.succeed({
          front: {
            port,
            clients: () => [...clients],
            present: (pem) => {
              context = Tls.createSecureContext({ key: pem.key, cert: pem.cert })
            },
            dropAll: () => {
              for (const s of sockets) s.destroy()
            }
          },
          close: () =>
            new Promise<void>((resolve) => {
              for (const s of sockets) s.destroy()
              server.close(() => resolve())
            })
        }))
      })
    }),
    ({ close }) => Effect.promise(close)
  ).pipe(Effect.map(({ front }) => front))

/** The files the URL names, in a directory of the scope, holding CA A's CA and client certificate. */
const certFiles = Effect.acquireRelease(
  Effect.sync(() => {
    const dir = Fs.mkdtempSync(Path.join(Os.tmpdir(), "firehook-ssl-rotation-"))
    const at = (name: string) => Path.join(dir, name)
    const files = { dir, ca: at("ca.pem"), cert: at("client.pem"), key: at("client.key") }
    const write = (ca: string, client: Pem) => {
      Fs.writeFileSync(files.ca, Fs.readFileSync(ca))
      Fs.writeFileSync(files.cert, client.cert)
      Fs.writeFileSync(files.key, client.key, { mode: 0o600 })
    }
    write(pkiA.caPath, CLIENT_A)
    return { ...files, write }
  }),
  ({ dir }) => Effect.sync(() => Fs.rmSync(dir, { recursive: true, force: true }))
)

/**
 * A migrated fresh database reached through a {@link tlsFront} presenting server A's certificate,
 * with `sslmode=verify-full` and the {@link certFiles} in the URL; the layer built (its pool's first
 * connection made with A's files).
 */
const setup = Effect.gen(function*() {
  const { url } = yield* Db.freshDatabaseWith(`TEMPLATE ${inject("pgTemplate")}`)
  const direct = new URL(Redacted.value(url))
  const front = yield* tlsFront(direct, SERVER_A)
  const files = yield* certFiles
  const viaFront = new URL(direct)
  viaFront.host = `localhost:${front.port}`
  viaFront.search = new URLSearchParams({
    sslmode: "verify-full",
    sslrootcert: files.ca,
    sslcert: files.cert,
    sslkey: files.key
  }).toString()
  const context = yield* Layer.build(Database.layerUrl(Redacted.make(viaFront.toString())))
  const sql = yield* Effect.provide(SqlClient.SqlClient, context)
  const pgClient = yield* Effect.provide(PgClient.PgClient, context)
  const rotate = () => {
    front.present(SERVER_B)
    files.write(pkiB.caPath, CLIENT_B)
  }
  return { sql, pgClient, front, files, rotate }
})

/** `SELECT 1` on the pool: `ok`, or the driver's code of its failure. */
const selectOne = (sql: SqlClient.SqlClient) =>
  sql`SELECT 1 AS one`.pipe(
    Effect.as("ok"),
    Effect.catchAll((e) => Effect.succeed(ErrorCode.codeOr(e)))
  )

/** How many times the {@link certFiles} were read while `effect` ran. */
const fileReads = <A, E, R>(files: { readonly dir: string }, effect: Effect.Effect<A, E, R>) =>
  Effect.acquireUseRelease(
    Effect.sync(() => vi.spyOn(Fs, "readFileSync")),
    (spy) =>
      Effect.map(effect, (a) => ({
        a,
        reads: spy.mock.calls.filter(([p]) => typeof p === "string" && p.startsWith(files.dir)).length
      })),
    (spy) => Effect.sync(() => spy.mockRestore())
  )

describe("DATABASE_URL's certificate files are read for each new connection", () => {
  it.scopedLive("the pool's next connection uses the rotated CA and client certificate", () =>
    Effect.gen(function*() {
      const { sql, front, files, rotate } = yield* setup
      expect(yield* selectOne(sql)).toBe("ok")
      expect(new Set(front.clients())).toEqual(new Set(["client-a"]))

      rotate()
      front.dropAll()
      const before = front.clients().length
      // the pool drops the connections it sees closed, then makes a new one for the query
      const reconnect = yield* fileReads(
        files,
        eventually(Effect.map(selectOne(sql), (r) => r === "ok"), "a query on a new connection after the rotation")
      )
      const after = front.clients().slice(before)
      expect(after.length).toBeGreaterThan(0)
      expect(new Set(after)).toEqual(new Set(["client-b"]))
      // the three files, for each connection made
      expect(reconnect.reads).toBeGreaterThanOrEqual(3)
      expect(reconnect.reads % 3).toBe(0)

      // read per connection, not per query: queries on the open connection read nothing
      const { a, reads } = yield* fileReads(files, Effect.all(Array.from({ length: 10 }, () => selectOne(sql))))
      expect(a).toEqual(Array.from({ length: 10 }, () => "ok"))
      expect(reads).toBe(0)
    }), { timeout: 60_000 })

  it.scopedLive("the LISTEN connection opened after the rotation uses the rotated files", () =>
    Effect.gen(function*() {
      const { sql, pgClient, front, rotate } = yield* setup
      rotate()
      const before = front.clients().length
      const fiber = yield* Effect.forkScoped(Stream.runHead(pgClient.listen("fh_rotation")))
      yield* eventually(
        Effect.map(
          sql<{ n: number }>`
          SELECT count(*)::int AS n FROM pg_stat_activity
          WHERE datname = current_database() AND state = 'idle' AND query = 'LISTEN "fh_rotation"'`,
          (rows) => (rows[0]?.n ?? 0) > 0
        ).pipe(Effect.orDie),
        "the LISTEN in place",
        5_000
      )
      expect(front.clients().slice(before)).toContain("client-b")
      yield* sql`SELECT pg_notify('fh_rotation', 'after rotation')`
      expect(yield* Fiber.join(fiber)).toEqual(Option.some("after rotation"))
    }), { timeout: 60_000 })

  it.scopedLive(
    "files that cannot be read later: a connection fails with ssl_files_unreadable (no path), and works once they are back",
    () =>
      Effect.gen(function*() {
        const { sql, pgClient, front, files } = yield* setup
        const key = Fs.readFileSync(files.key)
        Fs.rmSync(files.key)
        front.dropAll()
        yield* eventually(
          Effect.map(selectOne(sql), (r) => r === DatabaseSsl.FILES_UNREADABLE),
          "a pool connection failing with ssl_files_unreadable"
        )
        const failure = yield* Effect.flip(sql`SELECT 1`)
        expect(ErrorCode.driverCode(failure)).toBe(DatabaseSsl.FILES_UNREADABLE)
        const listened = yield* Effect.either(Stream.runHead(pgClient.listen("fh_rotation_gone")))
        expect(Either.map(Either.flip(listened), ErrorCode.driverCode)).toEqual(
          Either.right(DatabaseSsl.FILES_UNREADABLE)
        )
        // nothing of the file system's or the parser's text (the path, the directory) in what is reported
        const texts = [failure, Either.isLeft(listened) ? listened.left : undefined].map((e) =>
          `${JSON.stringify(e)} ${String(e)} ${String(Reflect.get(Object(Reflect.get(Object(e), "cause")), "message"))}`
        )
        for (const text of texts) {
          expect(text).not.toContain(files.dir)
          expect(text).not.toContain("ENOENT")
        }

        Fs.writeFileSync(files.key, key, { mode: 0o600 })
        yield* eventually(Effect.map(selectOne(sql), (r) => r === "ok"), "a query once the key is back")
        const exit = yield* Effect.exit(sql`SELECT 1`)
        expect(Exit.isSuccess(exit)).toBe(true)
      }),
    { timeout: 60_000 }
  )
})
