/**
 * The migrations' scripts, in order (the runner is Migrations.ts, which re-exports
 * {@link migrations}). Bundled in code, never read from disk at run time; every table and column is
 * documented in docs/schema.md.
 */
import * as SqlClient from "@effect/sql/SqlClient"
import { Effect } from "effect"
const ddl = (text: string) =>
  Effect.gen(function*() {
    const sql = yield* SqlClient.SqlClient
    yield* sql.unsafe(text)
  })

/** 0001: the whole schema of SPEC §1.3, §2.4, §3.3–3.5, §4.7–4.9 and §5. */
const init = ddl(`
-- §1.3 server-managed secrets
CREATE TABLE secrets (
  owner_did   text        NOT NULL,
  name        text        NOT NULL,
  envelope    text        NOT NULL,
  created_at  timestamptz NOT NULL DEFAULT now(),
  rotated_at  timestamptz,
  PRIMARY KEY (owner_did, name)
);

-- §2.4 prior references of referencing records
CREATE TABLE prior_refs (
  record_uri  text        PRIMARY KEY,
  rev         text        NOT NULL,
  refs        jsonb       NOT NULL,
  bytes       integer     NOT NULL,
  updated_at  timestamptz NOT NULL DEFAULT now(),
  expires_at  timestamptz NOT NULL
);
CREATE INDEX prior_refs_expires_at ON prior_refs (expires_at);

-- §3.3 durable stream cursors, one per (stream, relay)
CREATE TABLE cursors (
  stream      text        NOT NULL,
  relay       text        NOT NULL,
  cursor      bigint      NOT NULL,
  updated_at  timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (stream, relay)
);

-- §5 owners: generation (fencing), reconciliation state, discovery
CREATE TABLE owners (
  did                 text        PRIMARY KEY,
  generation          bigint      NOT NULL DEFAULT 0,
  reconcile_status    text        NOT NULL DEFAULT 'unknown'
                      CHECK (reconcile_status IN ('unknown', 'scanning', 'complete', 'failed')),
  scan_generation     bigint,
  snapshot_rev        text,
  scan_started_at     timestamptz,
  completed_at        timestamptz,
  failed_at           timestamptz,
  failure_count       integer     NOT NULL DEFAULT 0,
  last_failure_kind   text,
  from_stream         boolean     NOT NULL DEFAULT false,
  from_discovery      boolean     NOT NULL DEFAULT false,
  from_operator       boolean     NOT NULL DEFAULT false,
  first_seen_at       timestamptz NOT NULL DEFAULT now(),
  updated_at          timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX owners_retry ON owners (reconcile_status, failed_at) WHERE reconcile_status IN ('failed', 'scanning');

-- §3.4 webhook records (valid records only; disabled ones are stored with active = false)
CREATE TABLE webhooks (
  owner_did         text        NOT NULL,
  rkey              text        NOT NULL,
  rev               text        NOT NULL,
  generation        bigint      NOT NULL,
  cid               text,
  record            jsonb       NOT NULL,
  scope_uri         text        NOT NULL,
  scope_did         text        NOT NULL,
  backlinks         boolean     NOT NULL,
  url               text        NOT NULL,
  events            text[]      NOT NULL,
  enabled           boolean     NOT NULL,
  active            boolean     NOT NULL,
  signing_mode      text        NOT NULL CHECK (signing_mode IN ('none', 'record_secret', 'secret_id')),
  secret_id         text,
  fingerprint       text        NOT NULL,
  gone_at           timestamptz,
  created_at        timestamptz NOT NULL DEFAULT now(),
  updated_at        timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (owner_did, rkey)
);
CREATE INDEX webhooks_scope_did ON webhooks (scope_did) WHERE active;
CREATE INDEX webhooks_owner_generation ON webhooks (owner_did, generation);

-- §3.4 tombstones of deleted webhook records
CREATE TABLE tombstones (
  owner_did   text        NOT NULL,
  rkey        text        NOT NULL,
  rev         text        NOT NULL,
  generation  bigint      NOT NULL,
  deleted_at  timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (owner_did, rkey)
);
CREATE INDEX tombstones_deleted_at ON tombstones (deleted_at);

-- §3.3 quarantined input (hashes and reason only)
CREATE TABLE quarantine (
  id          bigserial   PRIMARY KEY,
  stream      text        NOT NULL,
  relay       text        NOT NULL,
  reason      text        NOT NULL,
  event_hash  text        NOT NULL,
  cursor      bigint,
  created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX quarantine_created_at ON quarantine (created_at);

-- §3.5 payload bodies, stored once per event
CREATE TABLE delivery_events (
  event_id    text        PRIMARY KEY,
  body        text        NOT NULL,
  body_sha256 text        NOT NULL,
  created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX delivery_events_created_at ON delivery_events (created_at);

-- §3.5 / §4.1 the outbox: one row per (event, webhook)
CREATE TABLE outbox (
  delivery_id       text        PRIMARY KEY,
  event_id          text        NOT NULL,
  owner_did         text        NOT NULL,
  webhook_rkey      text        NOT NULL,
  match_kind        text        NOT NULL CHECK (match_kind IN ('direct', 'backlink')),
  event_did         text        NOT NULL,
  event_collection  text        NOT NULL,
  event_rkey        text        NOT NULL,
  event_operation   text        NOT NULL CHECK (event_operation IN ('create', 'update', 'delete')),
  target_url        text        NOT NULL,
  signing_mode      text        NOT NULL CHECK (signing_mode IN ('none', 'record_secret', 'secret_id')),
  secret_id         text,
  fingerprint       text        NOT NULL,
  status            text        NOT NULL DEFAULT 'pending'
                    CHECK (status IN ('pending', 'leased', 'delivered', 'dead_letter', 'cancelled')),
  attempt_count     integer     NOT NULL DEFAULT 0,
  next_attempt_at   timestamptz NOT NULL DEFAULT now(),
  lease_token       text,
  leased_until      timestamptz,
  last_error_kind   text,
  last_http_status  integer,
  created_at        timestamptz NOT NULL DEFAULT now(),
  updated_at        timestamptz NOT NULL DEFAULT now(),
  finished_at       timestamptz
);
CREATE INDEX outbox_due ON outbox (next_attempt_at) WHERE status = 'pending';
CREATE INDEX outbox_lease_expiry ON outbox (leased_until) WHERE status = 'leased';
CREATE INDEX outbox_webhook ON outbox (owner_did, webhook_rkey, created_at);
CREATE INDEX outbox_finished ON outbox (status, finished_at) WHERE status IN ('delivered', 'dead_letter', 'cancelled');
CREATE INDEX outbox_event ON outbox (event_id);
CREATE INDEX outbox_created_at ON outbox (created_at);

-- §4.8 attempt history (for deliveries show)
CREATE TABLE delivery_attempts (
  delivery_id       text        NOT NULL,
  attempt           integer     NOT NULL,
  started_at        timestamptz NOT NULL,
  duration_ms       integer     NOT NULL,
  outcome           text        NOT NULL,
  error_kind        text,
  http_status       integer,
  response_excerpt  text,
  PRIMARY KEY (delivery_id, attempt)
);
CREATE INDEX delivery_attempts_started_at ON delivery_attempts (started_at);

-- §4.7 audit of terminal outcomes (the URL is never stored)
CREATE TABLE audit (
  id                bigserial   PRIMARY KEY,
  delivery_id       text        NOT NULL,
  event_id          text        NOT NULL,
  owner_did         text        NOT NULL,
  webhook_rkey      text        NOT NULL,
  event_did         text        NOT NULL,
  event_collection  text        NOT NULL,
  event_rkey        text        NOT NULL,
  event_operation   text        NOT NULL,
  status            text        NOT NULL CHECK (status IN ('delivered', 'dead_letter', 'cancelled')),
  http_status       integer,
  error_kind        text,
  url               text        NOT NULL DEFAULT '[redacted]',
  created_at        timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX audit_created_at ON audit (created_at);
CREATE INDEX audit_owner ON audit (owner_did, created_at);

-- §5.2 backfill pass continuation
CREATE TABLE backfill_state (
  pass                text        PRIMARY KEY,
  continuation_did    text,
  owners_done         integer     NOT NULL DEFAULT 0,
  pass_started_at     timestamptz,
  pass_completed_at   timestamptz,
  updated_at          timestamptz NOT NULL DEFAULT now()
);
`)

