/**
 * The records firehook saw and refused, per owner (SPEC §8.5 `list`, state `rejected`), so that an
 * owner can learn why a webhook never fires. One entry per record key (owner DID, rkey): what was
 * refused (the version's cid and the repo rev it was seen at; never the record body, its URL or a
 * secret), why ({@link REJECTION_REASONS}: a record error kind of SPEC §1, the admission limit of
 * §2.6 that refused it, or the cap of the owner's stored records), where it was seen (the registry
 * stream or a reconciliation snapshot) and when (first and last seen).
 *
 * Rules, in every driver:
 * - Fenced by rev like the registry's writes: a refusal at rev R replaces the key's entry only if
 *   the entry is not newer (entry rev ≤ R); a clear at R (an accepted version, a delete, a snapshot
 *   that no longer holds the key) drops the entry only if it is not newer than R. An older replay
 *   never overwrites a newer state.
 * - `first_seen_at` stays while the key's entry lives (the key has been refused since then, even
 *   if by another version or for another reason); `last_seen_at` is the latest sighting.
 * - Bounded: an owner keeps its newest {@link REJECTED_LIMITS}`.perOwner` entries (newest = last
 *   seen, then rev, then rkey); a write beyond drops the oldest in the same statement. The table
 *   as a whole is bounded by maintenance (age and `maxRows`).
 *
 * The writers fold these statements into statements they run anyway, so recording costs no extra
 * round trip on the stream and clearing none at all: the registry stream's writes
 * (`RegistryStore.upsert` clears, `RegistryStore.remove` records or clears, inside the intake
 * batch's transaction) and reconciliation's (`ReconcileStore.applyPage` records and clears a page,
 * `complete` clears what the snapshot no longer holds). `record` and `clear` run them alone.
 */
import * as SqlClient from "@effect/sql/SqlClient"
import type { Fragment } from "@effect/sql/Statement"
import { Clock, Context, Effect, Layer } from "effect"
import { WH_RECORD_ERROR_KINDS } from "../../schemas/WhRecord.js"
import { type StoreError, storeOp } from "../platform/Persistence.js"
import { ADMISSION_LIMITS, type AdmissionLimit, type IndexLimit } from "./RegistryConfig.js"

/** The reason of a refusal that an admission limit made: `limit_<limit>`. */
export type AdmissionReason = `limit_${AdmissionLimit}`
export const admissionReason = (limit: AdmissionLimit): AdmissionReason => `limit_${limit}`

/**
 * Why a record was refused: a record error kind (SPEC §1), an admission limit (SPEC §2.6,
 * `limit_*`; `limit_owner_records`: a new key of an owner who already has `RECONCILE_MAX_RECORDS`
 * stored records, refused by the registry stream), or `unstorable` (a valid record PostgreSQL
 * cannot store: a NUL or a lone surrogate in a string, which reconciliation omits).
 */
export const REJECTION_REASONS = [
  ...WH_RECORD_ERROR_KINDS,
  ...ADMISSION_LIMITS.map(admissionReason),
  "unstorable"
] as const
export type RejectionReason = (typeof REJECTION_REASONS)[number]

/** Where a refusal was seen. */
export const REJECTION_SOURCES = ["stream", "reconciliation"] as const
export type RejectionSource = (typeof REJECTION_SOURCES)[number]

export const REJECTED_LIMITS = {
  /** entries kept per owner (SPEC §8.5: the newest 100) */
  perOwner: 100,
  /** the table's row bound, kept by maintenance */
  maxRows: 1_000_000
} as const

/** One refused version of one key, without its owner (a page's refusals share it). */
export interface RefusedVersion {
  readonly rkey: string
  readonly cid: string | undefined
  readonly reason: RejectionReason
}

/** A refusal as written. */
export interface Refusal extends RefusedVersion {
  readonly ownerDid: string
  /**
   * The repo rev the refused version was seen at: the commit's rev on the stream, the snapshot's
   * rev in reconciliation (the repo held the version at that rev). It fences the entry.
   */
  readonly rev: string
  readonly source: RejectionSource
}

