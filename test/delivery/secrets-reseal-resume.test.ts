/**
 * A re-seal pass is bounded (MAX_RESEAL_PAGES × RESEAL_PAGE_SIZE = 100,000 rows) and leaves the
 * envelopes no key opens in place, so it must be resumable: a pass that stops at its bound says
 * where (`next`), the next pass starts there, and `resealPasses` chains passes until one completes
 * (bounded too). Before, every pass began at the first row: with 100,000 unreadable envelopes ahead
 * of a readable one in (owner, name) order, every pass ended `complete: false` before reaching it,
 * and that secret stayed under the key being retired however often the operator ran it again.
 * Real PostgreSQL with a pass bounded to 2 pages (the real bound end to end:
 * test/cli/secrets-reseal-resume-cli.test.ts); the pass chaining's bounds with a scripted pass.
 */
import * as SqlClient from "@effect/sql/SqlClient"
import { describe, expect, it } from "@effect/vitest"
import { Effect, Either } from "effect"
import { randomBytes } from "node:crypto"
import * as SecretBox from "../../src/services/delivery/SecretBox.js"
import {
  make as makeSecrets,
  makeSqlStore,
  RESEAL_PAGE_SIZE,
  RESEAL_START,
  resealPasses,
  type ResealResult,
  type SecretKey
} from "../../src/services/delivery/Secrets.js"
import * as Reseal from "../../src/services/delivery/SecretsReseal.js"
import * as Db from "../support/db.js"

const newKey = (): Uint8Array => Uint8Array.from(randomBytes(32))
const ring = (current: Uint8Array | undefined, previous: ReadonlyArray<Uint8Array> = []) =>
  Either.getOrThrow(SecretBox.makeKeyring(current, previous))

const LIVE_OWNER = "did:plc:zzzzzzzzzzzzzzzzzzzzzzzz"
const DEAD_OWNER = "did:plc:aaaaaaaaaaaaaaaaaaaaaaaa"

describe("a re-seal pass resumes where a bounded one stopped (PostgreSQL)", () => {
  it.layer(Db.layer())((it) => {
    it.effect("unreadable envelopes filling a pass's bound ahead of a readable secret: the next pass, from `next`, re-seals it", () =>
      Effect.gen(function*() {
        const sql = yield* SqlClient.SqlClient
        yield* sql`TRUNCATE secrets`
        const a = newKey()
        const b = newKey()
        // 2½ pages of envelopes under a key nobody has any more, sorting first; a pass here is
        // bounded to 2 pages (the real bound, 1,000 pages, in test/cli/secrets-reseal-resume-cli.test.ts)
        const dead = Either.getOrThrow(SecretBox.sealRandom(ring(newKey()), "x".repeat(40)))
        const n = 2 * RESEAL_PAGE_SIZE + RESEAL_PAGE_SIZE / 2
        yield* sql`
          INSERT INTO secrets (owner_did, name, envelope)
          SELECT ${DEAD_OWNER}, 'n' || lpad(i::text, 4, '0'), ${dead} FROM generate_series(0, ${n - 1}) AS i`
        const store = yield* makeSqlStore
        const underA = yield* makeSecrets(store, ring(a), { cacheTtl: 0 })
        const token = (yield* underA.create(LIVE_OWNER, "live")).token
        const kr = ring(b, [a])
        const currentId = SecretBox.keyId(b)
        const pass = (from: SecretKey) => Reseal.resealAll(store, kr, currentId, from, 2)
        const liveKeyId = Effect.map(
          sql<{ envelope: string }>`SELECT envelope FROM secrets WHERE owner_did = ${LIVE_OWNER}`,
          ([row]) => row?.envelope.split(".")[1]
        )

        // the first pass stops at its bound, on the last row it read, and says so
        const first = yield* pass(RESEAL_START)
        const lastRead = { ownerDid: DEAD_OWNER, name: `n${String(2 * RESEAL_PAGE_SIZE - 1).padStart(4, "0")}` }
        expect(first).toEqual({
          resealed: 0,
          unreadable: 2 * RESEAL_PAGE_SIZE,
          skipped: 0,
          complete: false,
          next: lastRead
        })
        expect(yield* liveKeyId).toBe(SecretBox.keyId(a))
        // the next, from there: the rest of the dead rows, the live secret, the end of the table
        expect(yield* pass(lastRead)).toEqual({
          resealed: 1,
          unreadable: n - 2 * RESEAL_PAGE_SIZE,
          skipped: 0,
          complete: true
        })
        expect(yield* liveKeyId).toBe(SecretBox.keyId(b))
        // A can go: the live secret resolves under B alone
        const onlyB = yield* makeSecrets(store, ring(b), { cacheTtl: 0 })
        expect(yield* onlyB.resolve(LIVE_OWNER, "live")).toBe(token)

        // chained (what `firehook secrets reseal` runs): the sums over both passes
        const backToA = Either.getOrThrow(SecretBox.sealRandom(ring(a), token))
        yield* sql`UPDATE secrets SET envelope = ${backToA} WHERE owner_did = ${LIVE_OWNER}`
        expect(yield* resealPasses(pass)).toEqual({ resealed: 1, unreadable: n, skipped: 0, complete: true, passes: 2 })
        expect(yield* liveKeyId).toBe(SecretBox.keyId(b))

        // Secrets.reseal starts where it is told
        yield* sql`UPDATE secrets SET envelope = ${backToA} WHERE owner_did = ${LIVE_OWNER}`
        const underB = yield* makeSecrets(store, kr, { cacheTtl: 0 })
        expect(yield* underB.reseal(lastRead)).toEqual({
          resealed: 1,
          unreadable: n - 2 * RESEAL_PAGE_SIZE,
          skipped: 0,
          complete: true
        })
        expect(yield* underB.reseal()).toEqual({ resealed: 0, unreadable: n, skipped: 0, complete: true })
        expect((yield* sql<{ n: number }>`SELECT count(*)::int AS n FROM secrets`)[0]?.n).toBe(n + 1)
      }))
  })
})