/**
 * 0002: `outbox.origin`, the origin key of `target_url` (`Outbox.originKey`), written at enqueue so
 * the delivery claim does not evaluate a regular expression per candidate row. Nullable, so adding
 * it does not rewrite the table; rows enqueued before it are NULL and the claim computes theirs.
 */
const outboxOrigin = Effect.flatMap(
  SqlClient.SqlClient,
  (sql) => sql`ALTER TABLE outbox ADD COLUMN IF NOT EXISTS origin text`
)

/**
 * 0003: `backfill_state.sweep` (the sweep's number, which fences every write of a pass) and
 * `backfill_state.claims` (the pages claimed and not finished, SPEC §6.4). A pass row of an older
 * version is sweep 0 with no claims: a sweep in progress goes on from its continuation.
 */
const backfillClaims = Effect.flatMap(
  SqlClient.SqlClient,
  (sql) =>
    sql`ALTER TABLE backfill_state ADD COLUMN IF NOT EXISTS sweep bigint NOT NULL DEFAULT 0,
      ADD COLUMN IF NOT EXISTS claims jsonb NOT NULL DEFAULT '[]'::jsonb`
)

/**
 * 0004: `rejected_records`, the records firehook saw and refused, per owner (SPEC §8.5; see
 * `registry/RejectedStore`). Revs compare bytewise (`COLLATE "C"`: TIDs sort in time order).
 */
