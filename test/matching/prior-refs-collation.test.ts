/**
 * Prior references on a database whose default collation does not sort TIDs bytewise (SPEC §2.4:
 * writes are monotonic on the referencing record's rev). Under an ICU Estonian collation (`z`
 * between `s` and `t`) `3kt…` sorts after `3kz…`, the other way round from time order: the store
 * must compare revs bytewise, or a newer version's references never replace an older one's and a
 * delete of a newer version leaves the older row in place.
 */
import { describe, expect, layer } from "@effect/vitest"
import { Effect, Layer } from "effect"
import { layerSql, PriorRefsStore } from "../../src/services/matching/PriorRefsStore.js"
import * as Db from "../support/db.js"

const ESTONIAN = "TEMPLATE template0 LOCALE_PROVIDER icu ICU_LOCALE 'et' LOCALE 'C.UTF-8'"

/** Two valid TIDs: OLD < NEW bytewise (in time order); OLD > NEW under the Estonian collation. */
const OLD = "3kt2222222222"
const NEW = "3kz2222222222"

const A = "at://did:plc:aaaaaaaaaaaaaaaaaaaaaaaa/app.bsky.feed.like/3kaaa"
const B = "at://did:plc:aaaaaaaaaaaaaaaaaaaaaaaa/app.bsky.feed.like/3kbbb"
const refs = (uri: string) => [uri]
const put = (recordUri: string, rev: string, to: string) => ({
  recordUri,
  rev,
  refs: refs(to),
  bytes: 40,
  force: false
})

describe("prior references compare revs bytewise whatever the database's collation", () => {
  layer(layerSql.pipe(Layer.provideMerge(Db.layerWith(ESTONIAN))), {
    timeout: "60 seconds",
    excludeTestServices: true
  })(
    "ICU Estonian database",
    (it) => {
      it.effect("a newer version replaces an older one's references; a newer delete removes the older row", () =>
        Effect.gen(function*() {
          const store = yield* PriorRefsStore
          const ttlSeconds = 3600
          yield* store.write({ upserts: [put(A, OLD, "at://x/old"), put(B, OLD, "at://x/b")], deletes: [], ttlSeconds })
          const written = yield* store.write({ upserts: [put(A, NEW, "at://x/new")], deletes: [], ttlSeconds })
          yield* store.write({ upserts: [], deletes: [{ recordUri: B, olderThan: NEW }], ttlSeconds })
          // an older version after the newer one changes nothing
          const stale = yield* store.write({ upserts: [put(A, OLD, "at://x/stale")], deletes: [], ttlSeconds })
          const rows = yield* store.read([A, B])
          expect({ written: [...written], stale: [...stale], rows: Object.fromEntries(rows) }).toEqual({
            written: [A],
            stale: [],
            rows: { [A]: { rev: NEW, refs: ["at://x/new"], live: true } }
          })
        }))
    }
  )
})
