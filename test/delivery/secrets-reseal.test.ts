/**
 * Retiring an encryption key (SPEC §1.3: "one active key plus ≤ 8 previous (decrypt-only) keys …
 * so keys rotate without downtime"): `Secrets.reseal` re-seals every envelope not under the current
 * key under it — same token, `rotated_at` untouched — in pages of 100 rows, so the previous key can
 * then be dropped. A rotate that lands between the page's read and its swap wins (`skipped`); an
 * envelope no key opens is counted (`unreadable`) and left as it is, never deleted. On real
 * PostgreSQL, plus the in-memory store.
 */
import * as SqlClient from "@effect/sql/SqlClient"
import { describe, expect, it } from "@effect/vitest"
import { Effect, Either, Exit } from "effect"
import { randomBytes } from "node:crypto"
import * as SecretBox from "../../src/services/delivery/SecretBox.js"
import {
  make as makeSecrets,
  makeMemoryStore,
  makeSqlStore,
  RESEAL_PAGE_SIZE,
  type SecretsStoreShape
} from "../../src/services/delivery/Secrets.js"
import * as Db from "../support/db.js"
import { plc } from "../support/stack.js"

const ALICE = plc(1)
const BOB = plc(2)

const newKey = (): Uint8Array => Uint8Array.from(randomBytes(32))
const ring = (current: Uint8Array | undefined, previous: ReadonlyArray<Uint8Array> = []) =>
  Either.getOrThrow(SecretBox.makeKeyring(current, previous))

interface Row {
  readonly owner_did: string
  readonly name: string
  readonly envelope: string
  readonly rotated_at: Date | null
}

const rows = Effect.flatMap(
  SqlClient.SqlClient,
  (sql) => sql<Row>`SELECT owner_did, name, envelope, rotated_at FROM secrets ORDER BY owner_did, name`
)
const keyIds = (rs: ReadonlyArray<Row>) => new Set(rs.map((r) => r.envelope.split(".")[1]))
const clearTable = Effect.flatMap(SqlClient.SqlClient, (sql) => sql`TRUNCATE secrets`)