describe("resealPasses: passes chained from where each stopped, bounded", () => {
  const key = (i: number): SecretKey => ({ ownerDid: `did:plc:${String(i).padStart(24, "0")}`, name: "s" })
  const scripted = (results: ReadonlyArray<ResealResult>) => {
    const froms: Array<SecretKey> = []
    const pass = (from: SecretKey) =>
      Effect.sync(() => {
        froms.push(from)
        return results[froms.length - 1] ?? { resealed: 0, unreadable: 0, skipped: 0, complete: true }
      })
    return { froms, pass }
  }

  it.effect("each pass starts at the previous pass's `next`; the counts are summed", () =>
    Effect.gen(function*() {
      const s = scripted([
        { resealed: 1, unreadable: 2, skipped: 0, complete: false, next: key(1) },
        { resealed: 3, unreadable: 0, skipped: 1, complete: false, next: key(2) },
        { resealed: 5, unreadable: 0, skipped: 0, complete: true }
      ])
      expect(yield* resealPasses(s.pass)).toEqual({ resealed: 9, unreadable: 2, skipped: 1, complete: true, passes: 3 })
      expect(s.froms).toEqual([RESEAL_START, key(1), key(2)])
    }))

  it.effect("at most maxPasses passes: then complete false", () =>
    Effect.gen(function*() {
      let i = 0
      const froms: Array<SecretKey> = []
      const pass = (from: SecretKey) =>
        Effect.sync((): ResealResult => {
          froms.push(from)
          return { resealed: 1, unreadable: 0, skipped: 0, complete: false, next: key(++i) }
        })
      expect(yield* resealPasses(pass, 4)).toEqual({
        resealed: 4,
        unreadable: 0,
        skipped: 0,
        complete: false,
        passes: 4
      })
      expect(froms).toEqual([RESEAL_START, key(1), key(2), key(3)])
    }))

  it.effect("a pass that ends where it started (or gives no position) ends the run: complete false", () =>
    Effect.gen(function*() {
      const stuck = scripted([
        { resealed: 0, unreadable: 1, skipped: 0, complete: false, next: key(5) },
        { resealed: 0, unreadable: 1, skipped: 0, complete: false, next: key(5) }
      ])
      expect(yield* resealPasses(stuck.pass)).toEqual({
        resealed: 0,
        unreadable: 2,
        skipped: 0,
        complete: false,
        passes: 2
      })
      const nowhere = scripted([{ resealed: 0, unreadable: 0, skipped: 0, complete: false }])
      expect(yield* resealPasses(nowhere.pass)).toEqual({
        resealed: 0,
        unreadable: 0,
        skipped: 0,
        complete: false,
        passes: 1
      })
    }))
})
