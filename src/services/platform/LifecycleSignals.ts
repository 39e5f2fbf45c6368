/**
 * SIGINT/SIGTERM (and SIGHUP, taken as SIGTERM) before the runtime runs (SPEC §6.1: a signal at any moment of startup stops the
 * process, exit 0 when it stopped cleanly). Until `src/main.ts` has loaded its modules and started
 * the runtime, nothing has started (no connection, no claim, no listener): a signal then ends the
 * process at once with exit code 0, not by the signal's default action (exit 143/130, which the
 * delivery child's supervisor counted as an unclean stop).
 *
 * `src/main.ts` imports this module first, so that the listeners are in place as soon as module
 * evaluation begins (Bun still loads and parses the module graph before that: a signal in those
 * first tenths of a second keeps its default action), and calls {@link handOver} right before it
 * starts the runtime, whose own handler runs the ordered shutdown from then on.
 *
 * This module imports nothing, so that it is evaluated before any library.
 */
const SIGNALS = ["SIGINT", "SIGTERM"] as const
/**
 * SIGHUP (the terminal or SSH session that ran `npm start` closed) is a stop like SIGTERM: its
 * default action killed the process at once, with no ordered shutdown, and left the embedded
 * PostgreSQL running behind it (the audit of 6 December 2026).
 */
const HANGUP = "SIGHUP"

/** nothing has started: exit 0 without waiting for anything */
const beforeStart = (): void => {
  process.exit(0)
}
for (const signal of [...SIGNALS, HANGUP]) process.on(signal, beforeStart)

/**
 * The runtime is about to start: a signal no longer ends the process at once. The listeners left
 * in place do nothing: SPEC §6.3, shutdown is idempotent. The runtime's own handler removes itself
 * at the first SIGINT/SIGTERM (and interrupts the main fiber, which runs the ordered shutdown);
 * with no listener left, the default action would come back and a second signal would kill the
 * process in the middle of that shutdown. These stay, so a repeated signal changes nothing; and a
 * process that has run this never dies of SIGINT/SIGTERM (DeliveryProcess relies on it).
 */
export const handOver = (): void => {
  for (const signal of SIGNALS) {
    process.off(signal, beforeStart)
    process.on(signal, alreadyStopping)
  }
  // the runtime handles SIGINT and SIGTERM only: a hangup becomes a SIGTERM (once)
  process.off(HANGUP, beforeStart)
  process.on(HANGUP, hangUp)
}

const alreadyStopping = (): void => {}

let hungUp = false
const hangUp = (): void => {
  if (hungUp) return
  hungUp = true
  process.kill(process.pid, "SIGTERM")
}