describe("Secrets.reseal on PostgreSQL", () => {
  it.layer(Db.layer())((it) => {
    it.effect("moves every envelope under the previous key to the current one, page by page; the old key can go", () =>
      Effect.gen(function*() {
        yield* clearTable
        const sql = yield* SqlClient.SqlClient
        const store = yield* makeSqlStore
        const a = newKey()
        const b = newKey()
        const underA = yield* makeSecrets(store, ring(a), { cacheTtl: 0 })
        // more than two pages under A, across two owners, one of them rotated once
        const tokens = new Map<string, string>()
        for (let i = 0; i < 2 * RESEAL_PAGE_SIZE + 30; i++) {
          const owner = i % 2 === 0 ? ALICE : BOB
          tokens.set(`${owner}/s${i}`, (yield* underA.create(owner, `s${i}`)).token)
        }
        tokens.set(`${ALICE}/s0`, (yield* underA.rotate(ALICE, "s0")).token)
        yield* sql`UPDATE secrets SET rotated_at = '2020-01-01T00:00:00Z' WHERE owner_did = ${ALICE} AND name = 's0'`
        const underB = yield* makeSecrets(store, ring(b, [a]), { cacheTtl: 0 })
        tokens.set(`${BOB}/already-b`, (yield* underB.create(BOB, "already-b")).token)
        const before = yield* rows
        expect(keyIds(before)).toEqual(new Set([SecretBox.keyId(a), SecretBox.keyId(b)]))

        expect(yield* underB.reseal()).toEqual({
          resealed: 2 * RESEAL_PAGE_SIZE + 30,
          unreadable: 0,
          skipped: 0,
          complete: true
        })
        const after = yield* rows
        expect(keyIds(after)).toEqual(new Set([SecretBox.keyId(b)]))
        // rotated_at untouched (the token did not change), no row added or lost
        expect(after.map((r) => [r.owner_did, r.name, r.rotated_at?.toISOString() ?? null])).toEqual(
          before.map((r) => [r.owner_did, r.name, r.rotated_at?.toISOString() ?? null])
        )
        expect(after.find((r) => r.name === "s0")?.rotated_at?.toISOString()).toBe("2020-01-01T00:00:00.000Z")
        // the already re-sealed envelope was not rewritten
        expect(after.find((r) => r.name === "already-b")?.envelope).toBe(
          before.find((r) => r.name === "already-b")?.envelope
        )

        // A retired: every secret still resolves to its token under B alone
        const onlyB = yield* makeSecrets(store, ring(b), { cacheTtl: 0 })
        for (const [k, token] of tokens) {
          const [owner, name] = k.split("/") as [string, string]
          expect(yield* onlyB.resolve(owner, name)).toBe(token)
        }
        // a second pass finds nothing to do
        expect(yield* onlyB.reseal()).toEqual({ resealed: 0, unreadable: 0, skipped: 0, complete: true })
      }))

    it.effect("an envelope no key opens is counted and kept as it is; the others are re-sealed", () =>
      Effect.gen(function*() {
        yield* clearTable
        const sql = yield* SqlClient.SqlClient
        const store = yield* makeSqlStore
        const a = newKey()
        const lost = newKey()
        const b = newKey()
        const good = (yield* (yield* makeSecrets(store, ring(a))).create(ALICE, "good")).token
        yield* (yield* makeSecrets(store, ring(lost))).create(ALICE, "lost-key")
        yield* sql`INSERT INTO secrets (owner_did, name, envelope) VALUES (${BOB}, 'garbage', 'not-an-envelope')`
        const kept = (yield* rows).filter((r) => r.name !== "good")

        const secrets = yield* makeSecrets(store, ring(b, [a]), { cacheTtl: 0 })
        expect(yield* secrets.reseal()).toEqual({ resealed: 1, unreadable: 2, skipped: 0, complete: true })
        const after = yield* rows
        expect(after.filter((r) => r.name !== "good")).toEqual(kept)
        expect(yield* secrets.resolve(ALICE, "good")).toBe(good)
        expect(after.find((r) => r.name === "good")?.envelope.split(".")[1]).toBe(SecretBox.keyId(b))
        // again: still counted, still there
        expect(yield* secrets.reseal()).toEqual({ resealed: 0, unreadable: 2, skipped: 0, complete: true })
        expect((yield* rows).length).toBe(3)
      }))

    it.effect("a rotate between the page's read and its swap wins: skipped, and the rotated token stays", () =>
      Effect.gen(function*() {
        yield* clearTable
        const base = yield* makeSqlStore
        const a = newKey()
        const b = newKey()
        const underA = yield* makeSecrets(base, ring(a), { cacheTtl: 0 })
        const untouched = (yield* underA.create(ALICE, "calm")).token
        yield* underA.create(ALICE, "busy")
        // the owner rotates "busy" (through another instance, already on key B) right after the
        // re-seal read the page
        const owners = yield* makeSecrets(base, ring(b, [a]), { cacheTtl: 0 })
        let rotated: string | undefined
        const racing: SecretsStoreShape = {
          ...base,
          sealedElsewhere: (keyId, after, limit) =>
            base.sealedElsewhere(keyId, after, limit).pipe(
              Effect.tap((page) =>
                page.length === 0 || rotated !== undefined
                  ? Effect.void
                  : Effect.map(owners.rotate(ALICE, "busy"), (r) => {
                    rotated = r.token
                  })
              )
            )
        }
        const resealer = yield* makeSecrets(racing, ring(b, [a]), { cacheTtl: 0 })
        expect(yield* resealer.reseal()).toEqual({ resealed: 1, unreadable: 0, skipped: 1, complete: true })
        expect(rotated).toBeDefined()
        const onlyB = yield* makeSecrets(base, ring(b), { cacheTtl: 0 })
        expect(yield* onlyB.resolve(ALICE, "busy")).toBe(rotated)
        expect(yield* onlyB.resolve(ALICE, "calm")).toBe(untouched)
      }))

    it.effect("without a current key nothing is re-sealed: no_key", () =>
      Effect.gen(function*() {
        const store = yield* makeSqlStore
        const exit = yield* Effect.exit((yield* makeSecrets(store, ring(undefined, [newKey()]))).reseal())
        expect(Exit.isFailure(exit) && JSON.stringify(exit.cause)).toContain("no_key")
      }))
  })
})

describe("Secrets.reseal in memory", () => {
  it.effect("after moving to key B (A previous) the secret is re-sealed without its token, so A can go", () =>
    Effect.gen(function*() {
      const a = newKey()
      const b = newKey()
      const store = yield* makeMemoryStore
      const token = (yield* (yield* makeSecrets(store, ring(a), { cacheTtl: 0 })).create(ALICE, "main")).token
      const bad = Either.getOrThrow(SecretBox.sealRandom(ring(newKey()), "x".repeat(40)))
      yield* store.insert(BOB, "lost", bad)
      const underB = yield* makeSecrets(store, ring(b, [a]), { cacheTtl: 0 })
      expect(yield* underB.reseal()).toEqual({ resealed: 1, unreadable: 1, skipped: 0, complete: true })
      const onlyB = yield* makeSecrets(store, ring(b), { cacheTtl: 0 })
      expect(yield* Effect.exit(onlyB.resolve(ALICE, "main"))).toStrictEqual(Exit.succeed(token))
      expect((yield* store.list(ALICE))[0]?.rotatedAt).toBeUndefined()
      expect(yield* store.get(BOB, "lost")).toBe(bad)
    }))
})