const rejectedRecords = ddl(`
CREATE TABLE rejected_records (
  owner_did      text        NOT NULL,
  rkey           text        NOT NULL,
  rev            text        COLLATE "C" NOT NULL,
  cid            text,
  reason         text        NOT NULL,
  source         text        NOT NULL CHECK (source IN ('stream', 'reconciliation')),
  first_seen_at  timestamptz NOT NULL DEFAULT now(),
  last_seen_at   timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (owner_did, rkey)
);
CREATE INDEX rejected_records_owner_newest ON rejected_records (owner_did, last_seen_at DESC, rev DESC, rkey DESC);
CREATE INDEX rejected_records_last_seen ON rejected_records (last_seen_at, owner_did, rkey);
`)

/**
 * 0005: `registry_changes`, the owners whose registrations another process changed (a completed
 * reconciliation, a webhook marked or cleared `gone`), so that the intake leader's in-memory
 * registry follows them (SPEC §6.4, registry/RegistrySync.ts): one row per owner (its latest change:
 * the writing transaction's id and time), written by triggers in the writer's own transaction, each
 * with a `pg_notify('firehook_registry', <owner DID>)` sent at its commit. The leader reloads an owner
 * on the notification and reads the rows again every few seconds from a transaction-id horizon, in
 * case a notification was missed. Bounded by the number of owners; nothing to prune.
 */
const registryChanges = ddl(`
CREATE TABLE registry_changes (
  owner_did   text        PRIMARY KEY,
  xid         xid8        NOT NULL,
  changed_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX registry_changes_xid ON registry_changes (xid);

CREATE FUNCTION firehook_registry_changed() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
  owner text := to_jsonb(NEW) ->> TG_ARGV[0];
BEGIN
  INSERT INTO registry_changes (owner_did, xid, changed_at) VALUES (owner, pg_current_xact_id(), now())
  ON CONFLICT (owner_did) DO UPDATE SET xid = EXCLUDED.xid, changed_at = EXCLUDED.changed_at;
  PERFORM pg_notify('firehook_registry', owner);
  RETURN NULL;
END
$$;

CREATE TRIGGER owners_registry_changed AFTER UPDATE OF reconcile_status ON owners
  FOR EACH ROW WHEN (NEW.reconcile_status = 'complete')
  EXECUTE FUNCTION firehook_registry_changed('did');
CREATE TRIGGER webhooks_registry_changed AFTER UPDATE OF gone_at ON webhooks
  FOR EACH ROW WHEN (OLD.gone_at IS DISTINCT FROM NEW.gone_at)
  EXECUTE FUNCTION firehook_registry_changed('owner_did');
`)

