/**
 * `Tx.layerSql` bounds a whole transaction by TX_TIMEOUT (SPEC §7), BEGIN and COMMIT/ROLLBACK
 * included. `@effect/sql` runs those uninterruptibly, so at the bound the transaction's connection
 * is ended: a server that stopped answering (a frozen VM, a partition: no RST, the socket stays up)
 * cannot hold the caller past TX_TIMEOUT, and the ended connection is not handed out again.
 *
 * The database is reached through a TCP proxy that can go silent on the connections it holds
 * (bytes are swallowed, nothing is closed); connections made after that are forwarded.
 */
import * as SqlClient from "@effect/sql/SqlClient"
import { describe, expect, it } from "@effect/vitest"
import { Context, Duration, Effect, Exit, Fiber, Layer, Option, Redacted, TestClock, TestServices } from "effect"
import net from "node:net"
import { inject } from "vitest"
import * as Database from "../../src/services/platform/Database.js"
import { StoreError, Tx, TX_TIMEOUT } from "../../src/services/platform/Persistence.js"
import * as Db from "../support/db.js"

interface Proxy {
  readonly port: number
  /** The connections open now stop forwarding in both directions (nothing is closed). */
  readonly silence: () => void
  /** Bytes a silenced connection received from its client and swallowed. */
  readonly swallowed: () => number
  /** Destroys every connection open now. */
  readonly cut: () => void
}

const silentProxy = (target: URL) =>
  Effect.acquireRelease(
    Effect.promise(() =>
      new Promise<{ server: net.Server; sockets: Set<net.Socket>; proxy: Proxy }>((resolve) => {
        const sockets = new Set<net.Socket>()
        const silenced = new WeakSet<net.Socket>()
        let swallowed = 0
        const server = net.createServer((client) => {
          const upstream = net.connect(Number(target.port || 5432), target.hostname)
          sockets.add(client).add(upstream)
          client.on("data", (chunk: Buffer) => {
            if (silenced.has(client)) swallowed += chunk.length
            else upstream.write(chunk)
          })
          upstream.on("data", (chunk: Buffer) => {
            if (!silenced.has(client)) client.write(chunk)
          })
          const end = () => {
            client.destroy()
            upstream.destroy()
            sockets.delete(client)
            sockets.delete(upstream)
          }
          client.on("close", end).on("error", end)
          upstream.on("close", end).on("error", end)
        })
        server.listen(0, "127.0.0.1", () => {
          const address = server.address()
          const port = typeof address === "object" && address !== null ? address.port : 0
          resolve({
            server,
            sockets,
            proxy: {
              port,
              silence: () => {
                for (const s of sockets) silenced.add(s)
              },
              swallowed: () => swallowed,
              cut: () => {
                for (const s of sockets) s.destroy()
              }
            }
          })
        })
      })
    ),
    ({ server, sockets }) =>
      Effect.promise(() =>
        new Promise<void>((resolve) => {
          for (const s of sockets) s.destroy()
          server.close(() => resolve())
        })
      )
  ).pipe(Effect.map(({ proxy }) => proxy))

/** A migrated fresh database behind a proxy, with a pool of ONE connection: Tx + SqlClient. */
const setup = Effect.gen(function*() {
  const { url } = yield* Db.freshDatabaseWith(`TEMPLATE ${inject("pgTemplate")}`)
  const target = new URL(Redacted.value(url))
  const proxy = yield* silentProxy(target)
  const viaProxy = new URL(Redacted.value(url))
  viaProxy.host = `127.0.0.1:${proxy.port}`
  const ctx = yield* Layer.build(
    Tx.layerSql.pipe(
      Layer.provideMerge(Database.layerUrl(Redacted.make(viaProxy.toString()), { maxConnections: 1 }))
    )
  )
  return { proxy, tx: Context.get(ctx, Tx), sql: Context.get(ctx, SqlClient.SqlClient) }
})

const live = <A, E, R>(eff: Effect.Effect<A, E, R>) => TestServices.provideLive(eff)

/** Bounded (10 s of live time): until `done` holds, polling every 5 ms. */
const until = (what: string, done: () => boolean) =>
  Effect.gen(function*() {
    for (let i = 0; i < 2_000 && !done(); i++) yield* live(Effect.sleep("5 millis"))
    if (!done()) return yield* Effect.dieMessage(`timed out waiting for ${what}`)
  })

const settle = Effect.gen(function*() {
  for (let i = 0; i < 100; i++) yield* Effect.yieldNow()
})

/** Until the transaction's timer and its watchdog's are both set on the TestClock. */
const timersSet = Effect.gen(function*() {
  for (let i = 0; i < 2_000; i++) {
    if ((yield* TestClock.sleeps()).length >= 2) return
    yield* live(Effect.sleep("5 millis"))
  }
  return yield* Effect.dieMessage("the transaction's timers were never set")
})

const backendPid = (sql: SqlClient.SqlClient) =>
  Effect.map(sql<{ pid: number }>`SELECT pg_backend_pid() AS pid`, (rows) => rows[0]?.pid ?? -1)

/**
 * Moves the TestClock to TX_TIMEOUT (checking that nothing ended 1 ms before), then past the
 * driver's 5 s bound on cancelling an interrupted statement, and returns how the transaction ended
 * (None: it had not ended 10 s of live time later; then the proxy's connections are cut, so that
 * the test ends with that outcome instead of hanging).
 */