/** An entry as read. */
export interface RejectedRecord {
  readonly ownerDid: string
  readonly rkey: string
  readonly rev: string
  readonly cid: string | undefined
  /** one of {@link REJECTION_REASONS} (a newer version of firehook may have written another) */
  readonly reason: string
  readonly source: RejectionSource
  readonly firstSeenAt: Date
  readonly lastSeenAt: Date
}

export interface RejectedStoreShape {
  /** The owner's entries, newest first, at most `limit` (1..perOwner, default perOwner). */
  readonly list: (ownerDid: string, limit?: number) => Effect.Effect<ReadonlyArray<RejectedRecord>, StoreError>
  /** Record a refusal (fenced; keeps the owner's newest entries). False = an entry newer than it stays. */
  readonly record: (refusal: Refusal) => Effect.Effect<boolean, StoreError>
  /** Drop the key's entry if it is not newer than `rev` (the owner fixed or deleted the record). */
  readonly clear: (ownerDid: string, rkey: string, rev: string) => Effect.Effect<boolean, StoreError>
}

export class RejectedStore extends Context.Tag("firehook/RejectedStore")<RejectedStore, RejectedStoreShape>() {}

const clampLimit = (limit: number | undefined): number =>
  Math.max(1, Math.min(REJECTED_LIMITS.perOwner, Math.floor(limit ?? REJECTED_LIMITS.perOwner)))

// ---------------------------------------------------------------------------------------------
// PostgreSQL: statement parts that other statements embed (one home for this table's SQL)

/**
 * Data-modifying CTEs (`rejected_input`, `rejected_written`, `rejected_trimmed`) that record
 * `refused` (one owner, one source; each at its own `rev` if it has one, else at `rev`): the fenced
 * upsert, then the owner's oldest entries beyond the bound. `guard`, if given, is a condition on the
 * input row `i` (`i.rkey`, `i.rev`; e.g. "no newer state of the key is stored"); a refusal failing
 * it is not written.
 */
export const recordCtes = (
  sql: SqlClient.SqlClient,
  ownerDid: string,
  rev: string,
  source: RejectionSource,
  refused: ReadonlyArray<RefusedVersion & { readonly rev?: string | undefined }>,
  guard?: Fragment
) =>
  sql`rejected_input AS (
      SELECT rkey, cid, reason, COALESCE(rev, ${rev}) AS rev FROM jsonb_to_recordset(${
    JSON.stringify(refused.map((r) => ({ rkey: r.rkey, cid: r.cid ?? null, reason: r.reason, rev: r.rev ?? null })))
  }::jsonb) AS i(rkey text, cid text, reason text, rev text)
    ), rejected_written AS (
      INSERT INTO rejected_records (owner_did, rkey, rev, cid, reason, source)
      SELECT ${ownerDid}, i.rkey, i.rev, i.cid, i.reason, ${source} FROM rejected_input i
      WHERE ${guard ?? sql`true`}
      ON CONFLICT (owner_did, rkey) DO UPDATE SET
        rev = EXCLUDED.rev, cid = EXCLUDED.cid, reason = EXCLUDED.reason, source = EXCLUDED.source,
        last_seen_at = now()
      WHERE rejected_records.rev <= EXCLUDED.rev
      RETURNING rkey
    ), rejected_trimmed AS (
      DELETE FROM rejected_records r
      WHERE r.owner_did = ${ownerDid} AND r.rkey IN (
        SELECT x.rkey FROM rejected_records x
        WHERE x.owner_did = ${ownerDid} AND x.rkey NOT IN (SELECT rkey FROM rejected_written)
        ORDER BY x.last_seen_at DESC, x.rev DESC, x.rkey DESC
        OFFSET GREATEST(0, ${REJECTED_LIMITS.perOwner} - (SELECT count(*) FROM rejected_written)))
      RETURNING 1
    )`

