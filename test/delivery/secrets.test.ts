/**
 * Server-managed secrets (SPEC §1.3) on real PostgreSQL: tokens shown once and stored only as
 * envelopes, encryption-key rotation, caller-token rules, one generic resolve failure, errors that
 * never carry a token, and the short resolve cache.
 */
import * as SqlClient from "@effect/sql/SqlClient"
import { describe, expect, it } from "@effect/vitest"
import { Cause, Deferred, Effect, Either, Exit, Fiber, Layer, Option, Redacted, TestClock } from "effect"
import { randomBytes } from "node:crypto"
import * as SecretBox from "../../src/services/delivery/SecretBox.js"
import {
  keyringFromConfig,
  make as makeSecrets,
  makeMemoryStore,
  Secrets,
  SecretsError,
  type SecretsStoreShape
} from "../../src/services/delivery/Secrets.js"
import * as Config from "../../src/services/platform/Config.js"
import * as Db from "../support/db.js"
import { plc, testConfig } from "../support/stack.js"

const ALICE = plc(1)
const BOB = plc(2)
const TOKEN = /^whsec_[A-Za-z0-9+/]{43}=$/

const newKey = (): string => randomBytes(32).toString("base64")
const keyring = (current: string | undefined, previous: ReadonlyArray<string> = []): SecretBox.Keyring => {
  const parse = (k: string) => Either.getOrThrow(SecretBox.parseKey(k))
  return Either.getOrThrow(
    SecretBox.makeKeyring(current === undefined ? undefined : parse(current), previous.map(parse))
  )
}

/** The configured layer (keyring from the environment), on the test database. */
const configured = (env: Record<string, string>) =>
  Secrets.layerSql.pipe(Layer.provide(Config.layerValue(testConfig(env))))

const envelopeOf = (owner: string, name: string) =>
  Effect.flatMap(
    SqlClient.SqlClient,
    (sql) =>
      sql<{ envelope: string }>`SELECT envelope FROM secrets WHERE owner_did = ${owner} AND name = ${name}`.pipe(
        Effect.map((r) => r[0]?.envelope)
      )
  )

const clearTable = Effect.flatMap(SqlClient.SqlClient, (sql) => sql`TRUNCATE secrets`)

/** Everything a failure could show: message, JSON, and the rendered cause. */
const rendered = <A, E>(exit: Exit.Exit<A, E>): string =>
  Exit.isFailure(exit)
    ? [Cause.pretty(exit.cause), JSON.stringify(Cause.squash(exit.cause)), String(Cause.squash(exit.cause))].join("\n")
    : "success"

const reasonOf = <A>(exit: Exit.Exit<A, SecretsError>): string | undefined =>
  Exit.isFailure(exit)
    ? Cause.failureOption(exit.cause).pipe((o) => (o._tag === "Some" ? o.value.reason : undefined))
    : undefined

