/**
 * The options every `firehook hooks …` command shares (the owner's PDS and credentials) and the
 * sign-in around a command's work.
 */
import { Args, Options } from "@effect/cli"
import { Effect, type Option, type Redacted } from "effect"
import { optional } from "./Arguments.js"
import * as Hooks from "./HookRecords.js"

const pdsOption = optional(
  Options.text("pds"),
  "URL",
  `the PDS (or entryway) to sign in to; default $ATPROTO_PDS, else ${Hooks.DEFAULT_PDS}`
)
const identifierOption = optional(
  Options.text("identifier"),
  "ID",
  "handle, DID or email to sign in as; default $ATPROTO_IDENTIFIER"
)
const passwordOption = optional(
  Options.redacted("password"),
  "PASSWORD",
  "app password; prefer $ATPROTO_APP_PASSWORD (arguments are visible to other local users)"
)
export const connectionOptions = { pds: pdsOption, identifier: identifierOption, password: passwordOption }
export const rkeyArg = Args.text({ name: "rkey" }).pipe(
  Args.withDescription("the webhook record's key (see hooks list)")
)

/** Connection, insecure-development flag, sign-in, then `f` with the signed-in service. */
export const withHooks = <A, E>(
  given: {
    readonly pds: Option.Option<string>
    readonly identifier: Option.Option<string>
    readonly password: Option.Option<Redacted.Redacted<string>>
  },
  f: (hooks: Hooks.HooksShape) => Effect.Effect<A, E>
) =>
  Effect.gen(function*() {
    const allowInsecureDev = yield* Hooks.allowInsecureDevFromEnv
    const conn = yield* Hooks.connection(given)
    return yield* Effect.provide(Effect.flatMap(Hooks.Hooks, f), Hooks.layer(conn, { allowInsecureDev }))
  })