/**
 * 0006: the owners' delivery log and test deliveries (SPEC §8.5).
 * - `outbox.event_operation` also allows `test` (an owner's test delivery; no record event has it).
 * - `outbox_owner_created (owner_did, created_at DESC, delivery_id DESC)`: `listDeliveries` pages
 *   one owner's rows newest first by that key (an index scan, no sort). Without it (EXPLAIN on 400k
 *   rows) the planner walks `outbox_created_at` backwards and filters by owner: cheap for a busy
 *   owner, most of the table for a quiet one. With an rkey, `outbox_webhook` serves it either way.
 * Both block writes to the outbox while they scan it (the check) and build the index: seconds for
 * a million rows (docs/operations.md).
 */
const ownerLog = ddl(`
ALTER TABLE outbox DROP CONSTRAINT IF EXISTS outbox_event_operation_check;
ALTER TABLE outbox ADD CONSTRAINT outbox_event_operation_check
  CHECK (event_operation IN ('create', 'update', 'delete', 'test'));
CREATE INDEX outbox_owner_created ON outbox (owner_did, created_at DESC, delivery_id DESC);
`)

/**
 * 0007: `outbox_origin_due`, the pending rows of one origin in due order, so that an open
 * circuit's rows are moved past its cool-down in bulk by an index range scan (SPEC §4.3,
 * delivery/ParkSql.ts). Rows with a NULL origin (enqueued before 0002) are not in it.
 */
const outboxOriginDue = Effect.flatMap(
  SqlClient.SqlClient,
  (sql) =>
    sql`CREATE INDEX IF NOT EXISTS outbox_origin_due ON outbox (origin, next_attempt_at) WHERE status = 'pending'`
)

/**
 * 0008: the replay store of the owners' API shared by its replicas (SPEC §8.2, api/JtiStore.ts):
 * a service token's `(iss, jti)` until its expiry; a row that cannot be inserted is a replay.
 * Expired rows are pruned by the API processes (bounded statements, every minute).
 */
const apiJti = ddl(`
CREATE TABLE api_jti (
  iss         text        NOT NULL,
  jti         text        NOT NULL,
  expires_at  timestamptz NOT NULL,
  PRIMARY KEY (iss, jti)
);
CREATE INDEX api_jti_expires_at ON api_jti (expires_at);
`)

/**
 * 0009: the delivery state of each registration (SPEC §4.3 auto-disable, §8.5 `list`), on its
 * `webhooks` row, kept by the settle path (delivery/WebhookHealthSql.ts) with times from the
 * workers' Clock: the current failure streak (`failing_since`, `failed_attempts`: failed attempts
 * since the last 2xx), the last success and failure, `auto_disabled_at`, and the rows parked while
 * disabled or gone (`parked`, at most 10,000; `parked_dropped` beyond). A new fingerprint (a new
 * version of the record) is a new registration: a trigger resets the state.
 */
