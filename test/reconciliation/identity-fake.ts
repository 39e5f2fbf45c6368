/**
 * Identity over a fake SafeHttp answering from a map, for the Identity tests: a value is served as
 * 200 JSON (a string as it is), `{ status, raw }` with that status, a missing URL is a 404; every
 * request's URL and transport bounds are recorded; `gate` holds requests, `fail` fails them.
 */
import { Deferred, Effect, Layer } from "effect"
import * as Config from "../../src/services/platform/Config.js"
import {
  SafeHttp,
  SafeHttpError,
  type SafeRequest,
  type SafeResponse
} from "../../src/services/platform/http/SafeHttp.js"
import * as Identity from "../../src/services/reconciliation/Identity.js"
import { testConfig } from "../support/stack.js"

export const PLC = "https://plc.test"

export interface FakeHttp {
  readonly requests: Array<string>
  /** the transport's bounds of each request */
  readonly bounds: Array<{ readonly timeoutMs: number; readonly maxResponseBytes: number }>
  /** url → response (a value is served as 200 JSON); missing → 404 */
  readonly answers: Map<string, unknown>
  /** when set, requests wait for it */
  gate: Deferred.Deferred<void> | undefined
  fail: boolean
}

export const newFake = (): FakeHttp => ({ requests: [], bounds: [], answers: new Map(), gate: undefined, fail: false })

const response = (status: number, value: unknown): SafeResponse => ({
  status,
  headers: {},
  body: new TextEncoder().encode(typeof value === "string" ? value : JSON.stringify(value)),
  truncated: false
})

const fakeHttpLayer = (fake: FakeHttp) =>
  Layer.succeed(SafeHttp, {
    request: (req: SafeRequest) =>
      Effect.gen(function*() {
        fake.requests.push(req.url)
        fake.bounds.push({ timeoutMs: req.timeoutMs, maxResponseBytes: req.maxResponseBytes })
        if (fake.gate !== undefined) yield* Deferred.await(fake.gate)
        if (fake.fail) return yield* Effect.fail(new SafeHttpError({ kind: "network" }))
        const answer = fake.answers.get(req.url)
        if (answer === undefined) return response(404, { message: "DID not registered" })
        if (typeof answer === "object" && answer !== null && "status" in answer && "raw" in answer) {
          return response(Number(answer.status), answer.raw)
        }
        return response(200, answer)
      })
  })

/** Identity.layer over `fake`, with the test configuration (PLC at {@link PLC}) and `env`. */
export const identityLayer = (
  fake: FakeHttp,
  options: Identity.IdentityOptions = {},
  env: Record<string, string> = {}
) =>
  Identity.layer(options).pipe(
    Layer.provide(fakeHttpLayer(fake)),
    Layer.provide(Config.layerValue(testConfig({ PLC_DIRECTORY_URL: PLC, ...env })))
  )

/** Let forked fibers (background refreshes) run. */
export { settle } from "../support/settle.js"
