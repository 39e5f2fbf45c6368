/**
 * The command line's failures (SPEC §4.8): invalid arguments (exit code 2) and operations that
 * could not be done (exit code 1), described as one line on stderr with sensitive arguments redacted.
 */
import { HelpDoc, ValidationError } from "@effect/cli"
import { Cause, Data, Effect, Option } from "effect"
import { isCanonicalDid } from "../schemas/AtUri.js"
import { SecretsError } from "../services/delivery/Secrets.js"
import * as Operator from "../services/operator/Operator.js"
import * as Hooks from "./HookRecords.js"

// ---------------------------------------------------------------------------------------------
// Errors and exit codes

/** Invalid arguments: exit code 2. */
export class UsageError extends Data.TaggedError("UsageError")<{ readonly text: string }> {
  override get message(): string {
    return this.text
  }
}

/** An operation that could not be done: exit code 1. */
export class Failed extends Data.TaggedError("Failed")<{ readonly text: string }> {
  override get message(): string {
    return this.text
  }
}

const USAGE_SECRET_REASONS: ReadonlySet<string> = new Set(["invalid_owner", "invalid_name", "invalid_token"])

const ANSI = new RegExp(String.raw`\u001b\[[0-9;]*[A-Za-z]`, "g")

/** One line of text: ANSI codes removed, whitespace collapsed, bounded. */
const oneLine = (s: string): string => s.replace(ANSI, "").replace(/\s+/g, " ").trim().slice(0, 500)

/** Options whose values are never echoed. */
const SENSITIVE_OPTIONS: ReadonlyArray<string> = ["--token", "--password", "--secret"]

/**
 * Values that must never be echoed: the `--token`, `--password` and `--secret` values, anything
 * token-like, and the app password from the environment.
 */
const sensitiveArgs = (argv: ReadonlyArray<string>): ReadonlyArray<string> => {
  const out: Array<string> = []
  const envPassword = process.env["ATPROTO_APP_PASSWORD"] ?? ""
  if (envPassword.length >= 6) out.push(envPassword)
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i] ?? ""
    const eq = a.indexOf("=")
    const flag = eq < 0 ? a : a.slice(0, eq)
    if (SENSITIVE_OPTIONS.includes(flag)) {
      if (eq >= 0) out.push(a.slice(eq + 1))
      else if (i + 1 < argv.length) out.push(argv[i + 1] ?? "")
    } else if (a.length >= 32 && !a.startsWith("-") && !isCanonicalDid(a) && !a.startsWith("whd_")) out.push(a)
  }
  return out.filter((s) => s.length > 0).sort((a, b) => b.length - a.length)
}

export const redactArgs = (text: string, argv: ReadonlyArray<string>): string => {
  let t = text
  for (const s of sensitiveArgs(argv)) t = t.split(s).join("[redacted]")
  return t
}

/** The exit code and the one line for a failure of the program. */
export const describeFailure = (cause: Cause.Cause<unknown>): { readonly code: number; readonly line: string } => {
  const failure = Cause.failureOption(cause)
  if (Option.isNone(failure)) {
    return Cause.isInterruptedOnly(cause)
      ? { code: 130, line: "interrupted" }
      : { code: 1, line: "unexpected internal error" }
  }
  const e = failure.value
  if (ValidationError.isValidationError(e)) {
    const text = oneLine(HelpDoc.toAnsiText(e.error))
    return { code: 2, line: text.length > 0 ? `${text} (see --help)` : "invalid arguments (see --help)" }
  }
  if (e instanceof UsageError || e instanceof Operator.InvalidArgument || e instanceof Hooks.HooksInvalid) {
    return { code: 2, line: e.message }
  }
  if (e instanceof SecretsError) return { code: USAGE_SECRET_REASONS.has(e.reason) ? 2 : 1, line: e.message }
  const message =
    typeof e === "object" && e !== null && "message" in e && typeof e.message === "string" && e.message.length > 0
      ? e.message
      : "operation failed"
  return { code: 1, line: message }
}

export const usage = (text: string) => Effect.fail(new UsageError({ text }))