/** A data-modifying CTE (`rejected_cleared`) dropping the key's entry if it is not newer than `rev`. */
export const clearCte = (sql: SqlClient.SqlClient, ownerDid: string, rkey: string, rev: string) =>
  sql`rejected_cleared AS (
      DELETE FROM rejected_records WHERE owner_did = ${ownerDid} AND rkey = ${rkey} AND rev <= ${rev}
      RETURNING 1
    )`

/**
 * The owner's entries older than `rev` (a completed snapshot at `rev` no longer holds their keys:
 * the ones it still refused were recorded again at `rev`). At most `perOwner` rows.
 */
export const clearOlderStatement = (sql: SqlClient.SqlClient, ownerDid: string, rev: string) =>
  sql`DELETE FROM rejected_records WHERE owner_did = ${ownerDid} AND rev < ${rev}`

/** A stored row that a registry swap refused for an admission limit, at the row's rev. */
export interface SwapRefusal extends RefusedVersion {
  readonly rev: string
}

/** A stored row that a registry swap admitted (its key's entry, if not newer, is cleared). */
export interface SwapAdmission {
  readonly rkey: string
  readonly rev: string
}

/** What a registry swap (`Registry.swapOwner`) decided about one owner's active rows. */
export interface SwapOutcome {
  readonly refused: ReadonlyArray<SwapRefusal>
  readonly admitted: ReadonlyArray<SwapAdmission>
}

/**
 * One statement recording what a registry swap decided (source `reconciliation`): the refusals
 * through {@link recordCtes} (at most `perOwner` of them, in the order given: the bound of the
 * owner's entries), each only while the row it refused is still the key's stored active version
 * (the same rev); and the entries of the admitted keys dropped if not newer than the admitted row.
 * Idempotent: a repeat changes only `last_seen_at`. Its size is the owner's active rows.
 */
export const swapStatement = (sql: SqlClient.SqlClient, ownerDid: string, outcome: SwapOutcome) => {
  const refused = outcome.refused.slice(0, REJECTED_LIMITS.perOwner)
  const admitted = JSON.stringify(outcome.admitted.map((a) => ({ rkey: a.rkey, rev: a.rev })))
  const stored = sql`EXISTS (
      SELECT 1 FROM webhooks w WHERE w.owner_did = ${ownerDid} AND w.rkey = i.rkey AND w.rev = i.rev AND w.active)`
  return sql<{ recorded: number; cleared: number }>`
    WITH ${recordCtes(sql, ownerDid, "", "reconciliation", refused, stored)}, swap_admitted AS (
      SELECT * FROM jsonb_to_recordset(${admitted}::jsonb) AS a(rkey text, rev text)
    ), rejected_cleared AS (
      DELETE FROM rejected_records r USING swap_admitted a
      WHERE r.owner_did = ${ownerDid} AND r.rkey = a.rkey AND r.rev <= a.rev
      RETURNING 1
    )
    SELECT (SELECT count(*) FROM rejected_written)::int AS recorded,
      (SELECT count(*) FROM rejected_cleared)::int AS cleared`
}

/** The admission limits that other owners' registrations count towards (SPEC §2.6). */
export type GlobalLimit = Exclude<IndexLimit, "owner">

/** Room a live write freed (see Registry: a count that went down), and what to request for it. */
export interface RoomFreed {
  readonly ownerDid: string
  /** the owner's own limit (its active webhooks): request the owner if it has a `limit_owner` refusal */
  readonly owner: boolean
  /**
   * the cap of the owner's stored records (a stored row was deleted or revoked): request the owner
   * if it has a `limit_owner_records` refusal
   */
  readonly ownerRecords: boolean
  /** global limits: request the owners of the oldest such refusals, at most `othersMax` */
  readonly global: ReadonlyArray<GlobalLimit>
  readonly othersMax: number
}

/**
 * A requested owner: the writer itself (its `limit_owner` or `limit_owner_records` refusal, or its
 * own global one) or another.
 */
export interface RoomRequested {
  readonly did: string
  readonly own: boolean
}

/** Refusals of owners that may be requested taken per global limit at most (oldest first). */
export const ROOM_SCAN_MAX = 1_000

