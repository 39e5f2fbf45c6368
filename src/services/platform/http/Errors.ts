/**
 * The transport's one error (SafeHttp): a kind, nothing else.
 *
 * @since 0.1.0
 */
import { Data, Effect } from "effect"

// ---------------------------------------------------------------------------------------------
// Errors

/**
 * Every way a transport request can fail; each maps 1:1 onto a delivery `FailureKind` (SPEC §4.3),
 * so the delivery's list can take these from here.
 */
export const safeHttpErrorKinds = [
  "invalid_target",
  "blocked_target",
  "dns",
  "timeout",
  "network",
  "request_too_large",
  // only for a request that needs the whole body (`onResponseOverflow: "fail"`: DID documents, PDS
  // calls); a delivery reads with "truncate" and never fails so (SPEC §4.3)
  "response_too_large"
] as const

/** One of {@link safeHttpErrorKinds}. */
export type SafeHttpErrorKind = (typeof safeHttpErrorKinds)[number]

/**
 * A failed transport request. Deliberately carries nothing but the kind: no URL, host name, address,
 * DNS answer, header or cause (a Node error message names the address it failed to reach).
 */
export class SafeHttpError extends Data.TaggedError("SafeHttpError")<{ readonly kind: SafeHttpErrorKind }> {
  override get message(): string {
    return `delivery failed: ${this.kind}`
  }
}

export const fail = (kind: SafeHttpErrorKind) => Effect.fail(new SafeHttpError({ kind }))
