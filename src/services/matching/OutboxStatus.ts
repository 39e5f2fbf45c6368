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
