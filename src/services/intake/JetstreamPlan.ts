/**
 * The Jetstream plan (SPEC §3.1): three streams and their filters, `registry` (wh records, from
 * cursor 0 on first start, the only registry writer), `direct` (wantedDids = owners ∪ scope DIDs)
 * and `backlink` (whole network, only while backlink scopes exist); and the reconfiguration loop
 * that follows registry changes (coalesced): the direct stream runs only while the direct set is
 * non-empty and reconnects when it changes, replaying for added DIDs from the replay point
 * ({@link directReplayFrom}); the backlink stream runs only while backlink scopes exist.
 */
import { Duration, Effect, Fiber, Option, Ref, Stream } from "effect"
import { optionsUpdate, optionsUpdateTooLarge } from "../../schemas/Jetstream.js"
import { WH_COLLECTION } from "../../schemas/WhRecord.js"
import type { WebhookIndex } from "../matching/WebhookIndex.js"
import * as FirehoseSource from "./FirehoseSource.js"
import { RESUME_GAP_WARN_US } from "./ResumeGap.js"
import { canonicalRelay, jetstreamItem, withOpened } from "./Sources.js"
import type { StreamRunner, StreamSpec } from "./StreamModel.js"

/** How much further back than the registry mark the direct stream may replay for a lagging backlink stream. */
export const DIRECT_REPLAY_MAX_EXTRA = 300_000_000n

/** 2 s of Jetstream `time_us`: the rewind of a loaded cursor, and the replay margin */
const TWO_SECONDS = 2_000_000n

/**
 * Where the direct stream replays from after DIDs joined the direct set (Jetstream, `time_us`): the
 * registry stream's position at the previous check (every DID added since was registered by a later
 * registry event) and the backlink stream's committed position then (from there on it skipped the
 * new DIDs' events, as they were in the direct set when it committed), whichever is earlier, less
 * `margin`; but at most `maxExtra` before the registry mark (a backlink stream far behind would
 * otherwise replay hours), and never below 0.
 */
export const directReplayFrom = (
  registryMark: bigint,
  backlinkMark: bigint | undefined,
  margin: bigint,
  maxExtra: bigint
): bigint => {
  const base = registryMark - margin
  const lagging = backlinkMark === undefined ? base : backlinkMark - margin
  const floor = base - maxExtra
  const from = lagging < base ? (lagging < floor ? floor : lagging) : base
  return from < 0n ? 0n : from
}

/**
 * Whether the direct stream's hello for `dids` (the `options_update` with them as `wantedDids`)
 * fits Jetstream's limit on the message (over it Jetstream closes the connection). Admission keeps
 * the direct set well under it (IndexRules.DIRECT_DIDS_MAX_BYTES); this is the backstop.
 */
export const directHelloFits = (dids: Iterable<string>): boolean =>
  !optionsUpdateTooLarge(optionsUpdate({ wantedDids: Array.from(dids) }))

/**
 * What the direct stream does when the direct set changed from `known` to `next`: nothing over its
 * limit, or when its hello would not fit (`helloFits`: {@link directHelloFits}; the previous plan
 * stays); stop when it empties, start when it fills; reconnect replaying
 * (from {@link directReplayFrom}) when DIDs were added, or when a webhook was `registered` on a
 * DID it already watched (the registry stream may have registered it after the direct stream passed
 * its time), or from its own position when some only left.
 */
export type DirectStep =
  | { readonly _tag: "over_limit" }
  | { readonly _tag: "too_large" }
  | { readonly _tag: "stop" }
  | { readonly _tag: "start" }
  | { readonly _tag: "replay" }
  | { readonly _tag: "restart" }
  | { readonly _tag: "keep" }

export const directStep = (
  known: ReadonlySet<string>,
  next: ReadonlySet<string>,
  running: boolean,
  max: number,
  registered = false,
  helloFits = true
): DirectStep => {
  if (next.size > max) return { _tag: "over_limit" }
  if (next.size > 0 && !helloFits) return { _tag: "too_large" }
  if (next.size === 0 && running) return { _tag: "stop" }
  if (next.size > 0 && !running) return { _tag: "start" }
  if (registered) return { _tag: "replay" }
  for (const d of next) if (!known.has(d)) return { _tag: "replay" }
  if (known.size !== next.size) return { _tag: "restart" }
  return { _tag: "keep" }
}

// ---------------------------------------------------------------------------------------------
// The streams and their filters

