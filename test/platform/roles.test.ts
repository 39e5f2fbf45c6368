/**
 * Process roles (SPEC §6.4, issue 16): `FIREHOOK_ROLES` parsing, the sections readiness requires
 * per role set, and the readiness rule (SPEC §6.2) with the sections a process registers.
 */
import { describe, expect, it } from "@effect/vitest"
import { ConfigProvider, Effect, Either, Layer } from "effect"
import * as Config from "../../src/services/platform/Config.js"
import * as Health from "../../src/services/platform/Health.js"
import * as Lifecycle from "../../src/services/platform/Lifecycle.js"
import * as RolesConfig from "../../src/services/platform/RolesConfig.js"

const load = (env: Record<string, string>) =>
  Config.load({ isTty: false }).pipe(Effect.withConfigProvider(ConfigProvider.fromMap(new Map(Object.entries(env)))))

const ALL = ["intake", "delivery", "reconcile", "maintenance", "api"]

describe("FIREHOOK_ROLES", () => {
  it.effect("default, unset or empty: every role", () =>
    Effect.gen(function*() {
      expect((yield* load({})).roles).toEqual(ALL)
      expect((yield* load({ FIREHOOK_ROLES: "" })).roles).toEqual(ALL)
      expect((yield* load({ FIREHOOK_ROLES: "all" })).roles).toEqual(ALL)
      expect((yield* load({ FIREHOOK_ROLES: " all " })).roles).toEqual(ALL)
    }))

  it("a list: the roles in canonical order, items trimmed", () => {
    expect(RolesConfig.parseRoles("delivery")).toEqual(Either.right(["delivery"]))
    expect(RolesConfig.parseRoles("api,intake")).toEqual(Either.right(["intake", "api"]))
    expect(RolesConfig.parseRoles(" maintenance , reconcile,delivery ")).toEqual(
      Either.right(["delivery", "reconcile", "maintenance"])
    )
    expect(RolesConfig.parseRoles("api,maintenance,reconcile,delivery,intake")).toEqual(Either.right(ALL))
  })

  const invalid: ReadonlyArray<readonly [string, string]> = [
    ["intake,bogus", RolesConfig.roles.rules.unknown],
    ["Intake", RolesConfig.roles.rules.unknown],
    ["ALL", RolesConfig.roles.rules.unknown],
    ["intake;delivery", RolesConfig.roles.rules.unknown],
    ["intake delivery", RolesConfig.roles.rules.unknown],
    ["intake,,delivery", RolesConfig.roles.rules.empty],
    ["intake,", RolesConfig.roles.rules.empty],
    [",", RolesConfig.roles.rules.empty],
    [" ", RolesConfig.roles.rules.empty],
    ["delivery,delivery", RolesConfig.roles.rules.twice],
    ["intake, delivery ,intake", RolesConfig.roles.rules.twice],
    ["all,all", RolesConfig.roles.rules.twice],
    ["all,intake", RolesConfig.roles.rules.all],
    ["delivery,all", RolesConfig.roles.rules.all]
  ]
  for (const [value, rule] of invalid) {
    it.effect(`${JSON.stringify(value)}: a one-line ConfigInvalid naming the variable and the rule, not the value`, () =>
      Effect.gen(function*() {
        expect(RolesConfig.parseRoles(value)).toEqual(Either.left(rule))
        const result = yield* Effect.either(load({ FIREHOOK_ROLES: value }))
        expect(Either.isLeft(result)).toBe(true)
        if (Either.isLeft(result)) {
          expect(result.left._tag).toBe("ConfigInvalid")
          expect(result.left.message).toBe(`invalid configuration: FIREHOOK_ROLES ${rule}`)
          expect(result.left.message).not.toContain("\n")
          if (value.trim().length > 3) expect(result.left.message).not.toContain(value.trim())
        }
      }))
  }

  it("the sections readiness requires, per role", () => {
    expect(RolesConfig.requiredSections(ALL as RolesConfig.Roles)).toEqual(["intake", "backfill", "retryScheduler"])
    expect(RolesConfig.requiredSections(["intake"])).toEqual(["intake"])
    expect(RolesConfig.requiredSections(["reconcile"])).toEqual(["backfill", "retryScheduler"])
    for (const r of ["delivery", "maintenance", "api"] as const) expect(RolesConfig.requiredSections([r])).toEqual([])
  })

  it("the roles section: one boolean per role", () => {
    expect(RolesConfig.rolesBody(["delivery", "api"])).toEqual({
      intake: false,
      delivery: true,
      reconcile: false,
      maintenance: false,
      api: true
    })
  })
})

describe("readiness follows the roles (SPEC §6.2, §6.4)", () => {
  const sections = (entries: Record<string, boolean>) => new Map(Object.entries(entries))

  it("ready = a ready phase, every registered section ready, every required section registered", () => {
    const delivery = RolesConfig.requiredSections(["delivery"])
    // a delivery-only process is ready without intake or backfill (its own section never gates)
    expect(Health.ready("live", sections({ roles: true, delivery: true }), delivery)).toBe(true)
    expect(Health.ready("starting", sections({ roles: true, delivery: true }), delivery)).toBe(false)
    // an intake process: not before intake has registered, not while intake is unhealthy
    const intake = RolesConfig.requiredSections(["intake"])
    expect(Health.ready("live", sections({ roles: true, registry: true }), intake)).toBe(false)
    expect(Health.ready("live", sections({ roles: true, intake: false }), intake)).toBe(false)
    expect(Health.ready("live", sections({ roles: true, intake: true }), intake)).toBe(true)
    // every role: intake, backfill and the retry scheduler
    const all = RolesConfig.requiredSections(ALL as RolesConfig.Roles)
    const healthy = { roles: true, intake: true, backfill: true, retryScheduler: true, delivery: true }
    expect(Health.ready("reconciling-live", sections(healthy), all)).toBe(true)
    expect(Health.ready("reconciling-live", sections({ ...healthy, backfill: false }), all)).toBe(false)
    const { retryScheduler: _, ...withoutScheduler } = healthy
    expect(Health.ready("live", sections(withoutScheduler), all)).toBe(false)
    expect(Health.ready("stopping", sections(healthy), all)).toBe(false)
  })

  it.scoped("/health: a required section that is not registered keeps the process unready; its sections only", () =>
    Effect.gen(function*() {
      const health = yield* Health.Health
      const lifecycle = yield* Lifecycle.Lifecycle
      yield* lifecycle.setPhase("live")
      yield* health.register("roles", Effect.succeed({ ready: true, body: RolesConfig.rolesBody(["intake"]) }))
      const before = yield* health.report
      expect(before.ready).toBe(false)
      expect(Object.keys(before.body).sort()).toEqual(["phase", "roles", "status"])
      yield* health.register("intake", Effect.succeed({ ready: true, body: { role: "standby" } }))
      const after = yield* health.report
      expect(after.ready).toBe(true)
      expect(after.body["status"]).toBe("ok")
    }).pipe(
      Effect.provide(
        Health.layerWith({ required: RolesConfig.requiredSections(["intake"]) }).pipe(
          Layer.provideMerge(Lifecycle.layer({ shutdownTimeout: "5 seconds" }))
        )
      )
    ))
})