const webhookState = ddl(`
ALTER TABLE webhooks
  ADD COLUMN failing_since      timestamptz,
  ADD COLUMN failed_attempts    integer     NOT NULL DEFAULT 0,
  ADD COLUMN last_success_at    timestamptz,
  ADD COLUMN last_failure_at    timestamptz,
  ADD COLUMN last_failure_kind  text,
  ADD COLUMN last_failure_http  integer,
  ADD COLUMN auto_disabled_at   timestamptz,
  ADD COLUMN parked             integer     NOT NULL DEFAULT 0,
  ADD COLUMN parked_dropped     bigint      NOT NULL DEFAULT 0;
CREATE INDEX webhooks_disabled ON webhooks (owner_did, rkey) WHERE auto_disabled_at IS NOT NULL OR gone_at IS NOT NULL;

CREATE FUNCTION firehook_webhook_state_reset() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF NEW.fingerprint IS DISTINCT FROM OLD.fingerprint THEN
    NEW.failing_since := NULL;
    NEW.failed_attempts := 0;
    NEW.last_success_at := NULL;
    NEW.last_failure_at := NULL;
    NEW.last_failure_kind := NULL;
    NEW.last_failure_http := NULL;
    NEW.auto_disabled_at := NULL;
    NEW.parked := 0;
    NEW.parked_dropped := 0;
  END IF;
  RETURN NEW;
END
$$;

CREATE TRIGGER webhooks_state_reset BEFORE UPDATE OF fingerprint ON webhooks
  FOR EACH ROW EXECUTE FUNCTION firehook_webhook_state_reset();
`)

/**
 * 0010: the poison-row guard (delivery/Suspects.ts): how many times a row was being attempted, as
 * the only suspect of its worker, when that worker died or lost its lease. Reset to 0 whenever the
 * row is claimed from `pending`. A metadata-only change (a constant default, PostgreSQL 11 or later).
 */
const outboxCrashCount = ddl(`ALTER TABLE outbox ADD COLUMN crash_count smallint NOT NULL DEFAULT 0`)

/**
 * 0011: owner reconciliations requested by an account's reactivation (SPEC §5.4;
 * reconciliation/Reactivations.ts): intake stamps `owners.reconcile_requested_at` on a known
 * owner's `#account active: true`; the RetryScheduler lists the stamped owners
 * (`owners_reconcile_requested`, partial: only pending requests) and the next scan's begin clears
 * it. Adding a nullable column rewrites nothing (9 ms on a million owners); the partial index is
 * built from a scan of `owners`, blocking its writes meanwhile (0.2 s on a million owners).
 */
const ownerReconcileRequests = ddl(`
ALTER TABLE owners ADD COLUMN reconcile_requested_at timestamptz;
CREATE INDEX owners_reconcile_requested ON owners (reconcile_requested_at, did)
  WHERE reconcile_requested_at IS NOT NULL;
`)

/**
 * 0012: `owners_completed (completed_at, did) WHERE reconcile_status = 'complete'`, the retry
 * scheduler's read of the owners whose reconciliation completed since its cursor (every minute,
 * `completedSince`: ordered by that key). Without it the read was a scan of every owner ever seen
 * (a table never pruned): 25 ms at 200,000 owners, growing with them; with it, 0.05 ms. A generation
 * bump (every live write of an owner) changes neither column, so those updates stay HOT. The
 * build blocks writes to `owners` while it runs (0.3 s for 200,000 rows).
 */
const ownersCompleted = ddl(`
CREATE INDEX IF NOT EXISTS owners_completed ON owners (completed_at, did) WHERE reconcile_status = 'complete';
`)

/**
 * 0013: an owner's dead letters in key order, and the planner's view of subscriptions.
 * - `outbox_owner_dead_letters (owner_did, created_at, delivery_id) WHERE status = 'dead_letter'`:
 *   the owners' replay (count, then pages in `(created_at, delivery_id)` order), resume's replay of
 *   parked rows, the owner's delivery log filtered to dead letters and the dead-letter counts of
 *   `webhook.list` read an owner's dead letters only, instead of walking every row the owner has
 *   (7 days of delivered rows): on 2,000,000 rows, 217 → 12 ms (replay count), 213 → 39 ms (a
 *   replay page, most of it the update), 200 → 16 ms (with a webhook and kind). Only rows that
 *   become dead letters get an entry: nothing on the claim or a delivered settle.
 * - statistics `outbox_subscription (ndistinct, dependencies) ON owner_did, webhook_rkey`: without
 *   them the planner multiplied the two columns' selectivities and expected 1 row per
 *   subscription (a busy one has 70,000), and chose the wrong index for the per-webhook reads.
 * The build blocks writes to the outbox while it runs (0.9 s for 2,000,000 rows, 100,000 dead
 * letters); the ANALYZE samples the table (0.5 s).
 */
