/**
 * Persistence of webhook records, tombstones and owner generations (SPEC §3.4), behind a Tag with
 * a PostgreSQL and an in-memory implementation. Every call made inside `Tx.withTransaction` joins
 * the transaction (PostgreSQL). Reads are by key, never scans, except `loadActive` at startup,
 * `ownerRows` for one owner and `requestRoomReconciles` (bounded ranges of a partial index).
 *
 * The owner's snapshot rev (SPEC §3.4, §5.3 step 2: the rev of its latest snapshot, completed or in
 * progress, stored by reconciliation) fences live writes in `bumpGeneration`, the statement that
 * already touches the owner row: a write whose rev is not strictly greater bumps nothing and is
 * ignored by the caller.
 *
 * The key's entry among the owner's refused records (`RejectedStore`, SPEC §8.5) is kept by the
 * same writes, inside statements they run anyway (no extra round trip): `upsert` (a valid version)
 * and `remove` (a delete) clear it, `remove` with a refusal (an invalid version, or one over an
 * admission limit) records it. A swap's admission of an owner's stored rows (`Registry.swapOwner`)
 * is remembered by `recordSwap`, one statement per swap. The in-memory store keeps the entries in
 * its state (`rejected`).
 *
 * What a row can hold ({@link isStorableRow}): PostgreSQL refuses a NUL in `text` and `jsonb`, and a
 * lone surrogate in `jsonb` (`JSON.stringify` escapes it; a `text` parameter would silently become
 * U+FFFD). Its writers (the registry stream, reconciliation) check a row before they write it and
 * refuse one that fails as `unstorable`, so that such a record is a refusal, never a failed write.
 *
 * The cap of an owner's stored records on the registry stream (`Registry`, `RECONCILE_MAX_RECORDS`)
 * is read by `get` when asked and the key has no row: a count of the owner's rows that stops at
 * the cap (`SELECT 1 … ORDER BY rkey LIMIT cap`: the primary key `(owner_did, rkey)` read in order,
 * so the scan stops at the cap whatever the plan's estimates), in the statement that
 * reads the key's tombstone (no extra round trip). It is exact for the write that follows in the
 * same transaction: every writer of an owner's rows (a live write, a scan's page, its deletes and
 * completion) holds the owner row lock (`lockOwner`, `FOR UPDATE`) while it writes them.
 *
 * The load order ({@link RegistryStoreShape.loadActive}): active rows by `(created_at, owner_did,
 * rkey)`, oldest first; an owner's candidates are its first `ownerMax` active rows in that order
 * (`created_at`, then `rkey`), the rest are never read, so one owner's excess cannot push other
 * owners' rows out of a bounded load. `ownerRows` reads an owner's rows in the same order.
 */
import * as SqlClient from "@effect/sql/SqlClient"
import { Clock, Context, Effect, Layer, Ref } from "effect"
import type { Operation } from "../../schemas/RecordEvent.js"
import { compareTid } from "../../schemas/Tid.js"
import type { WhRecord } from "../../schemas/WhRecord.js"
import type { SigningMode } from "../matching/WebhookIndex.js"
import { KEY_TEXT_FORMAT } from "../operator/ListKey.js"
import { type StoreError, storeOp, storeOpWithin } from "../platform/Persistence.js"
import {
  clearCte,
  memoryClear,
  memoryRecord,
  type MemoryRejected,
  memoryRoomRequest,
  memorySwap,
  recordCtes,
  type RefusedVersion,
  type RoomFreed,
  roomRequestStatement,
  type SwapOutcome,
  swapStatement
} from "./RejectedStore.js"

/** Loading a page of active registrations at startup (up to 1,000,001 rows) may take a while. */
const LOAD_TIMEOUT = "10 minutes"

