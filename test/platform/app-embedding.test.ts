/**
 * Embedding (src/index.ts, README "Architecture"): a program that provides its own `SqlClient` /
 * `PgClient` (here `@effect/sql-pg`'s own layer) runs `App.service` with the configuration,
 * lifecycle and health layers and firehook's migrations, without `App.core` and without a
 * `Database.DatabaseUrl` (which only main's delivery supervisor reads): this file does not
 * type-check if `App.service` asks for one. The service starts, registers its parts' health
 * sections, and shuts down cleanly when the program's scope closes.
 */
import { NodeHttpServer } from "@effect/platform-node"
import { PgClient } from "@effect/sql-pg"
import { describe, expect, it } from "@effect/vitest"
import { Deferred, Effect, Exit, Layer, Scope } from "effect"
import { createServer } from "node:http"
import * as App from "../../src/layers/App.js"
import * as Config from "../../src/services/platform/Config.js"
import * as Database from "../../src/services/platform/Database.js"
import * as Health from "../../src/services/platform/Health.js"
import * as Lifecycle from "../../src/services/platform/Lifecycle.js"
import * as Db from "../support/db.js"
import { testConfig } from "../support/stack.js"

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
})
