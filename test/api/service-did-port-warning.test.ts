/**
 * A `PUBLIC_URL` with a port (not localhost) gives the default service DID `did:web:<host>%3A<port>`,
 * which atproto PDSes mint no service-auth tokens for (`getServiceAuth` refuses the `aud`: a port in
 * a did:web is allowed only for localhost), so no owner can get a token for the service. The default
 * stays (a PDS proxying calls resolves it), and the API logs one warning when it starts
 * (`Api.start`), with no URL or DID in it. Real PostgreSQL (the API's stores).
 */
import { isAtprotoDid } from "@atproto/did"
import * as NodeHttpServer from "@effect/platform-node/NodeHttpServer"
import { describe, expect, layer } from "@effect/vitest"
import { Effect, Exit, Layer, Logger, LogLevel, Option, Scope } from "effect"
import * as Api from "../../src/services/api/Api.js"
import * as ApiConfig from "../../src/services/api/ApiConfig.js"
import * as DeliveryOutcomes from "../../src/services/delivery/DeliveryOutcomes.js"
import * as Config from "../../src/services/platform/Config.js"
import * as Health from "../../src/services/platform/Health.js"
import * as Lifecycle from "../../src/services/platform/Lifecycle.js"
import * as Db from "../support/db.js"
import { testConfig } from "../support/stack.js"
import { captureLogs } from "./support.js"

/** The warnings `Api.start` logs with `env`, and the service DID it runs with. */
const startWith = (env: Record<string, string>) =>
  Effect.gen(function*() {
    const { capture, lines } = captureLogs()
    const config = testConfig(env)
    const scope = yield* Scope.make()
    yield* Api.start(NodeHttpServer.layerTest, scope).pipe(
      Effect.provide(Layer.mergeAll(
        Config.layerValue(config),
        Health.layer.pipe(Layer.provideMerge(Lifecycle.layer({ shutdownTimeout: "5 seconds" }))),
        DeliveryOutcomes.layerMemory
      )),
      Effect.provide(Logger.replace(Logger.defaultLogger, capture)),
      Logger.withMinimumLogLevel(LogLevel.All),
      Effect.ensuring(Scope.close(scope, Exit.void))
    )
    return { did: Option.getOrUndefined(config.api.serviceDid), warnings: lines.filter((l) => l.level === "WARN") }
  })

describe("the startup warning of a service DID PDSes mint no tokens for", () => {
  layer(Db.layer())((it) => {
    it.effect("PUBLIC_URL https://hooks.example.com:8443: the default DID is kept, one warning without URL or DID", () =>
      Effect.gen(function*() {
        const { did, warnings } = yield* startWith({ PUBLIC_URL: "https://hooks.example.com:8443" })
        expect(did).toBe("did:web:hooks.example.com%3A8443")
        expect(isAtprotoDid(did ?? "")).toBe(false) // the PDS's check of getServiceAuth's aud
        expect(warnings.map((l) => l.message)).toEqual([ApiConfig.SERVICE_DID_PORT_WARNING])
        const message = warnings[0]?.message ?? ""
        expect(message).toContain("set SERVICE_DID")
        for (const leak of ["hooks.example.com", "8443", "did:web:", "https://"]) expect(message).not.toContain(leak)
      }))

    it.effect("an explicit SERVICE_DID with a port is warned about too", () =>
      Effect.gen(function*() {
        const { warnings } = yield* startWith({ SERVICE_DID: "did:web:hooks.example.com%3A8443" })
        expect(warnings.map((l) => l.message)).toEqual([ApiConfig.SERVICE_DID_PORT_WARNING])
      }))

    for (
      const env of [
        { PUBLIC_URL: "https://hooks.example.com" },
        { PUBLIC_URL: "http://localhost:2584", WEBHOOK_ALLOW_INSECURE_DEV: "1" },
        { PUBLIC_URL: "https://hooks.example.com:8443", SERVICE_DID: "did:web:hooks.example.com" },
        { SERVICE_DID: "did:plc:ewvi7nxzyoun6zhxrhs64oiz" }
      ]
    ) {
      it.effect(`no warning for ${JSON.stringify(env)}`, () =>
        Effect.gen(function*() {
          const { did, warnings } = yield* startWith(env)
          expect(isAtprotoDid(did ?? "")).toBe(true)
          expect(warnings).toEqual([])
        }))
    }
  })
})