export interface JetstreamOptions {
  readonly url: string
  /** the source options every connection shares */
  readonly common: { readonly maxBytes: number; readonly connectTimeoutMs: number; readonly allowInsecure: boolean }
  readonly index: WebhookIndex
  readonly directDidsMax: number
  readonly reconfigureDelay: Duration.Duration
  readonly makeRunner: (spec: StreamSpec) => Effect.Effect<StreamRunner>
  /** run a stream (listed while it runs) */
  readonly start: (r: StreamRunner, from: bigint | undefined) => Effect.Effect<never>
}

interface Filters {
  readonly wantedCollections?: ReadonlyArray<string>
  /** read at each connect; fails when there is nothing that may be sent */
  readonly wantedDids?: Effect.Effect<ReadonlyArray<string>, FirehoseSource.SourceError>
}

/** A connection of the stream `name` with `filters` (the direct set is read at each connect). */
const jetstreamConnect =
  (o: JetstreamOptions, relay: string, name: string, filters: Filters) => (cursor: bigint | undefined) =>
    withOpened(
      Effect.flatMap(filters.wantedDids ?? Effect.succeed(undefined), (wantedDids) =>
        FirehoseSource.openJetstream({
          ...o.common,
          url: o.url,
          cursor,
          stream: name,
          relay,
          // the direct stream (wantedDids: a few DIDs) can be quiet for hours, and each idle
          // reconnect would make Jetstream replay from its last event: no idle watchdog there.
          // The registry stream (wantedCollections only) gets every DID's #account/#identity
          // events, which Jetstream sends whatever the collections, so it is never quiet on a
          // live network: a silent one is a half-open connection, closed like the backlink's
          ...(wantedDids === undefined ? {} : { idleTimeoutMs: 0 }),
          ...(filters.wantedCollections === undefined ? {} : { wantedCollections: filters.wantedCollections }),
          ...(wantedDids === undefined ? {} : { wantedDids })
        })).pipe(Effect.map((c) => c.frames.pipe(Stream.map(jetstreamItem))))
    )

/**
 * The direct stream's `wantedDids` at each connect: the direct set now, sorted; but when its hello
 * would not fit Jetstream's limit (Jetstream would close the connection on it, at every reconnect),
 * the last set that fitted (the previous plan's), with one warning for as long as it does not fit;
 * with none yet, the connect fails (retried like every failed connect).
 */
const directWantedDids = (index: WebhookIndex): Effect.Effect<ReadonlyArray<string>, FirehoseSource.SourceError> => {
  let lastFit: ReadonlyArray<string> | undefined
  let warned = false
  return Effect.suspend(() => {
    const now = [...index.wantedDids()].sort()
    if (directHelloFits(now)) {
      lastFit = now
      warned = false
      return Effect.succeed(now)
    }
    const kept = lastFit
    const warn = warned
      ? Effect.void
      : Effect.logWarning(
        "direct stream hello over Jetstream's options_update size limit; connecting with the previous set"
      )
    warned = true
    return Effect.zipRight(
      warn,
      kept === undefined ? Effect.fail(new FirehoseSource.SourceError({ kind: "connect" })) : Effect.succeed(kept)
    )
  })
}

/** The three streams' specs. */
export const jetstreamSpecs = (o: JetstreamOptions) => {
  const relay = canonicalRelay(o.url)
  const index = o.index
  const registry: StreamSpec = {
    name: "registry",
    relay,
    registryWriter: true,
    initialCursor: 0n,
    rewind: TWO_SECONDS,
    cursorIsTime: true,
    // never quiet on a live network (every DID's #identity/#account): a long resume gap is a
    // clamped cursor (ResumeGap)
    resumeGapWarnUs: RESUME_GAP_WARN_US,
    connect: jetstreamConnect(o, relay, "registry", { wantedCollections: [WH_COLLECTION] }),
    // a registration's replay (the reconfiguration below) is held in memory: written durably too,
    // in the registration's transaction, so that a crash or a lost intake lock before the replayed
    // batch commits does not lose it (SPEC §3.1)
    registrationReplay: { direct: "direct", backlink: "backlink", margin: TWO_SECONDS }
  }
  const direct: StreamSpec = {
    name: "direct",
    relay,
    registryWriter: false,
    // never run before: every registered DID may have events since its registration, which
    // lies somewhere in the retained window (its exact source time is not stored)
    initialCursor: 0n,
    rewind: TWO_SECONDS,
    cursorIsTime: true,
    connect: jetstreamConnect(o, relay, "direct", { wantedDids: directWantedDids(index) }),
    skip: (e) => e.kind === "commit" && e.collection === WH_COLLECTION,
    durableReplay: true
  }
  const backlink: StreamSpec = {
    name: "backlink",
    relay,
    registryWriter: false,
    initialCursor: undefined,
    rewind: TWO_SECONDS,
    cursorIsTime: true,
    // the whole network: never quiet either. The direct stream (a few DIDs, every kind filtered
    // by them) may be quiet for days: its gap is only measured
    resumeGapWarnUs: RESUME_GAP_WARN_US,
    connect: jetstreamConnect(o, relay, "backlink", {}),
    durableReplay: true,
    // events from the direct set and wh records are handled by the other streams
    skip: (e) => e.kind !== "commit" || e.collection === WH_COLLECTION || index.wantedDids().has(e.did)
  }
  return { registry, direct, backlink }
}

