/**
 * Layer stacks for the matching pipeline: in memory (unit tests) and on PostgreSQL (integration).
 */
import type * as SqlClient from "@effect/sql/SqlClient"
import { ConfigProvider, Effect, Layer } from "effect"
import type { Operation, RecordEvent } from "../../src/schemas/RecordEvent.js"
import { tidFromMicros } from "../../src/schemas/Tid.js"
import * as CursorStore from "../../src/services/intake/CursorStore.js"
import * as Outbox from "../../src/services/matching/Outbox.js"
import * as PriorRefsStore from "../../src/services/matching/PriorRefsStore.js"
import * as Processor from "../../src/services/matching/Processor.js"
import * as Config from "../../src/services/platform/Config.js"
import { Tx } from "../../src/services/platform/Persistence.js"
import * as Registry from "../../src/services/registry/Registry.js"
import * as RegistryStore from "../../src/services/registry/RegistryStore.js"
import * as Db from "./db.js"

export const testConfig = (env: Record<string, string> = {}): Config.FirehookConfigShape =>
  Effect.runSync(
    Config.load({ isTty: false }).pipe(
      Effect.withConfigProvider(ConfigProvider.fromMap(new Map(Object.entries({ NODE_ENV: "test", ...env }))))
    )
  )

export const memoryStack = (
  options: {
    readonly env?: Record<string, string>
    readonly calls?: PriorRefsStore.PriorRefsCalls
    readonly priorLimits?: Processor.PriorRefLimits
    readonly registryStore?: Layer.Layer<RegistryStore.RegistryStore, unknown>
    readonly config?: Config.FirehookConfigShape
  } = {}
) =>
  Processor.layer(options.priorLimits).pipe(
    Layer.provideMerge(Registry.layer),
    Layer.provideMerge(
      Layer.mergeAll(
        options.registryStore ?? RegistryStore.layerMemory,
        PriorRefsStore.layerMemory(options.calls),
        Outbox.layerMemory,
        Tx.layerMemory,
        CursorStore.layerMemory
      )
    ),
    Layer.provideMerge(Config.layerValue(options.config ?? testConfig(options.env)))
  )

/** The matching pipeline's services on PostgreSQL, over a database and a configuration given. */
export const sqlServices = (outbox?: Layer.Layer<Outbox.OutboxStore, never, SqlClient.SqlClient>) =>
  Processor.layer().pipe(
    Layer.provideMerge(Registry.layer),
    Layer.provideMerge(
      Layer.mergeAll(
        RegistryStore.layerSql,
        PriorRefsStore.layerSql,
        outbox ?? Outbox.layerSql,
        CursorStore.layerSql,
        Tx.layerSql
      )
    )
  )

/** The same on a fresh migrated PostgreSQL database (optionally with another outbox store). */
export const sqlStack = (
  options: {
    readonly env?: Record<string, string>
    readonly outbox?: Layer.Layer<Outbox.OutboxStore, never, SqlClient.SqlClient>
  } = {}
) =>
  sqlServices(options.outbox).pipe(
    Layer.provideMerge(Layer.mergeAll(Db.layer(), Config.layerValue(testConfig(options.env))))
  )

export { plc } from "../matching/fixtures.js"

/** A TID that grows with n (n = seconds after a fixed epoch). */
export const rev = (n: number): string => tidFromMicros(1_700_000_000_000_000 + n * 1_000_000)

export const WH = "place.wisp.v2.wh"

export const whRecordValue = (
  aturi: string,
  o: {
    readonly url?: string
    readonly backlinks?: boolean
    readonly events?: ReadonlyArray<Operation>
    readonly enabled?: boolean
    readonly secret?: string
    readonly secretId?: string
  } = {}
): Record<string, unknown> => ({
  $type: WH,
  scope: o.backlinks === undefined ? { aturi } : { aturi, backlinks: o.backlinks },
  url: o.url ?? "https://receiver.example/hook",
  createdAt: "2026-01-01T00:00:00Z",
  ...(o.events === undefined ? {} : { events: o.events }),
  ...(o.enabled === undefined ? {} : { enabled: o.enabled }),
  ...(o.secret === undefined ? {} : { secret: o.secret }),
  ...(o.secretId === undefined ? {} : { secretId: o.secretId })
})

let timeCounter = 1_700_000_000_000_000
export const ev = (
  did: string,
  collection: string,
  rkey: string,
  o: {
    readonly operation?: Operation
    readonly record?: unknown
    readonly rev?: string
    readonly timeUs?: number
    readonly cid?: string
    readonly stream?: string
  } = {}
): RecordEvent => {
  const operation = o.operation ?? "create"
  const timeUs = o.timeUs ?? (timeCounter += 1000)
  return {
    kind: "commit",
    did,
    collection,
    rkey,
    operation,
    rev: o.rev ?? rev(1),
    cid: operation === "delete" ? undefined : (o.cid ?? "bafyreib2rxk3rh6kzwq"),
    record: operation === "delete" ? undefined : (o.record ?? { $type: collection, text: "hi" }),
    timeUs,
    stream: o.stream ?? "registry",
    relay: "wss://relay.test",
    cursor: String(timeUs)
  }
}

/** A wh-record event for owner/rkey. */
export const whEv = (
  owner: string,
  rkey: string,
  record: unknown,
  o: { readonly operation?: Operation; readonly rev?: string; readonly timeUs?: number } = {}
) => ev(owner, WH, rkey, { ...o, record })
