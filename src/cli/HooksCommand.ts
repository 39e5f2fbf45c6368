/**
 * `firehook hooks …`: a webhook owner's own records on their PDS (no database).
 */
import { Command, Options } from "@effect/cli"
import { Effect, Option, Redacted } from "effect"
import { json, optional, showUrls } from "./Arguments.js"
import { usage } from "./Failure.js"
import { connectionOptions, rkeyArg, withHooks } from "./HookOptions.js"
import * as Hooks from "./HookRecords.js"
import { cell, out, printJson, REDACTED_URL, table } from "./Output.js"
import { ownerApiCommands } from "./OwnerApiCommand.js"

// ---------------------------------------------------------------------------------------------
// hooks (webhook owners: their own place.wisp.v2.wh records on their PDS; no database)

const hooksCreate = Command.make(
  "create",
  {
    scope: optional(
      Options.text("scope"),
      "AT-URI",
      "what to watch: at://<did>[/<collection>[/<rkey>]] (a canonical DID, not a handle)"
    ),
    collection: optional(
      Options.text("collection"),
      "NSID",
      "shorthand for --scope at://<your did>/<NSID> (a glob like app.bsky.feed.* works)"
    ),
    backlinks: Options.boolean("backlinks").pipe(
      Options.withDescription("also fire for records in any repo that reference the scope")
    ),
    events: optional(Options.text("events"), "LIST", "comma-separated create,update,delete (default: all)"),
    url: Options.text("url").pipe(Options.withPseudoName("URL"), Options.withDescription("the receiver (https://)")),
    secret: optional(
      Options.redacted("secret"),
      "SECRET",
      "inline signing secret (1-256 characters); stored in your public repo"
    ),
    secretId: optional(Options.text("secret-id"), "NAME", "name of a secret the firehook operator manages for you"),
    generateSecret: Options.boolean("generate-secret").pipe(
      Options.withDescription("generate an inline whsec_ secret and print it once")
    ),
    disabled: Options.boolean("disabled").pipe(Options.withDescription("create it paused (enabled: false)")),
    rkey: optional(
      Options.text("rkey"),
      "RKEY",
      "record key (default: a TID chosen by the PDS); never replaces an existing record"
    ),
    json,
    ...connectionOptions
  },
  (o) =>
    Effect.gen(function*() {
      const signingFlags = [Option.isSome(o.secret), Option.isSome(o.secretId), o.generateSecret].filter((b) =>
        b
      ).length
      if (signingFlags > 1) return yield* usage("choose at most one of --secret, --secret-id, --generate-secret")
      if (Option.isSome(o.scope) === Option.isSome(o.collection)) {
        return yield* usage("give exactly one of --scope, --collection")
      }
      const draft: Hooks.Draft = {
        scope: Option.isSome(o.scope)
          ? { _tag: "AtUri", aturi: o.scope.value }
          : { _tag: "Collection", collection: Option.getOrElse(o.collection, () => "") },
        backlinks: o.backlinks,
        events: Option.match(o.events, { onNone: () => [], onSome: Hooks.parseEvents }),
        url: o.url,
        signing: Option.isSome(o.secret)
          ? { _tag: "Secret", secret: o.secret.value }
          : Option.isSome(o.secretId)
          ? { _tag: "SecretId", name: o.secretId.value }
          : o.generateSecret
          ? { _tag: "Generate" }
          : { _tag: "None" },
        enabled: !o.disabled,
        rkey: o.rkey
      }
      // every argument is checked before the password is used
      yield* Hooks.checkDraft(draft, yield* Hooks.allowInsecureDevFromEnv)
      const created = yield* withHooks(o, (h) => h.create(draft))
      const secret = Option.map(created.secret, Redacted.value)
      if (o.json) {
        return yield* printJson({
          did: created.did,
          uri: created.uri,
          rkey: created.rkey,
          cid: created.cid,
          enabled: draft.enabled,
          ...(Option.isSome(secret) ? { secret: secret.value } : {})
        })
      }
      yield* out(`created webhook ${created.rkey}${draft.enabled ? "" : " (disabled)"}: ${created.uri}`)
      if (Option.isSome(secret)) yield* out(`signing secret (shown once): ${secret.value}`)
    })
).pipe(Command.withDescription("create a webhook record in your repo (checked as firehook checks it, before writing)"))