/**
 * Refusal rows read per global limit at most (oldest first) to find {@link ROOM_SCAN_MAX} of owners
 * that may be requested: bounds the statement's cost when the oldest refusals are those of owners
 * left out (failed owners keep theirs up to 30 days).
 */
export const ROOM_READ_MAX = 20 * ROOM_SCAN_MAX

/** The writer's own refusals that `freed` may admit: `limit_owner`, `limit_owner_records`. */
const ownReasonsOf = (freed: RoomFreed): Array<AdmissionReason> => [
  ...(freed.owner ? [admissionReason("owner")] : []),
  ...(freed.ownerRecords ? [admissionReason("owner_records")] : [])
]

/** The reason literals of the partial index `rejected_records_limit_since` (migration 0015). */
const GLOBAL_REASON_SQL: { readonly [K in GlobalLimit]: string } = {
  total: "'limit_total'",
  direct_dids: "'limit_direct_dids'",
  backlink_dids: "'limit_backlink_dids'"
}

/**
 * Request a reconciliation of the owners whose refused records `freed` may now admit, through the
 * owners' reconcile-request stamp (`owners.reconcile_requested_at`, as an `#account` event's:
 * reconciliation/Reactivations.ts): the writer itself if it has a refusal for the own limit freed
 * (`limit_owner`, `limit_owner_records`; its row is already locked by the write; at most `perOwner`
 * entries of the owner read), and for each global limit freed the owners of its oldest refusals
 * (`first_seen_at`: refused the longest), at most `othersMax`, leaving out those already requested,
 * scanning (that scan's swap admits against the index as it is then) or failed (the retry
 * scheduler retries them). These are left out before the `ROOM_SCAN_MAX` oldest refusals per limit
 * are taken (the partial index, read with literal reasons so that the planner can use it, in
 * `first_seen_at` order, each entry's owner checked by its primary key until that many are found):
 * before (until 7 December 2026), the refusals were taken first, so the old refusals of ten failed
 * owners (100 each, the per-owner bound) filled the window and no other owner was ever requested.
 * The entries read are bounded by {@link ROOM_READ_MAX} (an index-only read, then each entry's owner
 * by its primary key): without it a limit whose refusals were all of left-out owners read every one
 * of them (500,000: 320 ms), again for each freeing write of a batch (RoomRequests.ts skips a limit
 * that stamped nobody for the rest of its unit). An owner waiting behind more than that many
 * refusals of left-out owners is not requested by freed room: its sweep or a write of its own
 * reconciles it (a known limit, as the 1,000 rows were before). An owner row locked by another
 * transaction (its scan completing, a sync) is skipped, never waited for: no lock order to keep
 * with them. Returns the owners stamped.
 */
export const roomRequestStatement = (sql: SqlClient.SqlClient, freed: RoomFreed) => {
  const ownReasons = ownReasonsOf(freed)
  const own = ownReasons.length > 0
    ? sql`SELECT ${freed.ownerDid}::text AS did WHERE EXISTS (
        SELECT 1 FROM rejected_records WHERE owner_did = ${freed.ownerDid} AND reason IN (${
      // constants of a closed list (never input), as literals like GLOBAL_REASON_SQL's
      sql.literal(ownReasons.map((r) => `'${r}'`).join(", "))}))`
    : sql`SELECT NULL::text AS did WHERE false`
  const oldest = freed.global.length === 0 || freed.othersMax <= 0
    ? sql`SELECT NULL::text AS owner_did, NULL::timestamptz AS first_seen_at WHERE false`
    : sql.join(" UNION ALL ", false)(
      freed.global.map((limit) =>
        sql`(SELECT r.owner_did, r.first_seen_at FROM (
            SELECT owner_did, first_seen_at FROM rejected_records
            WHERE reason = ${sql.literal(GLOBAL_REASON_SQL[limit])}
            ORDER BY first_seen_at LIMIT ${ROOM_READ_MAX}
          ) r
          JOIN owners o ON o.did = r.owner_did
          WHERE o.reconcile_requested_at IS NULL AND o.reconcile_status NOT IN ('scanning', 'failed')
          ORDER BY r.first_seen_at LIMIT ${ROOM_SCAN_MAX})`
      )
    )
  return sql<{ did: string }>`
    WITH own AS (${own}), oldest AS (${oldest}), others AS (
      SELECT owner_did AS did FROM oldest
      GROUP BY owner_did
      ORDER BY min(first_seen_at), owner_did
      LIMIT ${Math.max(0, freed.othersMax)}
    ), locked AS (
      SELECT did FROM owners
      WHERE did IN (SELECT did FROM own UNION SELECT did FROM others) AND reconcile_requested_at IS NULL
      FOR UPDATE SKIP LOCKED
    )
    UPDATE owners SET reconcile_requested_at = now() WHERE did IN (SELECT did FROM locked)
    RETURNING did`
}

