/**
 * `firehook owners …`: the discovery list and reconciliation of owners against their PDS.
 */
import { Command, Options } from "@effect/cli"
import { Effect, Option } from "effect"
import * as Reconciler from "../services/reconciliation/Reconciler.js"
import * as ReconcileStore from "../services/reconciliation/ReconcileStore.js"
import { checkDid, didArg, json, optional } from "./Arguments.js"
import { Failed, usage } from "./Failure.js"
import { cell, iso, out, printJson, table } from "./Output.js"
import { withOwnerServices } from "./Services.js"

// ---------------------------------------------------------------------------------------------
// owners

const ownersAdd = Command.make("add", { did: didArg, json }, (o) =>
  Effect.gen(function*() {
    yield* checkDid("<did>", o.did)
    yield* withOwnerServices(Effect.flatMap(ReconcileStore.ReconcileStore, (s) => s.addOwners([o.did], "operator")))
    if (o.json) return yield* printJson({ did: o.did, added: true })
    yield* out(`added ${o.did} (reconciled by every backfill pass)`)
  })).pipe(Command.withDescription("add an owner to the operator list (reconciled by every backfill pass)"))

const outcomeJson = (did: string, outcome: Reconciler.ReconcileOutcome) => {
  switch (outcome._tag) {
    case "complete":
      return {
        did,
        outcome: outcome._tag,
        repoFound: outcome.repoFound,
        records: outcome.records,
        invalid: outcome.invalid,
        written: outcome.written,
        deleted: outcome.deleted,
        pages: outcome.pages
      }
    case "failed":
      return { did, outcome: outcome._tag, kind: outcome.kind }
    default:
      return { did, outcome: outcome._tag }
  }
}

const ownersReconcile = Command.make("reconcile", { did: didArg, json }, (o) =>
  Effect.gen(function*() {
    yield* checkDid("<did>", o.did)
    const outcome = yield* withOwnerServices(Effect.flatMap(Reconciler.Reconciler, (r) => r.reconcile(o.did)))
    if (o.json) yield* printJson(outcomeJson(o.did, outcome))
    switch (outcome._tag) {
      case "complete":
        if (!o.json) {
          yield* out(
            outcome.repoFound
              ? `reconciled ${o.did}: ${outcome.records} records (${outcome.invalid} invalid omitted), ${outcome.written} written, ${outcome.deleted} deleted`
              : `reconciled ${o.did}: the PDS has no such repo; ${outcome.deleted} webhooks deleted`
          )
        }
        return
      case "failed":
        return yield* Effect.fail(new Failed({ text: `reconciliation failed: ${outcome.kind}` }))
      case "busy":
        return yield* Effect.fail(
          new Failed({ text: "too many owners are being reconciled right now; try again later" })
        )
      case "superseded":
        return yield* Effect.fail(new Failed({ text: "another reconciliation of this owner started meanwhile" }))
    }
  })).pipe(Command.withDescription("reconcile one owner against its PDS now and print the outcome"))

const ownersStatus = Command.make(
  "status",
  {
    limit: optional(Options.integer("limit"), "N", "failed and scanning owners listed at most (1..1000, default 20)"),
    json
  },
  (o) =>
    Effect.gen(function*() {
      const limit = Option.getOrElse(o.limit, () => 20)
      if (limit < 1 || limit > 1000) return yield* usage("invalid --limit: must be in 1..1000")
      const s = yield* withOwnerServices(Effect.flatMap(ReconcileStore.ReconcileStore, (st) => st.summary(limit)))
      const pass = s.pass === undefined
        ? null
        : {
          continuation: s.pass.continuation ?? null,
          ownersDone: s.pass.ownersDone,
          startedAt: iso(s.pass.startedAt) ?? null,
          completedAt: iso(s.pass.completedAt) ?? null
        }
      if (o.json) {
        return yield* printJson({
          counts: s.counts,
          failed: s.failed.map((f) => ({
            did: f.did,
            failureCount: f.failureCount,
            lastFailureKind: f.lastFailureKind ?? null,
            failedAt: iso(f.failedAt) ?? null
          })),
          scanning: s.scanning.map((x) => ({ did: x.did, scanStartedAt: iso(x.scanStartedAt) ?? null })),
          backfill: pass
        })
      }
      const c = s.counts
      const lines = [
        `owners    unknown ${c.unknown}  scanning ${c.scanning}  complete ${c.complete}  failed ${c.failed}`,
        pass === null
          ? "backfill  no pass yet"
          : pass.completedAt !== null
          ? `backfill  last pass completed ${pass.completedAt} (${pass.ownersDone} owners)`
          : `backfill  pass in progress since ${cell(pass.startedAt ?? undefined)} (${pass.ownersDone} owners done)`
      ]
      yield* out(lines.join("\n"))
      if (s.failed.length > 0) {
        yield* out("")
        yield* out(
          table(
            ["FAILED OWNER", "FAILURES", "LAST KIND", "FAILED AT"],
            s.failed.map((f) => [f.did, String(f.failureCount), f.lastFailureKind, iso(f.failedAt)].map(cell))
          )
        )
      }
      if (s.scanning.length > 0) {
        yield* out("")
        yield* out(
          table(["SCANNING OWNER", "STARTED"], s.scanning.map((x) => [x.did, iso(x.scanStartedAt)].map(cell)))
        )
      }
    })
).pipe(Command.withDescription("reconciliation state: counts, failed and scanning owners, the backfill pass"))

export const owners = Command.make("owners", {}, () => usage("missing subcommand: add, reconcile or status")).pipe(
  Command.withDescription("owners: discovery list and reconciliation against their PDS"),
  Command.withSubcommands([ownersAdd, ownersReconcile, ownersStatus])
)
