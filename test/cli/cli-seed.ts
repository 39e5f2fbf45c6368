/**
 * Seeding shared by the operator CLI's tests (cli.test.ts spawns the CLI, deliveries-command.test.ts
 * runs its `deliveries` command in-process): three owners, and four outbox rows made by the real
 * matching pipeline.
 */
import * as SqlClient from "@effect/sql/SqlClient"
import { Effect, Layer, type Redacted } from "effect"
import { expect } from "vitest"
import * as App from "../../src/layers/App.js"
import { Processor } from "../../src/services/matching/Processor.js"
import * as Config from "../../src/services/platform/Config.js"
import * as Database from "../../src/services/platform/Database.js"
import * as Db from "../support/db.js"
import { ev, plc, rev, testConfig, whEv, whRecordValue } from "../support/stack.js"

export const ALICE = plc(1)
export const BOB = plc(2)
export const CAROL = plc(3)
export const POST = "app.bsky.feed.post"

/** The matching pipeline on the database at `url` (to make outbox rows with the real processor). */
export const seedLayer = (url: Redacted.Redacted<string>) =>
  App.matchingLayer.pipe(Layer.provideMerge(Layer.mergeAll(Database.layerUrl(url), Config.layerValue(testConfig()))))

/**
 * Through the real processor: ALICE's webhook w1 and CAROL's w2, both on BOB's records, then two
 * posts of BOB's: four outbox rows (pending).
 */
export const seedFourDeliveries = Effect.gen(function*() {
  const processor = yield* Processor
  yield* processor.processEvents(
    [
      whEv(ALICE, "w1", whRecordValue(`at://${BOB}`, { url: "https://alice.example/hook" }), { rev: rev(1) }),
      whEv(CAROL, "w2", whRecordValue(`at://${BOB}`, { url: "https://carol.example/hook" }), { rev: rev(1) })
    ],
    { registryWriter: true }
  )
  const r = yield* processor.processEvents(
    [ev(BOB, POST, "p1", { rev: rev(10) }), ev(BOB, POST, "p2", { rev: rev(11) })],
    { registryWriter: true }
  )
  expect(r.inserted).toBe(4)
})

/** A fresh database (dropped with the scope) with {@link seedFourDeliveries}, then `adjust` on it. */
export const seededDatabase = <E>(adjust: (sql: SqlClient.SqlClient) => Effect.Effect<unknown, E>) =>
  Effect.gen(function*() {
    const db = yield* Db.freshDatabase
    yield* Effect.gen(function*() {
      yield* seedFourDeliveries
      yield* adjust(yield* SqlClient.SqlClient)
    }).pipe(Effect.provide(seedLayer(db.url)), Effect.scoped)
    return db
  })
