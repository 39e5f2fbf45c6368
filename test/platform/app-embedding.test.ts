/**
 * Embedding (src/index.ts, README "Architecture"): a program that provides its own `SqlClient` /
 * `PgClient` (here `@effect/sql-pg`'s own layer) runs `App.service` with the configuration,
 * lifecycle and health layers and firehook's migrations, without `App.core` and without a
 * `Database.DatabaseUrl` (which only main's delivery supervisor reads): this file does not
 * type-check if `App.service` asks for one. The service starts, registers its parts' health
 * sections, and shuts down cleanly when the program's scope closes. A program's client that
 * transforms column names (`transformResultNames`) is used without its transforms
 * (`Database.withoutTransforms`): the registry loads its rows with their owners and scopes.
 */
import * as NodeHttpServer from "@effect/platform-node/NodeHttpServer"
import * as PgClient from "@effect/sql-pg/PgClient"
import { describe, expect, it } from "@effect/vitest"
import { Deferred, Effect, Exit, Layer, Redacted, Scope, String as Str } from "effect"
import { createServer } from "node:http"
import * as App from "../../src/layers/App.js"
import * as Config from "../../src/services/platform/Config.js"
import * as Database from "../../src/services/platform/Database.js"
import * as Health from "../../src/services/platform/Health.js"
import * as Lifecycle from "../../src/services/platform/Lifecycle.js"
import * as Db from "../support/db.js"
import { plc, testConfig } from "../support/stack.js"
import { insertWebhook } from "../support/webhookRows.js"

describe("App.service embedded with the program's own SqlClient", () => {
  it.live("starts on a PgClient layer of the program's, goes live, and closes cleanly with its scope", () =>
    Effect.gen(function*() {
      const { url } = yield* Db.freshDatabase
      const config = testConfig({ FIREHOOK_ROLES: "delivery,maintenance", HEALTH_PORT: "0" })
      const lifecycle = Lifecycle.layer({ shutdownTimeout: "5 seconds" })
      const core = Layer.effectDiscard(Database.migrate).pipe(
        Layer.provideMerge(
          Layer.mergeAll(
            PgClient.layer({ url }),
            Config.layerValue(config),
            Health.layer.pipe(Layer.provideMerge(lifecycle))
          )
        )
      )
      const report = yield* Deferred.make<Lifecycle.ShutdownReport>()
      const server = NodeHttpServer.layer(createServer, { host: "127.0.0.1", port: 0 })
      const app = App.service(server, { onShutdown: (r) => Deferred.succeed(report, r) }).pipe(
        Layer.provideMerge(core)
      )
      const scope = yield* Scope.make()
      const context = yield* Layer.buildWithScope(app, scope)
      const phase = yield* Effect.flatMap(Lifecycle.Lifecycle, (l) => l.phase).pipe(Effect.provide(context))
      expect(phase).toBe("live")
      const body = (yield* Effect.flatMap(Health.Health, (h) => h.report).pipe(Effect.provide(context))).body
      expect(Object.keys(body)).toEqual(expect.arrayContaining(["delivery", "maintenance", "redis", "roles"]))
      yield* Scope.close(scope, Exit.void)
      expect(yield* Deferred.await(report)).toEqual({ clean: true, unclean: [] })
    }).pipe(Effect.scoped))

  it.live("reads its rows right when the program's client transforms column names (snakeToCamel)", () =>
    Effect.gen(function*() {
      const { url } = yield* Db.freshDatabase
      const owner = plc(7)
      // the webhook row, written with a plain client
      yield* Effect.zipRight(Database.migrate, insertWebhook(owner, "3l2aaaaaaaa2a")).pipe(
        Effect.provide(PgClient.layer({ url }))
      )
      const config = testConfig({
        FIREHOOK_ROLES: "intake",
        HEALTH_PORT: "0",
        WEBHOOK_ALLOW_INSECURE_DEV: "1",
        JETSTREAM_URL: "ws://127.0.0.1:9/subscribe"
      })
      // a program whose own client maps names both ways (a common @effect/sql setup)
      const client = PgClient.layer({
        url: Redacted.make(Redacted.value(url)),
        transformResultNames: Str.snakeToCamel,
        transformQueryNames: Str.camelToSnake
      })
      const lifecycle = Lifecycle.layer({ shutdownTimeout: "5 seconds" })
      const core = Layer.effectDiscard(Database.migrate).pipe(
        Layer.provideMerge(
          Layer.mergeAll(client, Config.layerValue(config), Health.layer.pipe(Layer.provideMerge(lifecycle)))
        )
      )
      const server = NodeHttpServer.layer(createServer, { host: "127.0.0.1", port: 0 })
      const scope = yield* Scope.make()
      const context = yield* Layer.buildWithScope(App.service(server).pipe(Layer.provideMerge(core)), scope)
      const body = (yield* Effect.flatMap(Health.Health, (h) => h.report).pipe(Effect.provide(context))).body
      // with the names transformed, the row loaded with an undefined owner and scope DID (2 direct DIDs)
      expect(body["registry"]).toEqual(
        expect.objectContaining({ active: 1, owners: 1, directDids: 1, backlinkDids: 1, notLoaded: 0 })
      )
      yield* Scope.close(scope, Exit.void)
    }).pipe(Effect.scoped))
})
