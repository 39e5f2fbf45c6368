/**
 * Every PostgreSQL advisory lock key firehook takes, in one list so that no two roles ever share
 * one (any 64-bit constants would do; these are consecutive). Session locks are held by `Leader`
 * for singleton roles; transaction locks serialize short critical sections.
 *
 * @since 0.1.0
 */

/** Transaction lock: serializes migration runners (`Migrations`). */
export const MIGRATION = 7_231_001
/** Session lock: the intake leader (`Intake`). */
export const INTAKE = 7_231_002
/** Session lock: the maintenance runner (`Maintenance`). */
export const MAINTENANCE = 7_231_003
/** Transaction lock: the reconciliation capacity check (`ReconcileStore`). */
export const RECONCILE = 7_231_004
/**
 * Session lock namespace (the first key of the two-key form): the liveness mark of a delivery
 * worker, `pg_try_advisory_lock_shared(WORKER_ALIVE, hashtext(workerId))` (shared, so that a replacement
 * claim connection takes it before the old one lets it go), held on its claim connection
 * for its lifetime (`DeliveryStore`, SPEC §4.1). Two-key locks never collide with the one-key
 * locks above (PostgreSQL tells them apart by `objsubid`).
 */
export const WORKER_ALIVE = 7_231_005
/**
 * Transaction lock namespace (two-key form): one owner's secret creates, one at a time,
 * `pg_advisory_xact_lock(SECRETS_OWNER, hashtext(ownerDid))` (`Secrets`: the per-owner bound), and
 * `(SECRETS_OWNER, -1)` after it for the bound on all callers without a webhook record.
 */
export const SECRETS_OWNER = 7_231_006