const expire = <A, E>(proxy: Proxy, fiber: Fiber.RuntimeFiber<A, E>) =>
  Effect.gen(function*() {
    yield* TestClock.adjust(Duration.subtract(Duration.decode(TX_TIMEOUT), Duration.millis(1)))
    yield* settle
    expect(fiber.unsafePoll()).toBeNull()
    yield* TestClock.adjust("1 millis")
    yield* settle
    yield* TestClock.adjust("5 seconds")
    const outcome = yield* live(Effect.option(Effect.timeout(Fiber.await(fiber), "10 seconds")))
    if (Option.isNone(outcome)) {
      proxy.cut()
      yield* live(Effect.ignore(Effect.timeout(Fiber.await(fiber), "10 seconds")))
    }
    return outcome
  })

const timedOut = Option.some(Exit.fail(new StoreError({ op: "transaction", code: "timeout" })))

/** After the ended connection: the pool of one makes a new one, and transactions work again. */
const poolWorksWithout = (
  tx: Context.Tag.Service<Tx>,
  sql: SqlClient.SqlClient,
  endedPid: number
) =>
  Effect.gen(function*() {
    const pid = yield* live(Effect.timeout(tx.withTransaction(backendPid(sql)), "10 seconds"))
    expect(pid).not.toBe(endedPid)
    expect(pid).toBeGreaterThan(0)
  })

describe("Tx.layerSql: TX_TIMEOUT bounds a transaction whose server stops answering", () => {
  it.scoped(
    "a COMMIT that gets no answer: the caller fails with StoreError(transaction, timeout) at TX_TIMEOUT",
    () =>
      Effect.gen(function*() {
        const { proxy, sql, tx } = yield* setup
        let pid = -1
        const fiber = yield* Effect.fork(tx.withTransaction(
          Effect.map(backendPid(sql), (p) => {
            pid = p
            // the work is done; the server goes silent before the COMMIT
            proxy.silence()
          })
        ))
        yield* until("the COMMIT to be sent", () => proxy.swallowed() > 0)
        yield* timersSet
        expect(yield* expire(proxy, fiber)).toEqual(timedOut)
        // the ended connection was dropped by the pool (of one), not handed out again
        yield* poolWorksWithout(tx, sql, pid)
      }),
    60_000
  )

  it.scoped(
    "a statement that gets no answer: its ROLLBACK does not hold the caller past TX_TIMEOUT",
    () =>
      Effect.gen(function*() {
        const { proxy, sql, tx } = yield* setup
        let pid = -1
        const fiber = yield* Effect.fork(tx.withTransaction(
          Effect.flatMap(backendPid(sql), (p) => {
            pid = p
            proxy.silence()
            return sql`SELECT 2`
          })
        ))
        yield* until("the statement to be sent", () => proxy.swallowed() > 0)
        yield* timersSet
        expect(yield* expire(proxy, fiber)).toEqual(timedOut)
        yield* poolWorksWithout(tx, sql, pid)
      }),
    60_000
  )

  it.scoped(
    "a BEGIN on a pooled connection that went silent while idle fails at TX_TIMEOUT",
    () =>
      Effect.gen(function*() {
        const { proxy, sql, tx } = yield* setup
        const pid = yield* tx.withTransaction(backendPid(sql))
        // the pool's only connection is idle; the server behind it goes silent
        proxy.silence()
        const fiber = yield* Effect.fork(tx.withTransaction(sql`SELECT 1`))
        yield* until("the BEGIN to be sent", () => proxy.swallowed() > 0)
        yield* timersSet
        expect(yield* expire(proxy, fiber)).toEqual(timedOut)
        yield* poolWorksWithout(tx, sql, pid)
      }),
    60_000
  )

  it.scoped(
    "a transaction that answers commits, or rolls back, and its connection stays in the pool",
    () =>
      Effect.gen(function*() {
        const { sql, tx } = yield* setup
        yield* sql`CREATE TABLE tx_probe (n int NOT NULL)`
        const pid = yield* tx.withTransaction(Effect.zipRight(sql`INSERT INTO tx_probe VALUES (1)`, backendPid(sql)))
        // failed: rolled back
        const failed = yield* Effect.exit(tx.withTransaction(
          Effect.zipRight(sql`INSERT INTO tx_probe VALUES (2)`, Effect.fail("no" as const))
        ))
        expect(failed).toEqual(Exit.fail("no"))
        // nested: a SAVEPOINT of the enclosing transaction; only the inner one is undone
        yield* tx.withTransaction(Effect.zipRight(
          sql`INSERT INTO tx_probe VALUES (3)`,
          Effect.ignore(tx.withTransaction(Effect.zipRight(sql`INSERT INTO tx_probe VALUES (4)`, Effect.fail("inner"))))
        ))
        const rows = yield* sql<{ n: number }>`SELECT n FROM tx_probe ORDER BY n`
        expect(rows.map((r) => r.n)).toEqual([1, 3])
        // long past the bound: no watchdog is left to end the connection, which the pool hands out again
        yield* TestClock.adjust(Duration.sum(Duration.decode(TX_TIMEOUT), Duration.minutes(1)))
        yield* settle
        expect(yield* tx.withTransaction(backendPid(sql))).toBe(pid)
      }),
    60_000
  )
})
