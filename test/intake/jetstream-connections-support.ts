/**
 * What the intake tests against the fake Jetstream share: short retry timings, and which of the
 * plan's streams a connection belongs to (by the options it sent: `wantedCollections` is the
 * registry stream, `wantedDids` the direct stream, neither the backlink stream).
 */
import { Duration } from "effect"
import type * as Intake from "../../src/services/intake/Intake.js"
import type { Connection, FakeJetstream } from "../support/fakeJetstream.js"

/** retries and reconnects within milliseconds */
export const fastTuning: Partial<Intake.IntakeTuning> = {
  batchRetryBase: Duration.millis(5),
  backoffBase: Duration.millis(10),
  backoffCap: Duration.millis(50),
  poisonBackoff: Duration.millis(20)
}

/** the options the connection sent last */
export const optionsOf = (c: Connection) => c.options.at(-1)
export const isDirect = (c: Connection) => Array.isArray(optionsOf(c)?.["wantedDids"])
export const isRegistry = (c: Connection) => Array.isArray(optionsOf(c)?.["wantedCollections"])
export const isBacklink = (c: Connection) => {
  const o = optionsOf(c)
  return o !== undefined && !Array.isArray(o["wantedDids"]) && !Array.isArray(o["wantedCollections"])
}
export const isOpen = (c: Connection) => c.socket.readyState === 1

/** Sends `frame` on the open connections `which` accepts only (the fake is paused for the others). */
export const sendTo = (fake: FakeJetstream, which: (c: Connection) => boolean, frame: { readonly text: string }) => {
  for (const c of fake.connections) if (which(c) && isOpen(c)) c.socket.send(frame.text)
}
