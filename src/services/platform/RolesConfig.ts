/**
 * Process roles (SPEC §6.4): `FIREHOOK_ROLES`, the parts a process runs, and what its readiness
 * follows. The variable's name, default and rule live here once; `PlatformConfig.load` reads it.
 *
 * - `all` (the default) or a comma-separated list of `intake`, `delivery`, `reconcile`,
 *   `maintenance`, `api`. Items are trimmed of surrounding spaces; names are lowercase and exact.
 *   An empty item (`intake,,delivery`, a trailing comma), an unknown name, a name given twice, or
 *   `all` together with other names is a startup error. Unset or empty = `all`.
 * - The parsed value is the list of roles in the order of {@link ROLES} (`all` = every role).
 * - Health: a section `roles` with one boolean per role; readiness requires the sections of the
 *   parts that gate it ({@link requiredSections}) and nothing of the parts the process does not run.
 */
import { Effect, Either, Option } from "effect"
import { ConfigInvalid, raw } from "./ConfigRead.js"

export const ROLES = ["intake", "delivery", "reconcile", "maintenance", "api"] as const
export type Role = (typeof ROLES)[number]
export type Roles = ReadonlyArray<Role>

/** `FIREHOOK_ROLES`: `all` or a comma list of {@link ROLES}. */
export const roles = {
  env: "FIREHOOK_ROLES",
  default: "all",
  rules: {
    unknown: `must be all or a comma-separated list of ${ROLES.join(", ")}`,
    empty: "must not have an empty item",
    twice: "must not name a role twice",
    all: "must be all alone or a list of roles without all"
  }
} as const

const isRole = (s: string): s is Role => (ROLES as ReadonlyArray<string>).includes(s)

/** Parse a value of `FIREHOOK_ROLES`: the roles in {@link ROLES} order, or the rule it breaks. */
export const parseRoles = (value: string): Either.Either<Roles, string> => {
  const items = value.split(",").map((s) => s.trim())
  const seen = new Set<string>()
  for (const item of items) {
    if (item.length === 0) return Either.left(roles.rules.empty)
    if (item !== "all" && !isRole(item)) return Either.left(roles.rules.unknown)
    if (seen.has(item)) return Either.left(roles.rules.twice)
    seen.add(item)
  }
  if (seen.has("all")) return seen.size === 1 ? Either.right(ROLES) : Either.left(roles.rules.all)
  return Either.right(ROLES.filter((r) => seen.has(r)))
}

/** `FIREHOOK_ROLES` (unset or empty: every role). */
export const load: Effect.Effect<Roles, ConfigInvalid> = Effect.flatMap(
  raw(roles.env),
  Option.match({
    onNone: () => Effect.succeed(ROLES),
    onSome: (s) =>
      Either.match(parseRoles(s), {
        onLeft: (rule) => Effect.fail(new ConfigInvalid({ variable: roles.env, rule })),
        onRight: (r) => Effect.succeed(r)
      })
  })
)

export const runs = (rs: Roles, role: Role): boolean => rs.includes(role)

/**
 * The health sections that must be registered and ready before a process with these roles is
 * ready (SPEC §6.2): intake's (leader progressing, or standby), and with `reconcile` the backfill
 * infrastructure and the retry scheduler. `delivery`, `maintenance` and `api` gate nothing
 * (delivery backlog and Redis never gate readiness).
 */
export const requiredSections = (rs: Roles): ReadonlyArray<string> => [
  ...(runs(rs, "intake") ? ["intake"] : []),
  ...(runs(rs, "reconcile") ? ["backfill", "retryScheduler"] : [])
]

/** The `roles` health section's body: one boolean per role, in {@link ROLES} order. */
export const rolesBody = (rs: Roles): { readonly [K in Role]: boolean } => ({
  intake: runs(rs, "intake"),
  delivery: runs(rs, "delivery"),
  reconcile: runs(rs, "reconcile"),
  maintenance: runs(rs, "maintenance"),
  api: runs(rs, "api")
})