const summaryJson = (w: Hooks.WebhookSummary, showUrls: boolean) => ({
  rkey: w.rkey,
  uri: w.uri,
  cid: w.cid,
  scope: w.scope ?? null,
  backlinks: w.backlinks,
  backlinksOnly: w.backlinksOnly,
  events: w.events.length === 0 ? ["create", "update", "delete"] : w.events,
  enabled: w.enabled,
  signing: w.signing,
  secretId: w.secretId ?? null,
  createdAt: w.createdAt ?? null,
  url: showUrls ? w.url ?? null : REDACTED_URL,
  accepted: w.validation === "ok",
  invalid: w.validation === "ok" ? null : w.validation
})

const hooksList = Command.make("list", { json, showUrls, ...connectionOptions }, (o) =>
  Effect.gen(function*() {
    const listed = yield* withHooks(o, (h) => h.list)
    if (o.json) {
      return yield* printJson({
        did: listed.did,
        webhooks: listed.webhooks.map((w) => summaryJson(w, o.showUrls)),
        truncated: listed.truncated
      })
    }
    if (listed.webhooks.length === 0) return yield* out(`no webhooks in ${listed.did}`)
    const headers = ["RKEY", "SCOPE", "EVENTS", "ENABLED", "SIGNING", "FIREHOOK"]
    yield* out(
      table(
        o.showUrls ? [...headers, "URL"] : headers,
        listed.webhooks.map((w) => {
          const r = [
            w.rkey,
            w.scope === undefined
              ? undefined
              : `${w.scope}${w.backlinksOnly ? " +backlinks only" : w.backlinks ? " +backlinks" : ""}`,
            w.events.length === 0 ? "all" : w.events.join(","),
            w.enabled ? "yes" : "no",
            w.signing === "secretId" ? `secretId:${w.secretId ?? "?"}` : w.signing,
            w.validation === "ok" ? "accepted" : `rejected (${w.validation})`
          ].map(cell)
          return o.showUrls ? [...r, cell(w.url)] : r
        })
      )
    )
    if (listed.truncated) yield* out(`(the first ${listed.webhooks.length} records; more exist)`)
  })).pipe(Command.withDescription("list your webhook records (never the secrets; URLs only with --show-urls)"))

const hooksToggle = (name: "enable" | "disable", enabled: boolean) =>
  Command.make(name, { rkey: rkeyArg, json, ...connectionOptions }, (o) =>
    Effect.gen(function*() {
      yield* Hooks.checkRkey(o.rkey)
      const t = yield* withHooks(o, (h) => h.setEnabled(o.rkey, enabled))
      if (o.json) {
        return yield* printJson({ rkey: t.rkey, uri: t.uri, cid: t.cid, enabled: t.enabled, changed: t.changed })
      }
      yield* out(t.changed ? `${name}d webhook ${t.rkey}` : `webhook ${t.rkey} is already ${name}d`)
    })).pipe(
      Command.withDescription(
        enabled ? "resume a paused webhook (enabled: true)" : "pause a webhook (enabled: false; kept, never matched)"
      )
    )

const hooksDelete = Command.make(
  "delete",
  { rkey: rkeyArg, json, ...connectionOptions },
  (o) =>
    Effect.gen(function*() {
      yield* Hooks.checkRkey(o.rkey)
      const d = yield* withHooks(o, (h) => h.remove(o.rkey))
      if (o.json) return yield* printJson({ rkey: d.rkey, uri: d.uri, deleted: true })
      yield* out(`deleted webhook ${d.rkey}`)
    })
).pipe(Command.withDescription("delete a webhook record"))

export const hooks = Command.make(
  "hooks",
  {},
  () =>
    usage(
      "missing subcommand: create, list, enable, disable, delete, status, deliveries, show, redeliver, replay, test, resume, tail or secrets"
    )
).pipe(
  Command.withDescription(
    "your own webhook records (place.wisp.v2.wh) on your PDS, and (with --service) what a firehook service did with them"
  ),
  Command.withSubcommands([
    hooksCreate,
    hooksList,
    hooksToggle("enable", true),
    hooksToggle("disable", false),
    hooksDelete,
    ...ownerApiCommands
  ])
)