/** A NUL, or a surrogate that is not half of a pair (the regex reads UTF-16 code units). */
const UNSTORABLE = /\u0000|[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/

/** Whether PostgreSQL can store the string in `text` and `jsonb` unchanged: no NUL, no lone surrogate. */
export const isStorableText = (s: string): boolean => !UNSTORABLE.test(s)

/** Every string of a JSON value (keys too) {@link isStorableText}. */
const isStorableJson = (v: unknown): boolean => {
  if (typeof v === "string") return isStorableText(v)
  if (Array.isArray(v)) return v.every(isStorableJson)
  if (typeof v !== "object" || v === null) return true
  return Object.entries(v).every(([key, value]) => isStorableText(key) && isStorableJson(value))
}

/**
 * Whether PostgreSQL can store the row: no NUL and no lone surrogate in any string of its record
 * (the columns derived from it too: url, scope, secret id) or in its cid. The one check of both
 * writers (the registry stream and reconciliation), which refuse such a version as `unstorable`.
 */
export const isStorableRow = (row: WebhookRow): boolean =>
  isStorableJson(row.record) && (row.cid === undefined || isStorableText(row.cid))

export interface WebhookRow {
  readonly ownerDid: string
  readonly rkey: string
  readonly rev: string
  readonly generation: number
  readonly cid: string | undefined
  readonly record: WhRecord
  readonly scopeUri: string
  readonly scopeDid: string
  readonly backlinks: boolean
  readonly url: string
  /** empty = all */
  readonly events: ReadonlyArray<Operation>
  readonly enabled: boolean
  readonly active: boolean
  readonly signingMode: SigningMode
  readonly secretId: string | undefined
  readonly fingerprint: string
  readonly gone: boolean
  /**
   * Auto-disabled by its failure streak (SPEC §4.3; `webhooks.auto_disabled_at`, written by the
   * delivery workers): set by the PostgreSQL store's reads only, absent elsewhere.
   */
  readonly autoDisabled?: boolean
}

export interface Tombstone {
  readonly rev: string
  readonly generation: number
}

/** Where a load page ended (opaque: the next page starts after it). */
export interface LoadPosition {
  readonly at: string
  readonly ownerDid: string
  readonly rkey: string
}

/** A row as the load reads it, with its place in the load order. */
export interface LoadedRow extends WebhookRow {
  readonly position: LoadPosition
}

export interface LoadOptions {
  /** read only each owner's first `ownerMax` active rows (created_at, rkey) */
  readonly ownerMax?: number | undefined
  /** start after this row (the position of the previous page's last row) */
  readonly after?: LoadPosition | undefined
}

export type ReconcileStatus = "unknown" | "scanning" | "complete" | "failed"

/** A stored `owners.reconcile_status`; anything else (or none) is `unknown`. */
export const toReconcileStatus = (s: string | null): ReconcileStatus =>
  s === "scanning" || s === "complete" || s === "failed" ? s : "unknown"

export interface OwnerState {
  readonly did: string
  readonly generation: number
  readonly status: ReconcileStatus
  /** the rev of the owner's latest snapshot, completed or in progress (none: never scanned) */
  readonly snapshotRev: string | undefined
  /** the token of the owner's latest scan (`owners.scan_generation`; none: never scanned, or unknown) */
  readonly scanGeneration?: number | undefined
  /** the rev of the owner's latest completed snapshot (none: no scan completed, or unknown) */
  readonly completedSnapshotRev?: string | undefined
}

/** What `get` reads of one record key. */
export interface KeyState {
  readonly row: WebhookRow | undefined
  readonly tombstone: Tombstone | undefined
  /**
   * the owner's stored rows (active or not), counted up to the `countUpTo` asked: only when asked
   * and the key has no row (a write of it would add one), else undefined
   */
  readonly ownerRecords?: number | undefined
}

export interface RegistryStoreShape {
  /**
   * the row and tombstone of one record key; with `countUpTo`, when the key has no row, also the
   * owner's stored rows counted up to it (run it holding the owner's lock: `lockOwner`)
   */
  readonly get: (ownerDid: string, rkey: string, countUpTo?: number) => Effect.Effect<KeyState, StoreError>
  /**
   * lock the owner's row for the rest of the transaction (creating it if needed), so a live write and a
   * reconciliation completion of the same owner never interleave
   */
  readonly lockOwner: (ownerDid: string) => Effect.Effect<void, StoreError>
  /**
   * Bump the owner's generation (creating the owner, marked as seen on the stream) for a live write
   * at `rev`, and return the new one; or, when `rev` is not strictly greater than the owner's
   * snapshot rev, change nothing and return `undefined` (the write is fenced: SPEC §3.4).
   */
  readonly bumpGeneration: (ownerDid: string, rev: string) => Effect.Effect<number | undefined, StoreError>
  /**
   * write the row (insert or replace), drop the key's tombstone, and clear the key's refused-record
   * entry if it is not newer than the row
   */
  readonly upsert: (row: WebhookRow) => Effect.Effect<void, StoreError>
  /**
   * delete the row (if any) and write a tombstone at `rev` / `generation`; then record `refused`
   * (the version refused at that rev, seen on the stream), or without it clear the key's
   * refused-record entry if it is not newer
   */
  readonly remove: (
    ownerDid: string,
    rkey: string,
    tombstone: Tombstone,
    refused?: Omit<RefusedVersion, "rkey">
  ) => Effect.Effect<void, StoreError>
  /**
   * Active rows in the load order (oldest first: `created_at`, owner, rkey), at most `limit`; with
   * `ownerMax`, only each owner's first `ownerMax` active rows (ranked among all of the owner's
   * active rows, whatever page they fall on); with `after`, the rows after that position.
   */
  readonly loadActive: (limit: number, options?: LoadOptions) => Effect.Effect<ReadonlyArray<LoadedRow>, StoreError>
  /** count of active rows */
  readonly countActive: Effect.Effect<number, StoreError>
  /** every row of one owner, in the load order (`created_at`, rkey; for reconciliation swaps) */
  readonly ownerRows: (ownerDid: string) => Effect.Effect<ReadonlyArray<WebhookRow>, StoreError>
  readonly owner: (ownerDid: string) => Effect.Effect<OwnerState | undefined, StoreError>
  /**
   * Mark the subscription gone (410) until its record changes. Only while the stored registration
   * still has `fingerprint` (the one the 410 answered): a record changed since the delivery was
   * enqueued is a new subscription and stays. True when it was marked.
   */
  readonly markGone: (ownerDid: string, rkey: string, fingerprint: string) => Effect.Effect<boolean, StoreError>
  /**
   * A live write freed room under admission limits (`freed`): request a reconciliation of the
   * owners whose refused records it may admit (`RejectedStore.roomRequestStatement`: the stamp
   * `owners.reconcile_requested_at`, in the caller's transaction); the owners stamped.
   */
  readonly requestRoomReconciles: (freed: RoomFreed) => Effect.Effect<ReadonlyArray<string>, StoreError>
  /**
   * Remember what a swap decided about the owner's active rows (`RejectedStore.swapStatement`:
   * the refused recorded with source `reconciliation`, the admitted keys' entries cleared), in one
   * statement under its own savepoint: a failure leaves the caller's transaction usable.
   */
  readonly recordSwap: (ownerDid: string, outcome: SwapOutcome) => Effect.Effect<void, StoreError>
}

export class RegistryStore extends Context.Tag("firehook/RegistryStore")<RegistryStore, RegistryStoreShape>() {}

// ---------------------------------------------------------------------------------------------
// PostgreSQL

/** Every column a webhook row is written with (the registry's and the reconciliation's upserts). */
export const WEBHOOK_COLUMNS =
  "owner_did, rkey, rev, generation, cid, record, scope_uri, scope_did, backlinks, url, events, enabled, active, signing_mode, secret_id, fingerprint, gone_at"

interface DbRow {
  readonly owner_did: string
  readonly rkey: string
  readonly rev: string
  readonly generation: string | number
  readonly cid: string | null
  readonly record: unknown
  readonly scope_uri: string
  readonly scope_did: string
  readonly backlinks: boolean
  readonly url: string
  readonly events: ReadonlyArray<string>
  readonly enabled: boolean
  readonly active: boolean
  readonly signing_mode: string
  readonly secret_id: string | null
  readonly fingerprint: string
  readonly gone_at: unknown
  /** read by `SELECT *` (migration 0009); not one of {@link WEBHOOK_COLUMNS} */
  readonly auto_disabled_at?: unknown
}

/** A key's tombstone as `get` reads it (none: nulls from the outer join), with the owner's count if asked. */
interface TombRow {
  readonly rev: string | null
  readonly generation: string | number | null
  readonly owner_records?: string | number
}

const OPS: ReadonlySet<string> = new Set(["create", "update", "delete"])
const isOperation = (s: string): s is Operation => OPS.has(s)
/** A stored `signing_mode`; anything else (or none) is `none`. */
export const toSigningMode = (
  s: string | null
): SigningMode => (s === "record_secret" || s === "secret_id" ? s : "none")
const parseJson = (v: unknown): unknown => (typeof v === "string" ? JSON.parse(v) : v)

/** Rows come from our own validated writes; the record column holds the validated clean copy. */
const fromDb = (r: DbRow): WebhookRow => ({
  ownerDid: r.owner_did,
  rkey: r.rkey,
  rev: r.rev,
  generation: Number(r.generation),
  cid: r.cid ?? undefined,
  record: parseJson(r.record) as WhRecord,
  scopeUri: r.scope_uri,
  scopeDid: r.scope_did,
  backlinks: r.backlinks,
  url: r.url,
  events: r.events.filter(isOperation),
  enabled: r.enabled,
  active: r.active,
  signingMode: toSigningMode(r.signing_mode),
  secretId: r.secret_id ?? undefined,
  fingerprint: r.fingerprint,
  gone: r.gone_at !== null && r.gone_at !== undefined,
  ...(r.auto_disabled_at !== null && r.auto_disabled_at !== undefined ? { autoDisabled: true } : {})
})

export const makeSql = Effect.gen(function*() {
  const sql = yield* SqlClient.SqlClient
  const columns = sql.literal(WEBHOOK_COLUMNS)
  const store: RegistryStoreShape = {
    get: (ownerDid, rkey, countUpTo) =>
      Effect.gen(function*() {
        const rows = yield* sql<DbRow>`SELECT * FROM webhooks WHERE owner_did = ${ownerDid} AND rkey = ${rkey}`
        const row = rows[0]
        const count = countUpTo !== undefined && row === undefined
        // counted in the tombstone's statement (one row whether or not there is a tombstone)
        const tombs = yield* (count
          ? sql<TombRow>`
            SELECT t.rev, t.generation, (
              SELECT count(*) FROM (
                SELECT 1 FROM webhooks WHERE owner_did = ${ownerDid} ORDER BY rkey LIMIT ${countUpTo}) o
            )::int AS owner_records
            FROM (SELECT 1) AS one LEFT JOIN tombstones t ON t.owner_did = ${ownerDid} AND t.rkey = ${rkey}`
          : sql<TombRow>`
            SELECT rev, generation FROM tombstones WHERE owner_did = ${ownerDid} AND rkey = ${rkey}`)
        const tomb = tombs[0]
        return {
          row: row === undefined ? undefined : fromDb(row),
          tombstone: tomb === undefined || tomb.rev === null || tomb.generation === null
            ? undefined
            : { rev: tomb.rev, generation: Number(tomb.generation) },
          ownerRecords: count ? Number(tomb?.owner_records ?? 0) : undefined
        }
      }).pipe(storeOp("registry.get")),
    lockOwner: (ownerDid) =>
      Effect.gen(function*() {
        yield* sql`INSERT INTO owners (did, from_stream) VALUES (${ownerDid}, true) ON CONFLICT (did) DO NOTHING`
        yield* sql`SELECT 1 FROM owners WHERE did = ${ownerDid} FOR UPDATE`
      }).pipe(storeOp("registry.lockOwner")),
    bumpGeneration: (ownerDid, rev) =>
      sql<{ generation: string | number }>`
        INSERT INTO owners (did, generation, from_stream) VALUES (${ownerDid}, 1, true)
        ON CONFLICT (did) DO UPDATE SET generation = owners.generation + 1, from_stream = true, updated_at = now()
        WHERE owners.snapshot_rev IS NULL OR owners.snapshot_rev COLLATE "C" < ${rev}
        RETURNING generation`.pipe(
        Effect.map((rows) => (rows[0] === undefined ? undefined : Number(rows[0].generation))),
        storeOp("registry.bumpGeneration")
      ),
    upsert: (row) =>
      Effect.gen(function*() {
        yield* sql`
          INSERT INTO webhooks (${columns})
          VALUES (${row.ownerDid}, ${row.rkey}, ${row.rev}, ${row.generation}, ${row.cid ?? null},
            ${JSON.stringify(row.record)}::jsonb, ${row.scopeUri}, ${row.scopeDid}, ${row.backlinks}, ${row.url},
            string_to_array(${row.events.join(",")}, ','), ${row.enabled}, ${row.active}, ${row.signingMode},
            ${row.secretId ?? null}, ${row.fingerprint}, NULL)
          ON CONFLICT (owner_did, rkey) DO UPDATE SET
            rev = EXCLUDED.rev, generation = EXCLUDED.generation, cid = EXCLUDED.cid, record = EXCLUDED.record,
            scope_uri = EXCLUDED.scope_uri, scope_did = EXCLUDED.scope_did, backlinks = EXCLUDED.backlinks,
            url = EXCLUDED.url, events = EXCLUDED.events, enabled = EXCLUDED.enabled, active = EXCLUDED.active,
            signing_mode = EXCLUDED.signing_mode, secret_id = EXCLUDED.secret_id,
            fingerprint = EXCLUDED.fingerprint, gone_at = NULL, updated_at = now()`
        yield* sql`
          WITH ${clearCte(sql, row.ownerDid, row.rkey, row.rev)}
          DELETE FROM tombstones WHERE owner_did = ${row.ownerDid} AND rkey = ${row.rkey}`
      }).pipe(storeOp("registry.upsert")),
    remove: (ownerDid, rkey, tombstone, refused) =>
      Effect.gen(function*() {
        yield* sql`DELETE FROM webhooks WHERE owner_did = ${ownerDid} AND rkey = ${rkey}`
        const rejected = refused === undefined
          ? clearCte(sql, ownerDid, rkey, tombstone.rev)
          : recordCtes(sql, ownerDid, tombstone.rev, "stream", [{ ...refused, rkey }])
        yield* sql`
          WITH ${rejected}
          INSERT INTO tombstones (owner_did, rkey, rev, generation, live)
          VALUES (${ownerDid}, ${rkey}, ${tombstone.rev}, ${tombstone.generation}, true)
          ON CONFLICT (owner_did, rkey) DO UPDATE SET rev = EXCLUDED.rev, generation = EXCLUDED.generation,
            live = true, deleted_at = now()`
      }).pipe(storeOp("registry.remove")),
    loadActive: (limit, options = {}) => {
      const after = options.after
      const ranked = options.ownerMax === undefined
        ? sql`SELECT * FROM webhooks WHERE active`
        : sql`SELECT *, ROW_NUMBER() OVER (PARTITION BY owner_did ORDER BY created_at, rkey) AS owner_rank
            FROM webhooks WHERE active`
      return sql<DbRow & { readonly load_at: string }>`
        SELECT *, to_char(w.created_at AT TIME ZONE 'UTC', ${KEY_TEXT_FORMAT}) AS load_at FROM (${ranked}) w
        WHERE ${options.ownerMax === undefined ? sql`true` : sql`w.owner_rank <= ${options.ownerMax}`}
          AND ${
        after === undefined
          ? sql`true`
          : sql`(w.created_at, w.owner_did, w.rkey) > (${after.at}::timestamptz, ${after.ownerDid}, ${after.rkey})`
      }
        ORDER BY w.created_at, w.owner_did, w.rkey
        LIMIT ${limit}`.pipe(
        Effect.map((rows) =>
          rows.map((r): LoadedRow => ({
            ...fromDb(r),
            position: { at: r.load_at, ownerDid: r.owner_did, rkey: r.rkey }
          }))
        ),
        storeOpWithin("registry.loadActive", LOAD_TIMEOUT)
      )
    },
    countActive: sql<{ n: string | number }>`SELECT count(*) AS n FROM webhooks WHERE active`.pipe(
      Effect.map((rows) => Number(rows[0]?.n ?? 0)),
      storeOpWithin("registry.countActive", LOAD_TIMEOUT)
    ),
    ownerRows: (ownerDid) =>
      sql<DbRow>`SELECT * FROM webhooks WHERE owner_did = ${ownerDid} ORDER BY created_at, rkey`.pipe(
        Effect.map((rows) => rows.map(fromDb)),
        storeOp("registry.ownerRows")
      ),
    owner: (ownerDid) =>
      sql<{
        did: string
        generation: string | number
        reconcile_status: string
        snapshot_rev: string | null
        scan_generation: string | number | null
        completed_snapshot_rev: string | null
      }>`
        SELECT did, generation, reconcile_status, snapshot_rev, scan_generation, completed_snapshot_rev
        FROM owners WHERE did = ${ownerDid}`.pipe(
        Effect.map((rows) => {
          const r = rows[0]
          if (r === undefined) return undefined
          return {
            did: r.did,
            generation: Number(r.generation),
            status: toReconcileStatus(r.reconcile_status),
            snapshotRev: r.snapshot_rev ?? undefined,
            scanGeneration: r.scan_generation === null ? undefined : Number(r.scan_generation),
            completedSnapshotRev: r.completed_snapshot_rev ?? undefined
          }
        }),
        storeOp("registry.owner")
      ),
    markGone: (ownerDid, rkey, fingerprint) =>
      sql<{ rkey: string }>`UPDATE webhooks SET gone_at = now()
        WHERE owner_did = ${ownerDid} AND rkey = ${rkey} AND fingerprint = ${fingerprint}
        RETURNING rkey`.pipe(
        Effect.map((rows) => rows.length > 0),
        storeOpWithin("registry.markGone", "15 seconds")
      ),
    requestRoomReconciles: (freed) =>
      roomRequestStatement(sql, freed).pipe(
        Effect.map((rows) => rows.map((r) => r.did).sort()),
        storeOp("registry.requestRoomReconciles")
      ),
    recordSwap: (ownerDid, outcome) =>
      outcome.refused.length === 0 && outcome.admitted.length === 0
        ? Effect.void
        : swapStatement(sql, ownerDid, outcome).pipe(sql.withTransaction, Effect.asVoid, storeOp("registry.recordSwap"))
  }
  return store
})

export const layerSql = Layer.effect(RegistryStore, makeSql)

// ---------------------------------------------------------------------------------------------
// In memory (tests and embedding). Counts calls so tests can assert on store traffic.

export interface MemoryRegistryState {
  readonly rows: Map<string, WebhookRow>
  readonly tombstones: Map<string, Tombstone>
  /** an owner's `snapshotRev` is set by whoever reconciles in memory (e.g. a test) */
  readonly owners: Map<string, OwnerState>
  readonly order: Map<string, number>
  seq: number
  /** the refused-record entries (`RejectedStore.makeMemoryOver(state.rejected)` reads them) */
  readonly rejected: MemoryRejected
  /** owners with a pending reconciliation request (`requestRoomReconciles`; a scan is whoever's clears it) */
  readonly reconcileRequested: Set<string>
}

/** A new, empty in-memory state. */
export const emptyMemoryState = (): MemoryRegistryState => ({
  rows: new Map(),
  tombstones: new Map(),
  owners: new Map(),
  order: new Map(),
  seq: 0,
  rejected: new Map(),
  reconcileRequested: new Set()
})

const k = (ownerDid: string, rkey: string) => `${ownerDid}/${rkey}`

/** The owner's rows, counted up to `upTo` (one pass over the rows at most). */
const countOwnerRows = (s: MemoryRegistryState, ownerDid: string, upTo: number): number => {
  let n = 0
  for (const r of s.rows.values()) {
    if (n >= upTo) break
    if (r.ownerDid === ownerDid) n++
  }
  return n
}

/** The rows in insertion order (the memory store's created_at). */
const inLoadOrder = (s: MemoryRegistryState): Array<[string, WebhookRow]> =>
  [...s.rows.entries()].sort(([a], [b]) => (s.order.get(a) ?? 0) - (s.order.get(b) ?? 0))

/** The in-memory store over `state` (which a test may read or seed). */
export const makeMemoryOver = (state: Ref.Ref<MemoryRegistryState>): RegistryStoreShape => {
  const store: RegistryStoreShape = {
    get: (ownerDid, rkey, countUpTo) =>
      Ref.get(state).pipe(
        Effect.map((s): KeyState => {
          const row = s.rows.get(k(ownerDid, rkey))
          return {
            row,
            tombstone: s.tombstones.get(k(ownerDid, rkey)),
            ownerRecords: countUpTo === undefined || row !== undefined
              ? undefined
              : countOwnerRows(s, ownerDid, countUpTo)
          }
        })
      ),
    lockOwner: () => Effect.void,
    bumpGeneration: (ownerDid, rev) =>
      Ref.modify(state, (s) => {
        const prev = s.owners.get(ownerDid)
        const snapshotRev = prev?.snapshotRev
        if (snapshotRev !== undefined && compareTid(rev, snapshotRev) <= 0) return [undefined, s]
        const generation = (prev?.generation ?? 0) + 1
        s.owners.set(ownerDid, { ...prev, did: ownerDid, generation, status: prev?.status ?? "unknown", snapshotRev })
        return [generation, s]
      }),
    upsert: (row) =>
      Ref.update(state, (s) => {
        const key = k(row.ownerDid, row.rkey)
        if (!s.order.has(key)) s.order.set(key, s.seq++)
        s.rows.set(key, { ...row, gone: false })
        s.tombstones.delete(key)
        memoryClear(s.rejected, row.ownerDid, row.rkey, row.rev)
        return s
      }),
    remove: (ownerDid, rkey, tombstone, refused) =>
      Effect.flatMap(Clock.currentTimeMillis, (now) =>
        Ref.update(state, (s) => {
          const key = k(ownerDid, rkey)
          s.rows.delete(key)
          s.order.delete(key)
          s.tombstones.set(key, tombstone)
          if (refused === undefined) memoryClear(s.rejected, ownerDid, rkey, tombstone.rev)
          else {memoryRecord(
              s.rejected,
              { ...refused, ownerDid, rkey, rev: tombstone.rev, source: "stream" },
              new Date(now)
            )}
          return s
        })),
    loadActive: (limit, options = {}) =>
      Ref.get(state).pipe(
        Effect.map((s) => {
          // the insertion sequence stands for created_at (kept by an update, as the column is)
          const after = options.after === undefined ? -1 : Number(options.after.at)
          const ranks = new Map<string, number>()
          const out: Array<LoadedRow> = []
          for (const [key, r] of inLoadOrder(s)) {
            if (!r.active) continue
            const rank = (ranks.get(r.ownerDid) ?? 0) + 1
            ranks.set(r.ownerDid, rank)
            const seq = s.order.get(key) ?? 0
            if ((options.ownerMax !== undefined && rank > options.ownerMax) || seq <= after) continue
            if (out.length >= limit) break
            out.push({ ...r, position: { at: String(seq), ownerDid: r.ownerDid, rkey: r.rkey } })
          }
          return out
        })
      ),
    countActive: Ref.get(state).pipe(Effect.map((s) => [...s.rows.values()].filter((r) => r.active).length)),
    ownerRows: (ownerDid) =>
      Ref.get(state).pipe(
        Effect.map((s) => inLoadOrder(s).filter(([, r]) => r.ownerDid === ownerDid).map(([, r]) => r))
      ),
    owner: (ownerDid) => Ref.get(state).pipe(Effect.map((s) => s.owners.get(ownerDid))),
    markGone: (ownerDid, rkey, fingerprint) =>
      Ref.modify(state, (s) => {
        const key = k(ownerDid, rkey)
        const row = s.rows.get(key)
        if (row === undefined || row.fingerprint !== fingerprint) return [false, s]
        s.rows.set(key, { ...row, gone: true })
        return [true, s]
      }),
    requestRoomReconciles: (freed) =>
      Ref.modify(state, (s) => {
        const busy = (did: string) => {
          const status = s.owners.get(did)?.status
          return status === "scanning" || status === "failed"
        }
        return [memoryRoomRequest(s.rejected, s.reconcileRequested, busy, freed).sort(), s]
      }),
    recordSwap: (ownerDid, outcome) =>
      Effect.flatMap(Clock.currentTimeMillis, (now) =>
        Ref.update(state, (s) => {
          const stored = (rkey: string, rev: string) => {
            const row = s.rows.get(k(ownerDid, rkey))
            return row !== undefined && row.active && row.rev === rev
          }
          memorySwap(s.rejected, ownerDid, outcome, stored, new Date(now))
          return s
        }))
  }
  return store
}

export const makeMemory = Effect.map(Effect.suspend(() => Ref.make(emptyMemoryState())), makeMemoryOver)

export const layerMemory = Layer.effect(RegistryStore, makeMemory)