describe("Secrets on PostgreSQL", () => {
  it.layer(Db.layer())((it) => {
    it.effect("create shows a generated token once; the table holds only a wse1 envelope; resolve round-trips", () =>
      Effect.gen(function*() {
        yield* clearTable
        const secrets = yield* Secrets
        const token = (yield* secrets.create(ALICE, "main")).token
        expect(token).toMatch(TOKEN)
        expect(Buffer.from(token.slice("whsec_".length), "base64")).toHaveLength(32)
        const envelope = yield* envelopeOf(ALICE, "main")
        expect(envelope).toMatch(/^wse1\.[A-Za-z0-9_-]{16}\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+$/)
        expect(envelope).not.toContain(token)
        expect(envelope).not.toContain(token.slice("whsec_".length, 30))
        expect(yield* secrets.resolve(ALICE, "main")).toBe(token)
        // two creates never give the same token
        const other = (yield* secrets.create(ALICE, "second")).token
        expect(other).toMatch(TOKEN)
        expect(other).not.toBe(token)
        const list = yield* secrets.list(ALICE)
        expect(list.map((s) => s.name)).toEqual(["main", "second"])
        expect(list[0]?.createdAt).toBeInstanceOf(Date)
        expect(list[0]?.rotatedAt).toBeUndefined()
        expect(yield* secrets.list(BOB)).toEqual([])
      }).pipe(Effect.provide(Secrets.layerSqlWithKeyring(keyring(newKey())))))

    it.effect("create fails when it exists, rotate when it is missing; rotate replaces the token; remove", () =>
      Effect.gen(function*() {
        yield* clearTable
        const secrets = yield* Secrets
        const first = (yield* secrets.create(ALICE, "k")).token
        expect(reasonOf(yield* Effect.exit(secrets.create(ALICE, "k")))).toBe("already_exists")
        expect(yield* secrets.resolve(ALICE, "k")).toBe(first) // unchanged
        expect(reasonOf(yield* Effect.exit(secrets.rotate(ALICE, "missing")))).toBe("not_found")
        expect(yield* envelopeOf(ALICE, "missing")).toBeUndefined()
        const second = (yield* secrets.rotate(ALICE, "k")).token
        expect(second).toMatch(TOKEN)
        expect(second).not.toBe(first)
        expect(yield* secrets.resolve(ALICE, "k")).toBe(second)
        expect((yield* secrets.list(ALICE))[0]?.rotatedAt).toBeInstanceOf(Date)
        expect(yield* secrets.remove(ALICE, "k")).toBe(true)
        expect(yield* secrets.remove(ALICE, "k")).toBe(false)
        const gone = yield* Effect.exit(secrets.resolve(ALICE, "k"))
        expect(gone).toStrictEqual(Exit.fail(new SecretBox.SecretUnavailable()))
      }).pipe(Effect.provide(Secrets.layerSqlWithKeyring(keyring(newKey())))))

    it.effect("encryption-key rotation: sealed under A, current B with previous [A] still resolves", () => {
      const a = newKey()
      const b = newKey()
      return Effect.gen(function*() {
        yield* clearTable
        const token = yield* Effect.flatMap(Secrets, (s) => Effect.map(s.create(ALICE, "rot"), (i) => i.token)).pipe(
          Effect.provide(configured({ WEBHOOK_SECRET_ENCRYPTION_KEY: a }))
        )
        const sealedA = yield* envelopeOf(ALICE, "rot")
        expect(sealedA?.split(".")[1]).toBe(SecretBox.keyId(Either.getOrThrow(SecretBox.parseKey(a))))
        // current = B, previous = [A]
        const rotated = configured({ WEBHOOK_SECRET_ENCRYPTION_KEY: b, WEBHOOK_SECRET_ENCRYPTION_PREVIOUS_KEYS: a })
        expect(yield* Effect.flatMap(Secrets, (s) => s.resolve(ALICE, "rot")).pipe(Effect.provide(rotated))).toBe(token)
        // B alone cannot open A's envelope: the one generic failure
        const bOnly = yield* Effect.flatMap(Secrets, (s) => s.resolve(ALICE, "rot")).pipe(
          Effect.provide(configured({ WEBHOOK_SECRET_ENCRYPTION_KEY: b })),
          Effect.exit
        )
        expect(bOnly).toStrictEqual(Exit.fail(new SecretBox.SecretUnavailable()))
        // re-sealing (rotate with the same token) moves it to B, so A can be retired
        yield* Effect.flatMap(Secrets, (s) => s.rotate(ALICE, "rot", token)).pipe(Effect.provide(rotated))
        expect((yield* envelopeOf(ALICE, "rot"))?.split(".")[1]).toBe(
          SecretBox.keyId(Either.getOrThrow(SecretBox.parseKey(b)))
        )
        expect(
          yield* Effect.flatMap(Secrets, (s) => s.resolve(ALICE, "rot")).pipe(
            Effect.provide(configured({ WEBHOOK_SECRET_ENCRYPTION_KEY: b }))
          )
        ).toBe(token)
      })
    })

    it.effect("without a current key nothing is sealed (no_key names the variable); previous keys still open", () => {
      const a = newKey()
      return Effect.gen(function*() {
        yield* clearTable
        const token = yield* Effect.flatMap(Secrets, (s) => Effect.map(s.create(ALICE, "old"), (i) => i.token)).pipe(
          Effect.provide(configured({ WEBHOOK_SECRET_ENCRYPTION_KEY: a }))
        )
        const decryptOnly = configured({ WEBHOOK_SECRET_ENCRYPTION_PREVIOUS_KEYS: a })
        const noKey = yield* Effect.flatMap(Secrets, (s) => s.create(ALICE, "new")).pipe(
          Effect.provide(decryptOnly),
          Effect.exit
        )
        expect(reasonOf(noKey)).toBe("no_key")
        expect(rendered(noKey)).toContain("WEBHOOK_SECRET_ENCRYPTION_KEY")
        expect(
          reasonOf(
            yield* Effect.flatMap(Secrets, (s) => s.rotate(ALICE, "old")).pipe(Effect.provide(decryptOnly), Effect.exit)
          )
        ).toBe("no_key")
        expect(yield* envelopeOf(ALICE, "new")).toBeUndefined()
        expect(yield* Effect.flatMap(Secrets, (s) => s.resolve(ALICE, "old")).pipe(Effect.provide(decryptOnly))).toBe(
          token
        )
        const none = yield* Effect.flatMap(Secrets, (s) => s.create(ALICE, "x")).pipe(
          Effect.provide(configured({})),
          Effect.exit
        )
        expect(reasonOf(none)).toBe("no_key")
      })
    })

    it.effect("caller tokens: 32-256 printable ASCII, no whitespace; owner and name are validated", () =>
      Effect.gen(function*() {
        yield* clearTable
        const secrets = yield* Secrets
        const ok32 = "A".repeat(31) + "!"
        const ok256 = "~".repeat(256)
        expect((yield* secrets.create(ALICE, "t32", ok32)).token).toBe(ok32)
        expect(yield* secrets.resolve(ALICE, "t32")).toBe(ok32)
        expect((yield* secrets.create(ALICE, "t256", ok256)).token).toBe(ok256)
        expect((yield* secrets.rotate(ALICE, "t256", ok32)).token).toBe(ok32)
        const bad = [
          "A".repeat(31),
          "B".repeat(257),
          `${"C".repeat(20)} ${"C".repeat(20)}`,
          `${"D".repeat(40)}\n`,
          `${"é".repeat(40)}`,
          `${"E".repeat(40)}\t`
        ]
        for (const t of bad) {
          const exit = yield* Effect.exit(secrets.create(ALICE, "bad", t))
          expect(reasonOf(exit)).toBe("invalid_token")
          expect(rendered(exit)).not.toContain(t.trim())
          expect(reasonOf(yield* Effect.exit(secrets.rotate(ALICE, "t32", t)))).toBe("invalid_token")
        }
        expect(yield* envelopeOf(ALICE, "bad")).toBeUndefined()
        expect(yield* secrets.resolve(ALICE, "t32")).toBe(ok32)
        expect(reasonOf(yield* Effect.exit(secrets.create("alice.bsky.social", "n")))).toBe("invalid_owner")
        expect(reasonOf(yield* Effect.exit(secrets.create("did:plc:UPPERCASEUPPERCASEUPPERC", "n")))).toBe(
          "invalid_owner"
        )
        expect(reasonOf(yield* Effect.exit(secrets.create(ALICE, "")))).toBe("invalid_name")
        expect(reasonOf(yield* Effect.exit(secrets.create(ALICE, "a/b")))).toBe("invalid_name")
        expect(reasonOf(yield* Effect.exit(secrets.create(ALICE, "x".repeat(65))))).toBe("invalid_name")
        expect((yield* secrets.create(ALICE, "A-z_0.9", ok32)).token).toBe(ok32)
        expect(reasonOf(yield* Effect.exit(secrets.list("nope")))).toBe("invalid_owner")
      }).pipe(Effect.provide(Secrets.layerSqlWithKeyring(keyring(newKey())))))

    it.effect("errors never contain the token", () =>
      Effect.gen(function*() {
        yield* clearTable
        const secrets = yield* Secrets
        const token = `tok_${randomBytes(24).toString("hex")}`
        expect((yield* secrets.create(ALICE, "dup", token)).token).toBe(token)
        const failures = [
          yield* Effect.exit(secrets.create(ALICE, "dup", token)),
          yield* Effect.exit(secrets.rotate(ALICE, "absent", token)),
          yield* Effect.exit(secrets.create("not-a-did", "dup", token)),
          yield* Effect.exit(secrets.create(ALICE, "bad name", token)),
          yield* Effect.exit(secrets.create(ALICE, "ws", `${token} x`))
        ]
        for (const exit of failures) {
          expect(Exit.isFailure(exit)).toBe(true)
          expect(rendered(exit)).not.toContain(token)
          expect(rendered(exit)).not.toContain(token.slice(4, 30))
        }
      }).pipe(Effect.provide(Secrets.layerSqlWithKeyring(keyring(newKey())))))

    it.effect("resolve: one generic SecretUnavailable for a missing row, an unknown key id, a tampered envelope, bad ids", () => {
      const kr = keyring(newKey())
      return Effect.gen(function*() {
        yield* clearTable
        const sql = yield* SqlClient.SqlClient
        const secrets = yield* Secrets
        yield* secrets.create(ALICE, "good")
        const envelope = (yield* envelopeOf(ALICE, "good")) ?? ""
        const parts = envelope.split(".")
        const flipped = (s: string) => (s.startsWith("A") ? `B${s.slice(1)}` : `A${s.slice(1)}`)
        const foreign = Either.getOrThrow(SecretBox.sealRandom(keyring(newKey()), "x".repeat(40)))
        const rows: ReadonlyArray<[string, string]> = [
          ["tampered-ct", [parts[0], parts[1], parts[2], flipped(parts[3] ?? ""), parts[4]].join(".")],
          ["tampered-tag", [parts[0], parts[1], parts[2], parts[3], flipped(parts[4] ?? "")].join(".")],
          ["unknown-key", foreign],
          ["garbage", "not an envelope"],
          ["wrong-version", envelope.replace(/^wse1/, "wse2")]
        ]
        for (const [name, env] of rows) {
          yield* sql`INSERT INTO secrets (owner_did, name, envelope) VALUES (${ALICE}, ${name}, ${env})`
        }
        const expected = Exit.fail(new SecretBox.SecretUnavailable())
        for (const [name] of rows) expect(yield* Effect.exit(secrets.resolve(ALICE, name))).toStrictEqual(expected)
        expect(yield* Effect.exit(secrets.resolve(ALICE, "missing"))).toStrictEqual(expected)
        expect(yield* Effect.exit(secrets.resolve(BOB, "good"))).toStrictEqual(expected)
        expect(yield* Effect.exit(secrets.resolve("handle.example", "good"))).toStrictEqual(expected)
        expect(yield* Effect.exit(secrets.resolve(ALICE, "bad/name"))).toStrictEqual(expected)
        const failure = yield* Effect.flip(secrets.resolve(ALICE, "missing"))
        expect(failure.message).toBe("secret unavailable")
      }).pipe(Effect.provide(Secrets.layerSqlWithKeyring(kr)))
    })

    it.effect("resolve caches a token for at most the TTL; local writes invalidate at once; failures are not cached", () => {
      const kr = keyring(newKey())
      return Effect.gen(function*() {
        yield* clearTable
        const sql = yield* SqlClient.SqlClient
        const secrets = yield* Secrets
        // a miss is not cached: the secret created right after resolves at once
        expect(Exit.isFailure(yield* Effect.exit(secrets.resolve(ALICE, "c")))).toBe(true)
        const first = (yield* secrets.create(ALICE, "c")).token
        expect(yield* secrets.resolve(ALICE, "c")).toBe(first)
        // another process re-seals a new token: the cached one is served until the TTL passes
        const other = "O".repeat(40)
        const sealed = Either.getOrThrow(SecretBox.sealRandom(kr, other))
        yield* sql`UPDATE secrets SET envelope = ${sealed} WHERE owner_did = ${ALICE} AND name = 'c'`
        expect(yield* secrets.resolve(ALICE, "c")).toBe(first)
        yield* TestClock.adjust("9 seconds")
        expect(yield* secrets.resolve(ALICE, "c")).toBe(first)
        yield* TestClock.adjust("2 seconds")
        expect(yield* secrets.resolve(ALICE, "c")).toBe(other)
        // a rotation in this process is seen at once
        const third = (yield* secrets.rotate(ALICE, "c")).token
        expect(yield* secrets.resolve(ALICE, "c")).toBe(third)
        yield* secrets.remove(ALICE, "c")
        expect(Exit.isFailure(yield* Effect.exit(secrets.resolve(ALICE, "c")))).toBe(true)
      }).pipe(Effect.provide(Secrets.layerSqlWithKeyring(kr, { cacheTtl: "10 seconds" })))
    })

    it.effect("the cache is bounded and can be turned off", () => {
      const kr = keyring(newKey())
      return Effect.gen(function*() {
        yield* clearTable
        const sql = yield* SqlClient.SqlClient
        const secrets = yield* Secrets
        const a = (yield* secrets.create(ALICE, "a")).token
        const b = (yield* secrets.create(ALICE, "b")).token
        expect(yield* secrets.resolve(ALICE, "a")).toBe(a)
        expect(yield* secrets.resolve(ALICE, "b")).toBe(b) // capacity 1: evicts "a"
        const other = "Q".repeat(40)
        const sealed = Either.getOrThrow(SecretBox.sealRandom(kr, other))
        yield* sql`UPDATE secrets SET envelope = ${sealed} WHERE owner_did = ${ALICE}`
        expect(yield* secrets.resolve(ALICE, "a")).toBe(other) // not cached any more
        expect(yield* secrets.resolve(ALICE, "b")).toBe(other) // evicted by "a"
      }).pipe(Effect.provide(Secrets.layerSqlWithKeyring(kr, { cacheCapacity: 1 })))
    })
  })
})

