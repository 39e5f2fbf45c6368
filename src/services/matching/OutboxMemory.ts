/**
 * The outbox's in-memory driver ({@link OutboxStore}), for tests and embedding: its state is a
 * `Ref` under {@link MemoryOutboxState}, so a test can read what was written.
 */
import { Context, Effect, Layer, Ref } from "effect"
import type { EventBody, OutboxRow, OutboxStoreShape, QuarantineRow } from "./Outbox.js"

export interface MemoryOutbox {
  readonly events: Map<string, EventBody>
  readonly rows: Map<string, OutboxRow>
  readonly quarantine: Array<QuarantineRow>
  notifications: number
}

export class MemoryOutboxState extends Context.Tag("firehook/MemoryOutboxState")<
  MemoryOutboxState,
  Ref.Ref<MemoryOutbox>
>() {}

/**
 * Put a row unless its delivery id has one; a row of another fingerprint is replaced (as the SQL
 * store moves an untried row to the new version: nothing here is ever tried). Whether it counts:
 * once per id per call (`putIds`: the ids this call put), as one SQL statement. The rows here have
 * no delivery state (no status, lease or attempt), so the SQL store's other cases have no
 * counterpart: a row cancelled `subscription_changed` revived whatever its fingerprint (a row of
 * the same fingerprint here is a duplicate), and a leased row's pending move (`moved_to`).
 */
const put = (s: MemoryOutbox, r: OutboxRow, putIds: Set<string>): boolean => {
  const prev = s.rows.get(r.deliveryId)
  if (prev !== undefined && prev.fingerprint === r.fingerprint) return false
  s.rows.set(r.deliveryId, r)
  if (putIds.has(r.deliveryId)) return false
  putIds.add(r.deliveryId)
  return true
}

/** The store over the {@link MemoryOutboxState} it is given. */
export const makeMemory = Effect.gen(function*() {
  const state = yield* MemoryOutboxState
  const store: OutboxStoreShape = {
    insertEvents: (bodies) =>
      Ref.modify(state, (s) => {
        const out = new Map<string, string>()
        for (const b of bodies) {
          const prev = s.events.get(b.eventId)
          if (prev === undefined) s.events.set(b.eventId, b)
          else out.set(b.eventId, prev.sha256)
        }
        return [out, s]
      }),
    insertRows: (rows) =>
      Ref.modify(state, (s) => {
        let n = 0
        const putIds = new Set<string>()
        for (const r of rows) if (put(s, r, putIds)) n++
        return [n, s]
      }),
    insertQuarantine: (rows) =>
      Ref.update(state, (s) => {
        s.quarantine.push(...rows)
        return s
      }),
    notify: Ref.update(state, (s) => {
      s.notifications++
      return s
    }),
    insertBatch: (bodies, rows) =>
      Ref.modify(state, (s) => {
        const existing = new Map<string, string>()
        const sha = new Map<string, string>()
        for (const b of bodies) {
          sha.set(b.eventId, b.sha256)
          const prev = s.events.get(b.eventId)
          if (prev === undefined) s.events.set(b.eventId, b)
          else existing.set(b.eventId, prev.sha256)
        }
        let inserted = 0
        const putIds = new Set<string>()
        for (const r of rows) {
          const stored = existing.get(r.eventId) ?? sha.get(r.eventId)
          if (stored === undefined || stored !== sha.get(r.eventId)) continue
          if (put(s, r, putIds)) inserted++
        }
        if (inserted > 0) s.notifications++
        return [{ existing, inserted }, s]
      })
  }
  return store
})

/** A fresh, empty {@link MemoryOutboxState} per build. */
export const layerState = Layer.effect(
  MemoryOutboxState,
  Effect.suspend(() => Ref.make<MemoryOutbox>({ events: new Map(), rows: new Map(), quarantine: [], notifications: 0 }))
)