const outboxDeadLetters = ddl(`
CREATE INDEX IF NOT EXISTS outbox_owner_dead_letters ON outbox (owner_did, created_at, delivery_id)
  WHERE status = 'dead_letter';
CREATE STATISTICS IF NOT EXISTS outbox_subscription (ndistinct, dependencies) ON owner_did, webhook_rkey FROM outbox;
ANALYZE outbox;
`)

/**
 * 0014: whether a tombstone was left by the registry stream (a live delete, or a refused version)
 * rather than by a reconciliation scan. A live tombstone newer than a snapshot's rev holds the
 * snapshot's listing of its key back (SPEC §3.4: a PDS snapshot never undoes newer live state; a
 * PDS the account has left can still serve its old repo); a scan's never does (it may carry a
 * scan-start TID, ahead of every rev of a deactivated account's repo). Existing tombstones count
 * as a scan's, which is how they were read before. A constant default: no table rewrite.
 */
const tombstonesLive = ddl(`ALTER TABLE tombstones ADD COLUMN IF NOT EXISTS live boolean NOT NULL DEFAULT false`)

/**
 * 0015: `rejected_records_limit_since (reason, first_seen_at, owner_did)`, partial: the refusals
 * made by a global admission limit (`limit_total`, `limit_direct_dids`, `limit_backlink_dids`).
 * When a live write frees room under one of them, the registry requests a reconciliation of the
 * owners of the oldest such refusals (registry/RejectedStore `roomRequestStatement`, at most 16
 * owners per batch): a range read per limit, instead of a scan of the table (up to 1,000,000
 * rows, nearly all of them invalid records). Only such refusals get an entry (none in the common
 * case). The build blocks writes to `rejected_records` while it runs (a scan of the table).
 */
const rejectedLimitSince = ddl(`
CREATE INDEX IF NOT EXISTS rejected_records_limit_since ON rejected_records (reason, first_seen_at, owner_did)
  WHERE reason IN ('limit_total', 'limit_direct_dids', 'limit_backlink_dids');
`)

/**
 * 0016: `owners.completed_snapshot_rev`, the rev of the owner's latest COMPLETED snapshot. A scan
 * that fails (or is found crashed) puts it back as `snapshot_rev`: SPEC §3.4 fences live writes by
 * the rev of the latest completed snapshot or of the one in progress, and a failed scan is neither
 * (its stored rev fenced the owner's live writes until a retry completed, so an owner whose PDS was
 * down lost them: SPEC §2.2). Owners that completed a scan before take their `snapshot_rev` (for one
 * whose last scan failed after storing its rev, that rev: the fence it had until then). A nullable
 * column without a default: no table rewrite for the column itself.
 */
const ownersCompletedRev = ddl(`
ALTER TABLE owners ADD COLUMN IF NOT EXISTS completed_snapshot_rev text;
UPDATE owners SET completed_snapshot_rev = snapshot_rev
  WHERE completed_at IS NOT NULL AND completed_snapshot_rev IS NULL AND snapshot_rev IS NOT NULL;
`)

/**
 * 0017: `cursors.replay_from` and `cursors.replay_seq`, a stream's durable replay obligation (SPEC
 * §3.1: a new registration's stream replays from before it, so nothing since it is missed). The
 * registry stream's batch that registers a webhook (or a new version of one) writes, in its own
 * transaction, `replay_from` = LEAST(itself, the registration's time − 2 s) on the `direct` row
 * (and, for a backlink webhook, the `backlink` row) and bumps `replay_seq`; that stream resumes from
 * min(its resume point, `replay_from`) and clears it once a session that connected at or below it
 * has committed up to its stored cursor (compare-and-set on `replay_seq`). Before, the obligation
 * was held in memory only, and a crash or a lost intake lock in between lost it. A nullable column
 * and a constant default: no table rewrite.
 */