describe("Secrets in memory", () => {
  it.effect("layerMemory resolves its entries and behaves like the SQL store", () =>
    Effect.gen(function*() {
      const secrets = yield* Secrets
      expect(yield* secrets.resolve(ALICE, "given")).toBe("short-test-token")
      expect(Exit.isFailure(yield* Effect.exit(secrets.resolve(ALICE, "missing")))).toBe(true)
      const token = (yield* secrets.create(ALICE, "made")).token
      expect(token).toMatch(TOKEN)
      expect(yield* secrets.resolve(ALICE, "made")).toBe(token)
      expect(reasonOf(yield* Effect.exit(secrets.create(ALICE, "made")))).toBe("already_exists")
      expect(reasonOf(yield* Effect.exit(secrets.rotate(BOB, "made")))).toBe("not_found")
      expect((yield* secrets.list(ALICE)).map((s) => s.name)).toEqual(["given", "made"])
      expect(yield* secrets.remove(ALICE, "given")).toBe(true)
      expect(Exit.isFailure(yield* Effect.exit(secrets.resolve(ALICE, "given")))).toBe(true)
    }).pipe(Effect.provide(Secrets.layerMemory([{ ownerDid: ALICE, name: "given", token: "short-test-token" }]))))

  it.effect("a create in this process resolves to its new token at once, over a token cached before another process deleted the row", () =>
    Effect.gen(function*() {
      const store = yield* makeMemoryStore
      const secrets = yield* makeSecrets(store, keyring(newKey()), { cacheTtl: "10 seconds" })
      const old = (yield* secrets.create(ALICE, "again")).token
      expect(yield* secrets.resolve(ALICE, "again")).toBe(old) // now cached
      yield* store.delete(ALICE, "again") // the CLI, in another process
      const fresh = (yield* secrets.create(ALICE, "again")).token
      expect(yield* secrets.resolve(ALICE, "again")).toBe(fresh)
    }))

  it.effect("a configured cache TTL above 60 s is capped: another process's rotation is seen within 60 s", () =>
    Effect.gen(function*() {
      const kr = keyring(newKey())
      const store = yield* makeMemoryStore
      const secrets = yield* makeSecrets(store, kr, { cacheTtl: "5 minutes" })
      const old = (yield* secrets.create(ALICE, "capped")).token
      expect(yield* secrets.resolve(ALICE, "capped")).toBe(old) // now cached
      const other = "R".repeat(40)
      yield* store.update(ALICE, "capped", Either.getOrThrow(SecretBox.sealRandom(kr, other))) // the CLI
      yield* TestClock.adjust("61 seconds")
      expect(yield* secrets.resolve(ALICE, "capped")).toBe(other)
    }))

  it.effect("a cached token is served for the TTL and read again once the TTL has passed: 1 ms before it the old token, at it the new", () =>
    Effect.gen(function*() {
      const kr = keyring(newKey())
      const store = yield* makeMemoryStore
      const secrets = yield* makeSecrets(store, kr, { cacheTtl: "10 seconds" })
      const old = (yield* secrets.create(ALICE, "edge")).token
      expect(yield* secrets.resolve(ALICE, "edge")).toBe(old) // now cached
      const other = "E".repeat(40)
      yield* store.update(ALICE, "edge", Either.getOrThrow(SecretBox.sealRandom(kr, other))) // the CLI
      yield* TestClock.adjust("9999 millis")
      expect(yield* secrets.resolve(ALICE, "edge")).toBe(old)
      yield* TestClock.adjust("1 millis")
      expect(yield* secrets.resolve(ALICE, "edge")).toBe(other)
    }))

  it.effect("a resolve that read the old envelope before a local rotate never caches the old token (SPEC §8.4)", () =>
    Effect.gen(function*() {
      const base = yield* makeMemoryStore
      const read = yield* Deferred.make<void>()
      const release = yield* Deferred.make<void>()
      let gated = false
      // the gated read takes the envelope, then waits until the rotation has happened
      const store: SecretsStoreShape = {
        ...base,
        get: (ownerDid, name) =>
          gated
            ? base.get(ownerDid, name).pipe(
              Effect.tap(() => {
                gated = false
                return Deferred.succeed(read, undefined)
              }),
              Effect.zipLeft(Deferred.await(release))
            )
            : base.get(ownerDid, name)
      }
      const secrets = yield* makeSecrets(store, keyring(newKey()), { cacheTtl: "10 seconds" })
      const first = (yield* secrets.create(ALICE, "race")).token
      gated = true
      const inFlight = yield* Effect.fork(secrets.resolve(ALICE, "race"))
      yield* Deferred.await(read)
      const second = (yield* secrets.rotate(ALICE, "race")).token
      yield* Deferred.succeed(release, undefined)
      expect(yield* Fiber.join(inFlight)).toBe(first) // it started before the rotation
      // the old token stops working at once: the next resolve is the rotated one
      expect(yield* secrets.resolve(ALICE, "race")).toBe(second)
    }))

  it.effect("without options a resolved token is kept for the documented 10 s, not longer", () =>
    Effect.gen(function*() {
      const kr = keyring(newKey())
      const store = yield* makeMemoryStore
      const secrets = yield* makeSecrets(store, kr)
      const old = (yield* secrets.create(ALICE, "default")).token
      expect(yield* secrets.resolve(ALICE, "default")).toBe(old) // now cached
      const other = "D".repeat(40)
      yield* store.update(ALICE, "default", Either.getOrThrow(SecretBox.sealRandom(kr, other))) // the CLI
      yield* TestClock.adjust("9999 millis")
      expect(yield* secrets.resolve(ALICE, "default")).toBe(old)
      yield* TestClock.adjust("1 millis")
      expect(yield* secrets.resolve(ALICE, "default")).toBe(other)
    }))

  it.effect("a capacity or a TTL of 0 turns the cache off: another process's rotation is seen at once", () =>
    Effect.gen(function*() {
      const kr = keyring(newKey())
      for (const options of [{ cacheCapacity: 0 }, { cacheTtl: 0 }]) {
        const store = yield* makeMemoryStore
        const secrets = yield* makeSecrets(store, kr, { cacheTtl: "10 seconds", ...options })
        const old = (yield* secrets.create(ALICE, "off")).token
        expect(yield* secrets.resolve(ALICE, "off")).toBe(old)
        const other = "F".repeat(40)
        yield* store.update(ALICE, "off", Either.getOrThrow(SecretBox.sealRandom(kr, other))) // the CLI
        expect(yield* secrets.resolve(ALICE, "off"), JSON.stringify(options)).toBe(other)
      }
    }))

  it.effect("a rotate that finds the secret deleted by another process drops the cached token at once", () =>
    Effect.gen(function*() {
      const store = yield* makeMemoryStore
      const secrets = yield* makeSecrets(store, keyring(newKey()), { cacheTtl: "10 seconds" })
      yield* secrets.create(ALICE, "gone")
      yield* secrets.resolve(ALICE, "gone") // now cached
      yield* store.delete(ALICE, "gone") // the CLI
      expect(reasonOf(yield* Effect.exit(secrets.rotate(ALICE, "gone")))).toBe("not_found")
      expect(yield* Effect.exit(secrets.resolve(ALICE, "gone"))).toStrictEqual(
        Exit.fail(new SecretBox.SecretUnavailable())
      )
    }))

  it.effect("owners whose DID and secret name run together alike never share a token (did:web:a.b + cd, did:web:a.bc + d)", () =>
    Effect.gen(function*() {
      const store = yield* makeMemoryStore
      const secrets = yield* makeSecrets(store, keyring(newKey()), { cacheTtl: "10 seconds" })
      const first = (yield* secrets.create("did:web:a.b", "cd")).token
      expect(yield* secrets.resolve("did:web:a.b", "cd")).toBe(first) // now cached
      expect(yield* Effect.exit(secrets.resolve("did:web:a.bc", "d"))).toStrictEqual(
        Exit.fail(new SecretBox.SecretUnavailable())
      )
      const second = (yield* secrets.create("did:web:a.bc", "d")).token
      expect(yield* secrets.resolve("did:web:a.bc", "d")).toBe(second)
      expect(yield* secrets.resolve("did:web:a.b", "cd")).toBe(first)
      expect(second).not.toBe(first)
    }))

  it.effect("keyringFromConfig: a bad current or previous key is invalid_key, never silently dropped", () =>
    Effect.sync(() => {
      const good = newKey()
      const config = (current: string | undefined, previous: string | undefined) => ({
        secrets: {
          encryptionKey: current === undefined ? Option.none() : Option.some(Redacted.make(current)),
          previousKeys: previous === undefined ? Option.none() : Option.some(Redacted.make(previous))
        }
      })
      const reason = (r: Either.Either<SecretBox.Keyring, SecretsError>) => Either.isLeft(r) ? r.left.reason : "ok"
      expect(reason(keyringFromConfig(config(good, `${newKey()},${newKey()}`)))).toBe("ok")
      expect(reason(keyringFromConfig(config(good, `${newKey()},not-a-key`)))).toBe("invalid_key")
      expect(reason(keyringFromConfig(config("not-a-key", newKey())))).toBe("invalid_key")
      expect(reason(keyringFromConfig(config(undefined, Array.from({ length: 9 }, newKey).join(","))))).toBe(
        "invalid_key"
      )
    }))

  it.effect("SecretsError messages are value-free and name the reason", () =>
    Effect.sync(() => {
      expect(new SecretsError({ reason: "already_exists" }).message).toBe(
        "secrets: a secret with this name already exists for this owner"
      )
      expect(new SecretsError({ reason: "store", code: "57P01" }).message).toContain("57P01")
    }))
})
