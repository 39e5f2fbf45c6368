/**
 * Where the delivery role runs (issue 16 item 2): `DELIVERY_PROCESS`, its default and rule, the
 * decision `auto` makes, and the environment a supervised delivery child gets. `PlatformConfig.load`
 * reads both variables.
 *
 * - `auto` (default): a child process when the machine has two or more cores
 *   (`os.availableParallelism()`), the process runs `delivery` and at least one other role
 *   (a delivery-only process has nothing to share its core with), and it is not itself a child;
 *   otherwise inline.
 * - `inline`: the delivery worker runs in this process (the single-process behaviour).
 * - `child`: a child process whenever the process runs `delivery` (and is not itself a child).
 *
 * `FIREHOOK_DELIVERY_CHILD=1` is internal: the parent sets it in its child's environment. A child
 * never spawns a child of its own, and shuts itself down when its parent dies.
 */
import { Effect } from "effect"
import { type ConfigInvalid, readEnumVar } from "./ConfigRead.js"
import * as RolesConfig from "./RolesConfig.js"

export const MODES = ["auto", "inline", "child"] as const
export type Mode = (typeof MODES)[number]

/** `DELIVERY_PROCESS`: `auto` | `inline` | `child`. */
export const deliveryProcess = { env: "DELIVERY_PROCESS", default: "auto", values: MODES } as const

/** `FIREHOOK_DELIVERY_CHILD` (internal): `1` in the environment of a supervised delivery child. */
export const childMarker = { env: "FIREHOOK_DELIVERY_CHILD", default: "0", values: ["0", "1"] } as const

export interface DeliveryProcessSection {
  /** `DELIVERY_PROCESS` */
  readonly mode: Mode
  /** this process is a supervised delivery child (`FIREHOOK_DELIVERY_CHILD=1`) */
  readonly isChild: boolean
}

export const load: Effect.Effect<DeliveryProcessSection, ConfigInvalid> = Effect.gen(function*() {
  const mode = yield* readEnumVar(deliveryProcess)
  const marker = yield* readEnumVar(childMarker)
  return { mode, isChild: marker === "1" }
})

/**
 * Whether the delivery role runs in a child process: never in a child or without `delivery`;
 * `child` always then; `auto` with ≥ 2 cores and at least one other role.
 */
export const runsChild = (section: DeliveryProcessSection, roles: RolesConfig.Roles, cores: number): boolean => {
  if (section.isChild || !RolesConfig.runs(roles, "delivery")) return false
  switch (section.mode) {
    case "inline":
      return false
    case "child":
      return true
    case "auto":
      return cores >= 2 && roles.some((r) => r !== "delivery")
  }
}
