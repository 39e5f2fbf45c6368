/**
 * Fixtures of the in-memory intake sessions (no sockets) shared by the session, batch-cursor and
 * replay tests: relay frames as their events, an in-memory relay serving them, and a wait on other
 * fibers that passes no clock time.
 */
import { Chunk, Effect, Scheduler, Stream } from "effect"
import type { StreamEvent } from "../../src/schemas/RecordEvent.js"
import type * as Intake from "../../src/services/intake/Intake.js"

export const RELAY = "wss://relay.test"
export const DID = "did:plc:aaaaaaaaaaaaaaaaaaaaaaaa"

/** one relay frame (a commit) with `ops` operations */
export interface Frame {
  readonly seq: bigint
  readonly ops: number
}
export const eventsOf = (f: Frame): ReadonlyArray<StreamEvent> =>
  Array.from({ length: f.ops }, (_, i) => ({
    kind: "commit" as const,
    did: DID,
    collection: "app.bsky.feed.post",
    rkey: `s${f.seq}o${i}`,
    operation: "create" as const,
    rev: "3l3qo2vutsw2b",
    cid: undefined,
    record: { text: "x" },
    timeUs: 1_750_000_000_000_000 + Number(f.seq),
    stream: "relay",
    relay: RELAY,
    cursor: String(f.seq)
  }))

/**
 * let the other fibers run (macrotask turns, no clock time), until `cond` holds (bounded: 20,000
 * turns; 2,000 were once not enough on a loaded CI machine)
 */
export const until = (cond: () => boolean, what: string) =>
  Effect.gen(function*() {
    for (let i = 0; i < 20_000; i++) {
      if (cond()) return
      yield* Effect.yieldNow().pipe(Effect.withScheduler(Scheduler.timer(0)))
    }
    return yield* Effect.dieMessage(`never happened: ${what}`)
  })

/**
 * An in-memory relay: a connection from `cursor` gets every frame after it (subscribeRepos
 * semantics), all in one chunk, and then stays open. `asked` records each connection's cursor.
 */
export const memoryRelay = (frames: ReadonlyArray<Frame>) => {
  const asked: Array<bigint | undefined> = []
  const spec: Intake.StreamSpec = {
    name: "relay",
    relay: RELAY,
    registryWriter: false,
    initialCursor: undefined,
    rewind: 10n,
    cursorIsTime: false,
    connect: (cursor) =>
      Stream.suspend(() => {
        asked.push(cursor)
        const items = frames
          .filter((f) => cursor === undefined || f.seq > cursor)
          .map((f): Intake.SourceItem => ({ _tag: "events", events: eventsOf(f), cursor: f.seq }))
        return Stream.succeed<Intake.SourceItem>({ _tag: "opened" }).pipe(
          Stream.concat(Stream.fromChunk(Chunk.fromIterable(items))),
          Stream.concat(Stream.never)
        )
      })
  }
  return { spec, asked }
}
