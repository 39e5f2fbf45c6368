/**
 * The Redis publisher over TLS, in a process of its own: `bun test/support/publisher-tls-smoke.ts`
 * (the production runtime) or `node --import tsx …`. Node and Bun read NODE_EXTRA_CA_CERTS only at
 * start, so test/delivery/publisher-tls.test.ts runs this with it naming a CA of its own, and
 * SMOKE_DIR naming the directory that holds the certificates (`<label>.key`, `<label>.pem`):
 * `good` (signed by that CA for `localhost` and 127.0.0.1), `other` (signed by it for another name
 * only) and `self` (self-signed for `localhost` and 127.0.0.1).
 *
 * Prints one JSON object: for each case, what the connection came to (`ok`, or the error's kind and
 * code) and what the fake Redis saw (commands, the SNI of each ClientHello, TCP connections). The
 * test asserts on it; this script checks nothing itself.
 */
import { Duration, Effect, Either, Redacted } from "effect"
import { readFileSync } from "node:fs"
import * as Path from "node:path"
import * as Publisher from "../../src/services/delivery/Publisher.js"
import * as Health from "../../src/services/platform/Health.js"
import * as Lifecycle from "../../src/services/platform/Lifecycle.js"
import { auditEvent } from "./auditEvent.js"
import { fakeRedis } from "./fakeRedis.js"

const dir = process.env["SMOKE_DIR"] ?? ""
const pem = (label: string) => ({
  key: readFileSync(Path.join(dir, `${label}.key`), "utf8"),
  cert: readFileSync(Path.join(dir, `${label}.pem`), "utf8")
})

const answer = (c: ReadonlyArray<string>) => (c[0] === "PUBLISH" ? ":1\r\n" : "+OK\r\n")
const bound = Duration.seconds(10)

interface Seen {
  readonly outcome: string
  readonly commands: ReadonlyArray<ReadonlyArray<string>>
  readonly servernames: ReadonlyArray<string>
  readonly accepted: number
  readonly connections: number
}

/**
 * Connect (handshake: AUTH, SELECT), then PUBLISH once on success; on failure, wait until the
 * server has seen the handshake end before reading what it received.
 */
const viaConnect = (label: string | "plain", url: (port: number) => string) =>
  Effect.scoped(Effect.gen(function*() {
    const fake = yield* fakeRedis(answer, label === "plain" ? {} : { tls: pem(label) })
    const target = Either.getOrThrow(Publisher.parseRedisUrl(url(fake.port)))
    const r = yield* Effect.either(
      Effect.scoped(Effect.flatMap(
        Publisher.connect(target, { connectTimeout: label === "plain" ? "500 millis" : "5 seconds" }),
        (c) => c.command(["PUBLISH", "ch", "m"])
      ))
    )
    const outcome = Either.isRight(r) ? "ok" : `${r.left.kind}:${r.left.code}`
    if (Either.isLeft(r) && label !== "plain") {
      yield* fake.awaitState((s) => s.tlsErrors > 0 || s.closed > 0).pipe(Effect.timeout(bound))
    }
    const s = yield* fake.state
    return { outcome, ...s } satisfies Seen
  }))

/** The whole publisher (its layer's path): an audit event published over TLS. */
const viaPublisher = (url: (port: number) => string) =>
  Effect.scoped(Effect.gen(function*() {
    const fake = yield* fakeRedis(answer, { tls: pem("good") })
    const lifecycle = yield* Lifecycle.make({ shutdownTimeout: "5 seconds" })
    const health = yield* Health.make.pipe(Effect.provideService(Lifecycle.Lifecycle, lifecycle))
    const p = yield* Publisher.make({ url: Redacted.make(url(fake.port)), channel: "webhook:events" }).pipe(
      Effect.provideService(Health.Health, health)
    )
    yield* p.awaitStats((x) => x.connected).pipe(Effect.timeout(bound))
    yield* p.publish(auditEvent())
    const stats = yield* p.awaitStats((x) => x.published + x.dropped > 0).pipe(Effect.timeout(bound))
    const s = yield* fake.state
    return { outcome: stats.published === 1 ? "published" : "dropped", ...s } satisfies Seen
  }))

const program = Effect.gen(function*() {
  const ip = (port: number) => `rediss://:SECRET@127.0.0.1:${port}/2`
  const name = (port: number) => `rediss://user:SECRET@localhost:${port}`
  return {
    runtime: "Bun" in globalThis ? "bun" : "node",
    goodIp: yield* viaConnect("good", ip),
    goodName: yield* viaConnect("good", name),
    otherIp: yield* viaConnect("other", ip),
    otherName: yield* viaConnect("other", name),
    selfIp: yield* viaConnect("self", ip),
    selfName: yield* viaConnect("self", name),
    plain: yield* viaConnect("plain", name),
    publisher: yield* viaPublisher(name)
  }
})

Effect.runPromise(program).then(
  (out) => {
    process.stdout.write(`${JSON.stringify(out)}\n`)
    process.exit(0)
  },
  (e: unknown) => {
    process.stderr.write(`${e instanceof Error ? e.message : String(e)}\n`)
    process.exit(1)
  }
)
