/**
 * The durable replay obligation's statements (`CursorStore.replayStoreSql`, 0017) on PostgreSQL:
 * the registry's mark takes the earliest point and bumps the sequence, makes a row only where asked
 * (`backlink`: a stream without a cursor starts live; `direct`: from its initial cursor 0, before
 * every registration), and a replay session's advance is a compare-and-set on the sequence that
 * clears the obligation only once the replay reached the stored cursor.
 */
import * as SqlClient from "@effect/sql/SqlClient"
import { describe, expect, it } from "@effect/vitest"
import { Effect } from "effect"
import * as CursorStore from "../../src/services/intake/CursorStore.js"
import * as Db from "../support/db.js"

const RELAY = "wss://jetstream.example"

describe("replay obligations (cursors.replay_from)", () => {
  it.scoped("mark, load and advance", () =>
    Effect.gen(function*() {
      const sql = yield* SqlClient.SqlClient
      const replay = CursorStore.replayStoreSql(sql)
      const cursors = yield* CursorStore.CursorStore

      // no rows: direct gets none, backlink gets one from the registration
      yield* replay.mark(RELAY, [{ stream: "direct", createRow: false }, { stream: "backlink", createRow: true }], 100n)
      expect(yield* cursors.load("direct", RELAY)).toBeUndefined()
      expect(yield* replay.load("direct", RELAY)).toBeUndefined()
      expect(yield* cursors.load("backlink", RELAY)).toBe(100n)
      expect(yield* replay.load("backlink", RELAY)).toEqual({ from: 100n, seq: 1n })

      // the earliest point is kept; every mark bumps the sequence
      yield* cursors.save("direct", RELAY, 500n)
      expect(yield* replay.load("direct", RELAY)).toBeUndefined()
      yield* replay.mark(RELAY, [{ stream: "direct", createRow: false }], 300n)
      yield* replay.mark(RELAY, [{ stream: "direct", createRow: false }], 400n)
      const o = yield* replay.load("direct", RELAY)
      expect(o?.from).toBe(300n)
      if (o === undefined) return

      // a session that read it replays: below the stored cursor it stays, raised to its progress
      yield* cursors.save("direct", RELAY, 350n)
      expect(yield* replay.advance("direct", RELAY, o.seq, 350n)).toBe("pending")
      expect((yield* replay.load("direct", RELAY))?.from).toBe(350n)

      // a mark since the session read it: the session does not touch it (a later session will)
      yield* replay.mark(RELAY, [{ stream: "direct", createRow: false }], 320n)
      yield* cursors.save("direct", RELAY, 600n)
      expect(yield* replay.advance("direct", RELAY, o.seq, 600n)).toBe("superseded")
      const o2 = yield* replay.load("direct", RELAY)
      expect(o2?.from).toBe(320n)
      if (o2 === undefined) return

      // the replay reached the stored cursor: cleared; the cursor is untouched
      expect(yield* replay.advance("direct", RELAY, o2.seq, 600n)).toBe("cleared")
      expect(yield* replay.load("direct", RELAY)).toBeUndefined()
      expect(yield* cursors.load("direct", RELAY)).toBe(600n)
      // nothing left: a late advance changes nothing
      expect(yield* replay.advance("direct", RELAY, o2.seq, 700n)).toBe("superseded")
    }).pipe(Effect.provide(CursorStore.layerSql), Effect.provide(Db.layer())))
})
