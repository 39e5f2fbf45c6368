/**
 * Backfill and reconciliation (SPEC §5) as two layers for the startup sequence (SPEC §6.1):
 *
 * - {@link identityLayer}: Identity (DID → PDS, cached) over its own SSRF-safe transport (timeouts
 *   and response bounds are set per request: 10 s; 1 MiB, `RECONCILE_PAGE_MAX_BYTES` (512 KiB) for listRecords pages). Built before intake, so intake can call
 *   `Identity.invalidate(did)` on `#identity` / `#account` events.
 * - {@link reconciliationLayer}: the reconcile store, the Reconciler (swapping completed owners into
 *   the in-memory Registry, when the process has one), the RetryScheduler (its rounds start when the layer is built) and the
 *   Backfill (idle until `Backfill.start`). Built after intake has started. It registers the health
 *   sections `backfill` and `retryScheduler` and the shutdown stages `backfill`, `scheduler-begin`
 *   and `scheduler-await`.
 *
 * The SPEC §5 bounds (`IDENTITY_CACHE_*`, `BACKFILL_PAGE_SIZE`, `BACKFILL_PASS_MAX_OWNERS`,
 * `BACKFILL_RETRY_*`, `RECONCILE_*`) are read from `FirehookConfig` by the services' `make`
 * (so the CLI's reconciler has them too); options given here win over them.
 */
import { Layer } from "effect"
import type { FirehookConfigShape } from "../services/platform/Config.js"
import { SafeHttp } from "../services/platform/http/SafeHttp.js"
import * as Backfill from "../services/reconciliation/Backfill.js"
import * as Identity from "../services/reconciliation/Identity.js"
import * as Reconciler from "../services/reconciliation/Reconciler.js"
import * as ReconcileStore from "../services/reconciliation/ReconcileStore.js"
import * as RetryScheduler from "../services/reconciliation/RetryScheduler.js"

/**
 * Identity and the transport it uses (also used by the reconciler and owner discovery). Requires
 * `FirehookConfig`. Decision: the operator allow-list (`DELIVERY_ALLOW_CIDRS`) is for webhook
 * receivers only; PLC, PDS and relay requests go to public addresses (loopback in insecure
 * development mode), as SPEC §5.1 says.
 */
export const identityLayer = (config: FirehookConfigShape) =>
  Identity.layer().pipe(
    Layer.provideMerge(SafeHttp.layerDefault({ allowInsecureDev: config.allowInsecureDev, allowCidrs: [] }))
  )

/**
 * Backfill + RetryScheduler (+ Reconciler, ReconcileStore). Requires `FirehookConfig`, `SqlClient`,
 * `Health`, `Lifecycle`, `Identity` and `SafeHttp` (the last two from {@link identityLayer}); uses
 * the in-memory `Registry` when the context has one (the process runs intake: completed owners are
 * swapped into it), else completion writes the store only (a `reconcile` process, SPEC §6.4).
 */
export const reconciliationLayer = (
  options: { readonly backfill?: Backfill.BackfillOptions; readonly limits?: Partial<Reconciler.ReconcileLimits> } = {}
) =>
  Layer.mergeAll(Backfill.layer(options.backfill), RetryScheduler.layer()).pipe(
    Layer.provideMerge(Reconciler.layer(options.limits)),
    Layer.provideMerge(ReconcileStore.layerSql)
  )
