/**
 * Embedding (SPEC §4.4: "an embedding program can add or override presets by providing its own
 * layer"): a program that runs `App.service` with its own delivery presets
 * (`ServiceOptions.destinations`, here `Destinations.layerWith` overriding `webhook` to add
 * `X-Custom: 1`) has its deliveries sent through them. Before stop 55 `App.service` always wired the
 * built-in presets and a program's own were ignored. Its own core, as app-embedding.test.ts.
 */
import * as NodeHttpServer from "@effect/platform-node/NodeHttpServer"
import * as PgClient from "@effect/sql-pg/PgClient"
import { describe, expect, it } from "@effect/vitest"
import { Duration, Effect, Either, Exit, Layer, Scope } from "effect"
import { createServer } from "node:http"
import * as App from "../../src/layers/App.js"
import * as Destinations from "../../src/services/delivery/Destinations.js"
import * as Outbox from "../../src/services/matching/Outbox.js"
import * as TestDelivery from "../../src/services/operator/TestDelivery.js"
import * as Config from "../../src/services/platform/Config.js"
import * as Database from "../../src/services/platform/Database.js"
import * as Health from "../../src/services/platform/Health.js"
import * as Lifecycle from "../../src/services/platform/Lifecycle.js"
import * as RegistryStore from "../../src/services/registry/RegistryStore.js"
import { eventually, receiver } from "../delivery/worker-support.js"
import * as Db from "../support/db.js"
import { plc, testConfig } from "../support/stack.js"
import { insertWebhook } from "../support/webhookRows.js"

const custom = Destinations.layerWith([{
  name: "webhook",
  matches: () => true,
  transform: (input) =>
    Either.map(
      Destinations.webhookPreset(input),
      (req) => req === null ? null : { ...req, headers: { ...req.headers, "X-Custom": "1" } }
    )
}])

describe("App.service with the program's own Destinations layer (SPEC §4.4)", () => {
  it.live("sends through the program's override of the webhook preset", () =>
    Effect.gen(function*() {
      const rx = yield* receiver()
      const { url } = yield* Db.freshDatabase
      const owner = plc(71)
      const rkey = "3l2aaaaaaaa2a"
      const client = PgClient.layer({ url })
      yield* Effect.zipRight(
        Database.migrate,
        insertWebhook(owner, rkey, {
          url: `${rx.url}/hook`,
          state: { signing_mode: "'none'", secret_id: "NULL" }
        })
      ).pipe(Effect.provide(client))
      const config = testConfig({ FIREHOOK_ROLES: "delivery", HEALTH_PORT: "0", WEBHOOK_ALLOW_INSECURE_DEV: "1" })
      const core = Layer.effectDiscard(Database.migrate).pipe(
        Layer.provideMerge(
          Layer.mergeAll(
            client,
            Config.layerValue(config),
            Health.layer.pipe(Layer.provideMerge(Lifecycle.layer({ shutdownTimeout: "5 seconds" })))
          )
        )
      )
      const server = NodeHttpServer.layer(createServer, { host: "127.0.0.1", port: 0 })
      const app = App.service(server, { destinations: custom }).pipe(Layer.provideMerge(core))
      const scope = yield* Scope.make()
      const context = yield* Layer.buildWithScope(app, scope)
      const enqueued = yield* TestDelivery.enqueue(owner, rkey).pipe(
        Effect.provide(Layer.mergeAll(RegistryStore.layerSql, Outbox.layerSql).pipe(Layer.provide(client)))
      )
      expect(enqueued._tag).toBe("Enqueued")
      yield* eventually("a request", Effect.sync(() => rx.received.length), (n) => n >= 1, 15_000)
      const req = rx.received[0]
      expect(req?.headers["x-firehook-test"]).toBe("1")
      expect(req?.headers["x-custom"], "the program's webhook preset was used").toBe("1")
      void context
      yield* Scope.close(scope, Exit.void)
    }).pipe(Effect.scoped, Effect.timeout(Duration.seconds(60))), 90_000)
})
