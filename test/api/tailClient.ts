/**
 * A WebSocket client of the live tail for tests (the `ws` package, which sends the upgrade's
 * `Authorization` header), and a bounded poll on an observable condition.
 */
import { Effect } from "effect"
import WebSocket from "ws"
import type { Outcome } from "../../src/services/delivery/DeliveryOutcomes.js"

export interface TailClient {
  readonly ws: WebSocket
  /** every frame received, parsed */
  readonly frames: Array<{ readonly [k: string]: unknown }>
  /** set when the connection has closed */
  closed: { readonly code: number; readonly reason: string } | undefined
}

export type Connected =
  | { readonly _tag: "open"; readonly client: TailClient }
  | { readonly _tag: "refused"; readonly status: number; readonly body: string }

const NSID = "dev.firehook.webhook.subscribeDeliveries"

/** Open a tail on `port` (with `token` as the bearer, if any): open, or refused with the HTTP answer. */
export const openTail = (port: number, token: string | undefined, nsid = NSID) =>
  Effect.async<Connected>((resume) => {
    const ws = new WebSocket(`ws://127.0.0.1:${port}/xrpc/${nsid}`, {
      headers: token === undefined ? {} : { authorization: `Bearer ${token}` },
      handshakeTimeout: 10_000
    })
    const client: TailClient = { ws, frames: [], closed: undefined }
    ws.on("message", (data: Buffer) => client.frames.push(JSON.parse(data.toString("utf8")) as TailClient["frames"][0]))
    ws.on("close", (code: number, reason: Buffer) => (client.closed = { code, reason: reason.toString("utf8") }))
    ws.on("open", () => resume(Effect.succeed({ _tag: "open", client })))
    ws.on("unexpected-response", (_req, res) => {
      let body = ""
      res.on("data", (d: Buffer) => (body += d.toString("utf8")))
      res.on("end", () => {
        resume(Effect.succeed({ _tag: "refused", status: res.statusCode ?? 0, body }))
        ws.terminate()
      })
    })
    ws.on("error", () => {})
    return Effect.sync(() => ws.terminate())
  })

/** An open tail (fails the test otherwise). */
export const openTailOrDie = (port: number, token: string) =>
  Effect.flatMap(openTail(port, token), (c) =>
    c._tag === "open"
      ? Effect.succeed(c.client)
      : Effect.dieMessage(`tail refused: ${c.status} ${c.body}`))

/**
 * Wait (real time, at most `tries` × 20 ms) until `cond` holds; fails the test otherwise. Not a
 * timing assertion: it waits for an observable condition, with a bound.
 */
export const until = (what: string, cond: () => boolean, tries = 500): Effect.Effect<void> =>
  Effect.promise(async () => {
    for (let i = 0; i < tries; i++) {
      if (cond()) return true
      await new Promise((r) => setTimeout(r, 20))
    }
    return cond()
  }).pipe(Effect.flatMap((ok) => ok ? Effect.void : Effect.dieMessage(`timed out waiting: ${what}`)))

export const close = (client: TailClient) =>
  Effect.zipRight(Effect.sync(() => client.ws.close(1000)), until("closed", () => client.closed !== undefined))

/** {@link until} for a condition read by an effect. */
export const untilEffect = <R>(what: string, cond: Effect.Effect<boolean, never, R>, tries = 500) =>
  Effect.gen(function*() {
    for (let i = 0; i < tries; i++) {
      if (yield* cond) return
      yield* Effect.promise(() => new Promise((r) => setTimeout(r, 20)))
    }
    return yield* Effect.dieMessage(`timed out waiting: ${what}`)
  })

/** An outcome of `owner` (a fresh id; delivered with 200 unless `extra` says otherwise). */
let seq = 0
export const outcome = (owner: string, extra: Partial<Outcome> = {}): Outcome => ({
  id: `01TAIL${String(++seq).padStart(8, "0")}`,
  owner,
  rkey: "hook1",
  event: "create",
  status: "delivered",
  httpStatus: 200,
  errorKind: undefined,
  atMs: Date.now(),
  ...extra
})