const cursorsReplay = ddl(`
ALTER TABLE cursors ADD COLUMN IF NOT EXISTS replay_from bigint;
ALTER TABLE cursors ADD COLUMN IF NOT EXISTS replay_seq bigint NOT NULL DEFAULT 0;
`)

/**
 * 0018: `outbox.moved_to`, the newer version of its webhook that a leased row, claimed but not yet
 * attempted (`attempt_count = 0`), is to move to (`match_kind`, `target_url`, `signing_mode`,
 * `secret_id`, `fingerprint`, `origin`), written by the outbox move (matching/OutboxSql.ts) when a
 * registration replay matches the row's event with another fingerprint while a worker holds it.
 * The settle that cancels the row `subscription_changed` (its screen saw the new version) applies
 * it instead: the row is pending and due now at the new version; every other settle clears it.
 * Before, the move skipped leased rows, the screen cancelled them, and the new version never got
 * the event. NULL on nearly every row; a nullable column without a default: no table rewrite.
 */
const outboxMovedTo = ddl(`ALTER TABLE outbox ADD COLUMN IF NOT EXISTS moved_to jsonb`)

/**
 * 0019: `webhooks.parked_since`, when `parked` last restarted at 0 (NULL: never, the count is of
 * every row parked). `parked` counts the rows parked since then (SPEC §4.3: at most 10,000); a
 * replay, redeliver or pruning of a parked row gives its room back only when the row was parked
 * (`finished_at`) at or after it (operator/ParkedRoom.ts). Set by resume and, here, by the trigger
 * of 0009 when a new fingerprint resets the state (its function replaced, otherwise unchanged).
 * Before, pruning rows parked before a resume lowered the count of rows parked after it, and a
 * webhook could park 20,000 rows in one disabled period. The column is added without a default (no
 * table rewrite: existing rows keep NULL, every row counts); the default is set after, for new rows
 * only: a webhook deleted and created again with the same fingerprint starts its count afresh, its
 * earlier rows parked before its row existed.
 */
const webhookParkedSince = ddl(`
ALTER TABLE webhooks ADD COLUMN IF NOT EXISTS parked_since timestamptz;
ALTER TABLE webhooks ALTER COLUMN parked_since SET DEFAULT clock_timestamp();

CREATE OR REPLACE FUNCTION firehook_webhook_state_reset() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF NEW.fingerprint IS DISTINCT FROM OLD.fingerprint THEN
    NEW.failing_since := NULL;
    NEW.failed_attempts := 0;
    NEW.last_success_at := NULL;
    NEW.last_failure_at := NULL;
    NEW.last_failure_kind := NULL;
    NEW.last_failure_http := NULL;
    NEW.auto_disabled_at := NULL;
    NEW.parked := 0;
    NEW.parked_dropped := 0;
    NEW.parked_since := clock_timestamp();
  END IF;
  RETURN NEW;
END
$$;
`)

/** The migrations, in order. Add new ones at the end; never edit one that has shipped. */
export const migrations: Record<string, Effect.Effect<void, unknown, SqlClient.SqlClient>> = {
  "0001_init": init,
  "0002_outbox_origin": outboxOrigin,
  "0003_backfill_claims": backfillClaims,
  "0004_rejected_records": rejectedRecords,
  "0005_registry_changes": registryChanges,
  "0006_owner_log": ownerLog,
  "0007_outbox_origin_due": outboxOriginDue,
  "0008_api_jti": apiJti,
  "0009_webhook_state": webhookState,
  "0010_outbox_crash_count": outboxCrashCount,
  "0011_owner_reconcile_requests": ownerReconcileRequests,
  "0012_owners_completed": ownersCompleted,
  "0013_outbox_dead_letters": outboxDeadLetters,
  "0014_tombstones_live": tombstonesLive,
  "0015_rejected_limit_since": rejectedLimitSince,
  "0016_owners_completed_rev": ownersCompletedRev,
  "0017_cursors_replay": cursorsReplay,
  "0018_outbox_moved_to": outboxMovedTo,
  "0019_webhook_parked_since": webhookParkedSince
}
