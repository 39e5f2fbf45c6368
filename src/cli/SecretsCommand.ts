/**
 * `firehook secrets …`: server-managed signing secrets.
 */
import { Command } from "@effect/cli"
import { Effect, Option, Redacted } from "effect"
import * as SecretBox from "../services/delivery/SecretBox.js"
import { MAX_RESEAL_PASSES, resealPasses, Secrets } from "../services/delivery/Secrets.js"
import { checkDid, checkName, didArg, json, nameArg, token } from "./Arguments.js"
import { Failed, usage } from "./Failure.js"
import { cell, iso, out, printJson, table } from "./Output.js"
import { withServices } from "./Services.js"

// ---------------------------------------------------------------------------------------------
// secrets

const tokenValue = (t: Option.Option<Redacted.Redacted<string>>) =>
  Effect.gen(function*() {
    if (Option.isNone(t)) return undefined
    const v = Redacted.value(t.value)
    if (!SecretBox.validateCallerToken(v)) {
      return yield* usage("invalid --token: must be 32-256 printable ASCII characters without whitespace")
    }
    return v
  })

/** `create` and `rotate`: the same arguments and checks; the new token is the only line on stdout. */
const secretsIssue = (name: "create" | "rotate", description: string) =>
  Command.make(name, { did: didArg, name: nameArg, token }, (o) =>
    Effect.gen(function*() {
      yield* checkDid("<did>", o.did)
      yield* checkName(o.name)
      const given = yield* tokenValue(o.token)
      const issued = yield* withServices(Effect.flatMap(Secrets, (s) => s[name](o.did, o.name, given)))
      yield* out(issued.token)
    })).pipe(Command.withDescription(description))

const secretsCreate = secretsIssue("create", "create a server-managed secret; prints the token once")

const secretsRotate = secretsIssue("rotate", "replace a secret's token; prints the new token once")

const secretsDelete = Command.make("delete", { did: didArg, name: nameArg, json }, (o) =>
  Effect.gen(function*() {
    yield* checkDid("<did>", o.did)
    yield* checkName(o.name)
    const removed = yield* withServices(Effect.flatMap(Secrets, (s) => s.remove(o.did, o.name)))
    if (!removed) return yield* Effect.fail(new Failed({ text: "no such secret" }))
    if (o.json) return yield* printJson({ deleted: true })
    yield* out(`deleted secret ${o.name}`)
  })).pipe(Command.withDescription("delete a secret"))

const secretsList = Command.make("list", { did: didArg, json }, (o) =>
  Effect.gen(function*() {
    yield* checkDid("<did>", o.did)
    const rows = yield* withServices(Effect.flatMap(Secrets, (s) => s.list(o.did)))
    if (o.json) {
      return yield* printJson(
        rows.map((r) => ({ name: r.name, createdAt: r.createdAt.toISOString(), rotatedAt: iso(r.rotatedAt) ?? null }))
      )
    }
    if (rows.length === 0) return yield* out("no secrets")
    yield* out(
      table(
        ["NAME", "CREATED", "ROTATED"],
        rows.map((r) => [r.name, r.createdAt.toISOString(), iso(r.rotatedAt)].map(cell))
      )
    )
  })).pipe(Command.withDescription("list an owner's secrets (names and times, never tokens)"))

/**
 * `reseal`: re-seals every envelope not under the current key (retiring a previous key), in bounded
 * passes, each from where the last stopped, until one reaches the end of the table (at most
 * `MAX_RESEAL_PASSES`); the counts printed are the sums over the passes. Exit 0 only when the end
 * was reached with nothing left behind (no unreadable envelope, none changed meanwhile): then no
 * secret needs a previous key any more. Counts only, never a token, a key or a secret's name.
 */
const secretsReseal = Command.make("reseal", { json }, (o) =>
  Effect.gen(function*() {
    const run = yield* withServices(Effect.flatMap(Secrets, (s) => resealPasses((from) => s.reseal(from))))
    const r = { resealed: run.resealed, unreadable: run.unreadable, skipped: run.skipped, complete: run.complete }
    if (o.json) yield* printJson(r)
    else {
      yield* out(`resealed ${r.resealed}, unreadable ${r.unreadable}, skipped (changed meanwhile) ${r.skipped}`)
    }
    if (r.unreadable > 0) {
      return yield* Effect.fail(
        new Failed({
          text:
            `${r.unreadable} envelope(s) open with no configured key: keep the keys that sealed them (left as they are)`
        })
      )
    }
    if (!r.complete) {
      return yield* Effect.fail(
        new Failed({
          text:
            `stopped after ${run.passes} passes (at most ${MAX_RESEAL_PASSES}) before the end of the table: run it again`
        })
      )
    }
    if (r.skipped > 0) {
      return yield* Effect.fail(
        new Failed({ text: "not every envelope was re-sealed in this run (changed meanwhile): run it again" })
      )
    }
  })).pipe(
    Command.withDescription(
      "re-seal every secret not under the current encryption key (same token), so a previous key can be retired"
    )
  )

export const secrets = Command.make(
  "secrets",
  {},
  () => usage("missing subcommand: create, rotate, delete, list or reseal")
)
  .pipe(
    Command.withDescription("manage server-managed signing secrets"),
    Command.withSubcommands([secretsCreate, secretsRotate, secretsDelete, secretsList, secretsReseal])
  )