interface DbRow {
  readonly owner_did: string
  readonly rkey: string
  readonly rev: string
  readonly cid: string | null
  readonly reason: string
  readonly source: string
  readonly first_seen_at: Date | string
  readonly last_seen_at: Date | string
}

const toDate = (v: Date | string): Date => (v instanceof Date ? v : new Date(v))

const fromDb = (r: DbRow): RejectedRecord => ({
  ownerDid: r.owner_did,
  rkey: r.rkey,
  rev: r.rev,
  cid: r.cid ?? undefined,
  reason: r.reason,
  source: r.source === "reconciliation" ? "reconciliation" : "stream",
  firstSeenAt: toDate(r.first_seen_at),
  lastSeenAt: toDate(r.last_seen_at)
})

export const makeSql = Effect.gen(function*() {
  const sql = yield* SqlClient.SqlClient
  const store: RejectedStoreShape = {
    list: (ownerDid, limit) =>
      sql<DbRow>`
        SELECT owner_did, rkey, rev, cid, reason, source, first_seen_at, last_seen_at FROM rejected_records
        WHERE owner_did = ${ownerDid}
        ORDER BY last_seen_at DESC, rev DESC, rkey DESC
        LIMIT ${clampLimit(limit)}`.pipe(Effect.map((rows) => rows.map(fromDb)), storeOp("rejected.list")),
    record: (r) =>
      sql<{ n: number }>`
        WITH ${recordCtes(sql, r.ownerDid, r.rev, r.source, [r])}
        SELECT count(*)::int AS n FROM rejected_written`.pipe(
        Effect.map((rows) => (rows[0]?.n ?? 0) > 0),
        storeOp("rejected.record")
      ),
    clear: (ownerDid, rkey, rev) =>
      sql<{ n: number }>`
        WITH ${clearCte(sql, ownerDid, rkey, rev)}
        SELECT count(*)::int AS n FROM rejected_cleared`.pipe(
        Effect.map((rows) => (rows[0]?.n ?? 0) > 0),
        storeOp("rejected.clear")
      )
  }
  return store
})

export const layerSql = Layer.effect(RejectedStore, makeSql)

// ---------------------------------------------------------------------------------------------
// In memory: the same rules over a Map (key `<owner> <rkey>`), which the in-memory RegistryStore
// shares (its writes record and clear entries as the PostgreSQL statements do)

export type MemoryRejected = Map<string, RejectedRecord>

const memoryKey = (ownerDid: string, rkey: string) => `${ownerDid} ${rkey}`

/** Newest first: last seen, then rev, then rkey (descending), as the PostgreSQL order. */
const newestFirst = (a: RejectedRecord, b: RejectedRecord): number =>
  b.lastSeenAt.getTime() - a.lastSeenAt.getTime() || (a.rev < b.rev ? 1 : a.rev > b.rev ? -1 : 0) ||
  (a.rkey < b.rkey ? 1 : a.rkey > b.rkey ? -1 : 0)

const ownerEntries = (m: MemoryRejected, ownerDid: string): Array<RejectedRecord> =>
  [...m.values()].filter((e) => e.ownerDid === ownerDid).sort(newestFirst)

