/**
 * `firehook webhooks …`: the operator's actions on one registration. `resume <did> <rkey>` clears
 * `gone` / `autoDisabled` (SPEC §4.3), as the owner's `dev.firehook.webhook.resume` does;
 * `--replay` also replays the rows parked while it was disabled (same ids, fresh attempt budget); a
 * replay that stopped at its statement bound says so, as `deliveries replay` does (run it again).
 */
import { Args, Command, Options } from "@effect/cli"
import { Effect, Option } from "effect"
import { WebhookStateStore } from "../services/operator/WebhookState.js"
import { checkDid, checkRkey, didArg, json } from "./Arguments.js"
import { Failed, usage } from "./Failure.js"
import { out, printJson } from "./Output.js"
import { withServices } from "./Services.js"

const rkeyArg = Args.text({ name: "rkey" }).pipe(Args.withDescription("the webhook record's key"))

const webhooksResume = Command.make(
  "resume",
  {
    did: didArg,
    rkey: rkeyArg,
    replay: Options.boolean("replay").pipe(
      Options.withDescription("also replay the deliveries parked while it was disabled (same ids)")
    ),
    json
  },
  (o) =>
    Effect.gen(function*() {
      yield* checkDid("<did>", o.did)
      yield* checkRkey("<rkey>", o.rkey)
      const result = yield* withServices(
        Effect.flatMap(WebhookStateStore, (s) => s.resume(o.did, o.rkey, { replay: o.replay, by: "operator" }))
      )
      if (Option.isNone(result)) return yield* Effect.fail(new Failed({ text: "no such webhook" }))
      const r = result.value
      if (o.json) {
        return yield* printJson({
          ownerDid: o.did,
          rkey: o.rkey,
          cleared: r.cleared,
          active: r.enabled && r.active,
          replayed: r.replayed,
          // present (false) only when the replay stopped at its statement bound: run it again
          ...(r.complete ? {} : { complete: false })
        })
      }
      const what = r.cleared ? "resumed" : "was not gone or auto-disabled; state reset"
      const replayed = o.replay ? `; replayed ${r.replayed} parked ${r.replayed === 1 ? "delivery" : "deliveries"}` : ""
      const inactive = r.enabled && r.active ? "" : " (note: the record itself is disabled or inactive)"
      yield* out(`${o.did} ${o.rkey}: ${what}${replayed}${inactive}`)
      if (!r.complete) yield* out("(stopped at its statement bound; run the same command again for the rest)")
    })
).pipe(
  Command.withDescription(
    "clear a webhook's gone / autoDisabled state (SPEC §4.3); --replay also replays the deliveries parked meanwhile"
  )
)

export const webhooks = Command.make("webhooks", {}, () => usage("missing subcommand: resume")).pipe(
  Command.withDescription("operator actions on one webhook registration"),
  Command.withSubcommands([webhooksResume])
)
