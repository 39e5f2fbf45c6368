/**
 * The statuses of an outbox row (SPEC §4.1): one list, the types derived from it.
 *
 * @since 0.1.0
 */

/** The statuses an outbox row ends in. */
export const TERMINAL_STATUSES = ["delivered", "dead_letter", "cancelled"] as const
export type TerminalStatus = (typeof TERMINAL_STATUSES)[number]

/** Every status of an outbox row. */
export const DELIVERY_STATUSES = ["pending", "leased", ...TERMINAL_STATUSES] as const
export type DeliveryStatus = (typeof DELIVERY_STATUSES)[number]

/**
 * The `event_operation` of an outbox row: a record operation, or `test` (an owner's test delivery,
 * SPEC §8.5 `dev.firehook.webhook.test`, which no record event produces).
 */
export const OUTBOX_OPERATIONS = ["create", "update", "delete", "test"] as const
export type OutboxOperation = (typeof OUTBOX_OPERATIONS)[number]