/** Record `r` seen at `now` (see the module's rules); false = an entry newer than it stays. */
export const memoryRecord = (m: MemoryRejected, r: Refusal, now: Date): boolean => {
  const k = memoryKey(r.ownerDid, r.rkey)
  const prev = m.get(k)
  if (prev !== undefined && prev.rev > r.rev) return false
  m.set(k, {
    ownerDid: r.ownerDid,
    rkey: r.rkey,
    rev: r.rev,
    cid: r.cid,
    reason: r.reason,
    source: r.source,
    firstSeenAt: prev?.firstSeenAt ?? now,
    lastSeenAt: now
  })
  for (const old of ownerEntries(m, r.ownerDid).slice(REJECTED_LIMITS.perOwner)) {
    m.delete(memoryKey(old.ownerDid, old.rkey))
  }
  return true
}

/**
 * {@link swapStatement} over `m`: `stored(rkey, rev)` whether the key's stored row is active at that
 * rev. Returns how many entries were recorded and cleared.
 */
export const memorySwap = (
  m: MemoryRejected,
  ownerDid: string,
  outcome: SwapOutcome,
  stored: (rkey: string, rev: string) => boolean,
  now: Date
): { readonly recorded: number; readonly cleared: number } => {
  let recorded = 0
  let cleared = 0
  for (const r of outcome.refused.slice(0, REJECTED_LIMITS.perOwner)) {
    if (stored(r.rkey, r.rev) && memoryRecord(m, { ...r, ownerDid, source: "reconciliation" }, now)) recorded++
  }
  for (const a of outcome.admitted) if (memoryClear(m, ownerDid, a.rkey, a.rev)) cleared++
  return { recorded, cleared }
}

/** Drop the key's entry if it is not newer than `rev`. */
export const memoryClear = (m: MemoryRejected, ownerDid: string, rkey: string, rev: string): boolean => {
  const k = memoryKey(ownerDid, rkey)
  const prev = m.get(k)
  if (prev === undefined || prev.rev > rev) return false
  return m.delete(k)
}

/**
 * {@link roomRequestStatement} over `m`: `requested` holds the owners with a pending request,
 * `busy(did)` whether an owner is scanning or failed. Returns the owners added to `requested`.
 */
export const memoryRoomRequest = (
  m: MemoryRejected,
  requested: Set<string>,
  busy: (did: string) => boolean,
  freed: RoomFreed
): Array<string> => {
  const out: Array<string> = []
  const entries = [...m.values()]
  const own = new Set<string>(ownReasonsOf(freed))
  if (entries.some((e) => e.ownerDid === freed.ownerDid && own.has(e.reason))) out.push(freed.ownerDid)
  const reasons = new Set<string>(freed.global.map(admissionReason))
  const since = new Map<string, number>()
  for (const e of entries) {
    if (!reasons.has(e.reason)) continue
    since.set(e.ownerDid, Math.min(since.get(e.ownerDid) ?? Infinity, e.firstSeenAt.getTime()))
  }
  const others = [...since].filter(([did]) => !requested.has(did) && !busy(did))
    .sort(([a, x], [b, y]) => x - y || (a < b ? -1 : a > b ? 1 : 0))
    .slice(0, Math.max(0, freed.othersMax))
  for (const [did] of others) if (!out.includes(did)) out.push(did)
  const stamped = out.filter((did) => !requested.has(did))
  for (const did of stamped) requested.add(did)
  return stamped
}

/** The store over `m` (shared with the in-memory RegistryStore's state, or a fresh Map). */
export const makeMemoryOver = (m: MemoryRejected): RejectedStoreShape => ({
  list: (ownerDid, limit) => Effect.sync(() => ownerEntries(m, ownerDid).slice(0, clampLimit(limit))),
  record: (r) => Effect.map(Clock.currentTimeMillis, (now) => memoryRecord(m, r, new Date(now))),
  clear: (ownerDid, rkey, rev) => Effect.sync(() => memoryClear(m, ownerDid, rkey, rev))
})

export const layerMemory = Layer.sync(RejectedStore, () => makeMemoryOver(new Map()))
