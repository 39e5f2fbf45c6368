/**
 * Shared pieces of the owners' record library tests (hook-records.*.test.ts): a draft record, a
 * connection to the fake PDS (./hook-records-fake-pds.ts) and the library signed in to it, and
 * `firehook hooks <args>` (HooksCommand.ts) run in-process with its output captured.
 */
import { Effect, Either, Option, Redacted } from "effect"
import * as Hooks from "../../src/cli/HookRecords.js"
import { hooks } from "../../src/cli/HooksCommand.js"
import { type FakePds, PDS_DID, PDS_HANDLE, PDS_PASSWORD } from "./hook-records-fake-pds.js"
import { runInProcess } from "./inProcess.js"

export const WH = "place.wisp.v2.wh"
export const POSTS = `at://${PDS_DID}/app.bsky.feed.post`
export const URL_A = "https://receiver.example.com/hook-a"

export const draft = (over: Partial<Hooks.Draft> = {}): Hooks.Draft => ({
  scope: { _tag: "Collection", collection: "app.bsky.feed.post" },
  backlinks: false,
  events: [],
  url: URL_A,
  signing: { _tag: "None" },
  enabled: true,
  rkey: Option.none(),
  ...over
})

/** The one-line message of a refused draft (`undefined` when accepted). */
export const refusal = (d: Hooks.Draft, allowInsecureDev = false): string | undefined =>
  Either.match(Hooks.checkDraft(d, allowInsecureDev), { onLeft: (e) => e.text, onRight: () => undefined })

export const conn = (pds: FakePds, password = PDS_PASSWORD): Hooks.Connection => ({
  pds: pds.url,
  identifier: PDS_HANDLE,
  password: Redacted.make(password)
})

/** `f` with the library signed in to the fake PDS (the session ends with the scope). */
export const signedIn = <A, E>(pds: FakePds, f: (h: Hooks.HooksShape) => Effect.Effect<A, E>) =>
  Effect.scoped(Effect.flatMap(Hooks.make(conn(pds), { allowInsecureDev: false }), f))

export const failureOf = <A, E>(self: Effect.Effect<A, E>) => Effect.flip(self)

// ---------------------------------------------------------------------------------------------
// The command in-process

export interface Run {
  readonly code: number
  readonly line: string
  readonly stdout: string
}

/** `firehook hooks <args>` with the owner's environment pointing at `pds` (stderr left out). */
export const run = (
  pds: FakePds,
  args: ReadonlyArray<string>,
  env: Record<string, string> = {}
): Effect.Effect<Run> =>
  Effect.map(
    runInProcess(hooks, args, {
      ATPROTO_PDS: pds.url,
      ATPROTO_IDENTIFIER: PDS_HANDLE,
      ATPROTO_APP_PASSWORD: PDS_PASSWORD,
      ...env
    }),
    ({ code, line, stdout }) => ({ code, line, stdout })
  )

export const lines = (s: string) => s.split("\n").filter((l) => l.length > 0)