// ---------------------------------------------------------------------------------------------
// Reconfiguration

/**
 * Follow the registry: every `reconfigureDelay`, start, stop or reconnect the direct and backlink
 * streams (see {@link directStep}); in the caller's scope, for ever.
 */
const reconfigure = (
  o: JetstreamOptions,
  registryRunner: StreamRunner,
  directRunner: StreamRunner,
  backlinkSpec: StreamSpec
) =>
  Effect.gen(function*() {
    const index = o.index
    let directFiber: Fiber.RuntimeFiber<never> | undefined
    let backlinkFiber: Fiber.RuntimeFiber<never> | undefined
    let wantedVersion = -1
    let registrationsVersion = index.registrationsVersion
    let backlinkRegistrationsVersion = index.backlinkRegistrationsVersion
    let known: ReadonlySet<string> = new Set<string>()
    // warned that the direct set's hello would not fit (once, until a plan is taken again)
    let tooLargeWarned = false
    let first = true
    // the registry stream's position at the previous check: every DID added since was
    // registered by a later registry event, so replaying from it (− 2 s) misses nothing
    const registryMark = Effect.map(Ref.get(registryRunner.state), (st) =>
      st.lastEventTimeUs !== undefined ? BigInt(st.lastEventTimeUs) : (st.durableCursor ?? 0n))
    let prevMark = 0n
    // the backlink stream's committed position at the previous check: it skips the events of
    // DIDs in the direct set as the set is when it commits, so a DID added since was skipped
    // from about there on, and the direct stream must replay from there too
    let backlinkRunner: StreamRunner | undefined
    let prevBacklinkMark: bigint | undefined
    // the registry stream's durable cursor is read by its own fiber (a database read, retried
    // while it fails): until it is in its state, its mark reads 0 ("no position"), and a first
    // check then would take 0 as the previous mark, so that a registration read in the next
    // second replayed the direct stream, and started the backlink stream, from cursor 0
    // (Jetstream's whole window). No check runs before it is loaded; waited for one check's
    // delay at a time (a stream refused at shutdown never loads: the plan then does nothing)
    const registryLoaded = registryRunner.cursorLoaded
    let loaded = registryLoaded === undefined
    for (;;) {
      if (!loaded) {
        loaded = Option.isSome(yield* Effect.timeoutOption(registryLoaded ?? Effect.void, o.reconfigureDelay))
        continue
      }
      const firstCheck = first
      const markNow = yield* registryMark
      const backlinkNow = backlinkRunner === undefined
        ? undefined
        : yield* Effect.map(Ref.get(backlinkRunner.state), (st) =>
          st.position ?? st.durableCursor)
      // a mark of 0 is no position: while the registry stream has read nothing (a fresh install,
      // at the previous check and still now), whatever was registered since came from elsewhere
      // (a scan): go on from the streams' own positions, never from cursor 0 (Jetstream's whole
      // window). Once it has read its first events, a registration may come from any of them:
      // the replay is from 0, where it started reading
      const noPosition = prevMark === 0n && markNow === 0n
      const replayFrom = first || noPosition
        ? undefined
        : directReplayFrom(prevMark, prevBacklinkMark, TWO_SECONDS, DIRECT_REPLAY_MAX_EXTRA)
      const wanted = index.wantedDids()
      // a webhook added (or a new version of one) since the previous check, on a DID the direct
      // stream already watched: the stream may have passed the registration's time before the
      // registry stream registered it, so it replays as for a new DID (SPEC §3.1: nothing since
      // the registration is missed); the replayed events' other deliveries exist already (ids)
      const registered = index.registrationsVersion !== registrationsVersion
      registrationsVersion = index.registrationsVersion
      const replayRegistered = registered && !first && directFiber !== undefined
      if (index.wantedDidsVersion !== wantedVersion || replayRegistered) {
        wantedVersion = index.wantedDidsVersion
        const next = new Set(wanted)
        // the hello is built only for a set within its count (serialized once per change)
        const helloFits = next.size > o.directDidsMax || directHelloFits(next)
        const step = directStep(known, next, directFiber !== undefined, o.directDidsMax, replayRegistered, helloFits)
        if (step._tag !== "too_large") tooLargeWarned = false
        switch (step._tag) {
          case "over_limit":
            yield* Effect.logWarning("direct set over its limit; keeping the previous plan")
            break
          case "too_large":
            if (!tooLargeWarned) {
              yield* Effect.logWarning(
                "direct set's options_update over Jetstream's size limit; keeping the previous plan"
              )
            }
            tooLargeWarned = true
            break
          case "stop":
            if (directFiber !== undefined) yield* Fiber.interrupt(directFiber)
            directFiber = undefined
            break
          case "start":
            directFiber = yield* Effect.forkScoped(o.start(directRunner, replayFrom))
            break
          case "replay":
            yield* directRunner.restart(replayFrom)
            break
          case "restart":
            yield* directRunner.restart(undefined)
            break
          case "keep":
            break
        }
        if (step._tag !== "over_limit" && step._tag !== "too_large") known = next
      }
      first = false
      const markBefore = prevMark
      // the registry stream's position at the previous check − 2 s: every webhook registered
      // since was registered after it
      // (none while the registry stream has no position: see replayFrom)
      const sinceBefore = noPosition
        ? undefined
        : markBefore - TWO_SECONDS < 0n
        ? 0n
        : markBefore - TWO_SECONDS
      prevMark = markNow
      prevBacklinkMark = backlinkNow
      const wantBacklink = index.backlinkDids().size > 0
      // a backlink webhook registered since the previous check while the backlink stream ran: the
      // stream may have read references made after the registration before the registry stream
      // registered it; it replays from the registry's position at the previous check (− 2 s), as
      // the direct stream does for a new registration
      const backlinkRegistered = index.backlinkRegistrationsVersion !== backlinkRegistrationsVersion
      backlinkRegistrationsVersion = index.backlinkRegistrationsVersion
      if (backlinkRegistered && wantBacklink && backlinkRunner !== undefined) yield* backlinkRunner.restart(sinceBefore)
      if (wantBacklink && backlinkFiber === undefined) {
        // at the first check (startup) the scopes may predate its cursor: it resumes from its
        // durable cursor (the downtime is read), live when it has none. Started at any later
        // check (the first backlink webhook of this process, or again after its set was empty):
        // every backlink scope now was registered by a registry event after the previous check,
        // so it starts from that position − 2 s (SPEC §3.1: nothing since the registration is
        // missed; live would lose the references made while the registration reached the plan),
        // and the events before matched nothing that exists now: its old cursor would replay up
        // to Jetstream's whole window of the network, and deliver the new webhooks events from
        // before they existed
        const from = firstCheck ? undefined : sinceBefore
        const r = yield* o.makeRunner(from === undefined ? backlinkSpec : { ...backlinkSpec, resumeFloor: from })
        backlinkRunner = r
        backlinkFiber = yield* Effect.forkScoped(o.start(r, from))
      } else if (!wantBacklink && backlinkFiber !== undefined) {
        yield* Fiber.interrupt(backlinkFiber)
        backlinkFiber = undefined
        backlinkRunner = undefined
      }
      yield* Effect.sleep(o.reconfigureDelay)
    }
  })

/** Run the Jetstream streams: the registry stream always, the others as the registry asks. */
export const runJetstream = (o: JetstreamOptions) =>
  Effect.gen(function*() {
    const specs = jetstreamSpecs(o)
    const registryRunner = yield* o.makeRunner(specs.registry)
    const directRunner = yield* o.makeRunner(specs.direct)
    yield* Effect.scoped(
      Effect.gen(function*() {
        yield* Effect.forkScoped(o.start(registryRunner, undefined))
        return yield* reconfigure(o, registryRunner, directRunner, specs.backlink)
      })
    )
    return yield* Effect.never
  })
