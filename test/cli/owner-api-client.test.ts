/**
 * The owners' API client in process (SPEC §8.6, §8.2): the --service URL rules, the service DID read
 * from did.json (bounded in bytes and time), one fresh token per call addressed to the service's
 * DID for the call's method, refusals as one-line `ApiFailed`s, the tables, and the live tail over
 * a typed fake WebSocket. The XRPC server is ./owner-api-fake.ts on a real loopback socket; the
 * "PDS" is a typed fake `HooksShape` minting unsigned tokens the fake reads the claims of.
 */
import { Deferred, Duration, Effect, Either, Fiber, Option, Redacted, TestClock, TestContext } from "effect"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import * as OwnerApi from "../../src/cli/OwnerApi.js"
import * as Tail from "../../src/cli/OwnerTail.js"
import { cborFrame, FAKE_DID } from "./owner-api-fake.js"

const OWNER = "did:plc:abcdefghijklmnopqrstuvwx"
const T0 = "2026-11-20T10:00:00.000Z"

const run = <A, E>(eff: Effect.Effect<A, E>) => Effect.runPromise(Effect.either(eff))

const left = <A, E>(r: Either.Either<A, E>): E => {
  if (Either.isRight(r)) throw new Error("expected a failure")
  return r.left
}

/** A WebSocket the test drives: opened, fed and closed by hand. */
class DrivenSocket {
  static made: Array<DrivenSocket> = []
  static onMade: (s: DrivenSocket) => void = () => undefined
  binaryType = "blob"
  onopen: (() => void) | undefined
  onmessage: ((e: { data: unknown }) => void) | undefined
  onclose: ((e: { code: number; reason: string }) => void) | undefined
  closedByClient = false
  constructor(readonly url: string, readonly init: { headers: Record<string, string> }) {
    DrivenSocket.made.push(this)
    queueMicrotask(() => DrivenSocket.onMade(this))
  }
  close() {
    this.closedByClient = true
  }
  open() {
    this.onopen?.()
  }
  send(data: unknown) {
    this.onmessage?.({ data })
  }
  end(code: number, reason = "") {
    this.onclose?.({ code, reason })
  }
}

describe("tail", () => {
  const original: unknown = Reflect.get(globalThis, "WebSocket")
  beforeAll(() => {
    Reflect.set(globalThis, "WebSocket", DrivenSocket)
  })
  afterAll(() => {
    Reflect.set(globalThis, "WebSocket", original)
  })

  const outcome = { id: "whd_v1_0002", rkey: "hook", event: "create", status: "delivered", httpStatus: 200, at: T0 }
  const shape = (serviceUrl = "http://127.0.0.1:9", probe: Option.Option<OwnerApi.ApiFailed> = Option.none()) => {
    const tokens: Array<string> = []
    const probes: Array<string> = []
    const api: OwnerApi.OwnerApiShape = {
      did: OWNER,
      serviceUrl,
      serviceDid: FAKE_DID,
      call: () => Effect.die("unused"),
      token: (nsid) =>
        Effect.sync(() => {
          tokens.push(nsid)
          return Redacted.make(`token-${tokens.length}`)
        }),
      probe: (nsid) =>
        Effect.sync(() => {
          probes.push(nsid)
          return probe
        }),
      timeout: Duration.seconds(20)
    }
    return { api, tokens, probes }
  }

  /** Runs tail, driving the socket once made; the frames and losses it reported. */
  const drive = async (
    api: OwnerApi.OwnerApiShape,
    script: (s: DrivenSocket) => void
  ) => {
    const frames: Array<Tail.TailFrame> = []
    const lost: Array<[string, number]> = []
    DrivenSocket.onMade = script
    const r = await run(Tail.tail(api, {
      onFrame: (f) => Effect.sync(() => void frames.push(f)),
      onLost: (what, n) => Effect.sync(() => void lost.push([what, n]))
    }))
    return { r, frames, lost, socket: DrivenSocket.made.at(-1) }
  }

  it("frames in both encodings, in order; #info printed, unknown types skipped, invalid counted; the close", async () => {
    const { api, tokens } = shape()
    const t = await drive(api, (s) => {
      s.open()
      s.send(new Uint8Array(cborFrame({ op: 1, t: "#outcome" }, outcome)).buffer)
      s.send(JSON.stringify({ $type: "#info", name: "DeliveriesDropped", dropped: 2 }))
      s.send(cborFrame({ op: 1, t: "#somethingNew" }, { x: 1 }))
      s.send("{not json")
      s.send(JSON.stringify({ $type: `${Tail.NSID}#outcome`, ...outcome, id: "whd_v1_0003" }))
      s.end(1001, "going\naway")
    })
    expect(t.r).toEqual(Either.right({ code: 1001, reason: "going away" }))
    expect(t.frames).toEqual([
      { $type: `${Tail.NSID}#outcome`, ...outcome },
      { $type: `${Tail.NSID}#info`, name: "DeliveriesDropped", dropped: 2 },
      { $type: `${Tail.NSID}#outcome`, ...outcome, id: "whd_v1_0003" }
    ])
    expect(t.lost).toEqual([["invalid", 1]])
    expect(tokens).toEqual([Tail.NSID])
    expect(t.socket?.url).toBe(`ws://127.0.0.1:9/xrpc/${Tail.NSID}`)
    expect(t.socket?.init.headers).toEqual({ authorization: "Bearer token-1" })
    expect(t.socket?.binaryType).toBe("arraybuffer")
    expect(t.socket?.closedByClient).toBe(true)
  })

  it("https is wss; an error frame ends it with the error, one line", async () => {
    const { api } = shape("https://hooks.example.com")
    const t = await drive(api, (s) => {
      s.open()
      s.send(cborFrame({ op: 1, t: "#outcome" }, outcome))
      s.send(cborFrame({ op: -1 }, { error: "ConsumerTooSlow", message: "too\nslow" }))
      s.send(cborFrame({ op: 1, t: "#outcome" }, outcome))
    })
    expect(t.socket?.url).toBe(`wss://hooks.example.com/xrpc/${Tail.NSID}`)
    expect(t.frames).toHaveLength(1)
    expect(left(t.r)).toMatchObject({ _tag: "ApiFailed", error: "ConsumerTooSlow", text: "ConsumerTooSlow: too slow" })
    expect(t.socket?.closedByClient).toBe(true)
    const json = await drive(shape().api, (s) => {
      s.open()
      s.send(JSON.stringify({ error: "TooManyConnections" }))
    })
    expect(left(json.r)).toMatchObject({ error: "TooManyConnections", text: "TooManyConnections" })
  })

  it("more frames than the buffer holds: the oldest kept, the others dropped and reported once", async () => {
    const t = await drive(shape().api, (s) => {
      s.open()
      for (let i = 0; i < Tail.TAIL_BUFFER + 5; i++) s.send(cborFrame({ op: 1, t: "#outcome" }, outcome))
      s.end(1000)
    })
    expect(t.r).toEqual(Either.right({ code: 1000, reason: "" }))
    expect(t.frames).toHaveLength(Tail.TAIL_BUFFER)
    expect(t.lost).toEqual([["dropped", 5]])
  })

  it("a refused upgrade: the probe's XRPC error, else Unreachable", async () => {
    const refusal = new OwnerApi.ApiFailed({ error: "InvalidToken", status: 401, text: "InvalidToken: refused" })
    const refused = shape("http://127.0.0.1:9", Option.some(refusal))
    const t = await drive(refused.api, (s) => s.end(1006))
    expect(left(t.r)).toBe(refusal)
    expect(refused.probes).toEqual([Tail.NSID])
    const silent = await drive(shape().api, (s) => s.end(1006))
    expect(left(silent.r)).toMatchObject({
      error: "Unreachable",
      text: "could not open the subscription at 127.0.0.1:9"
    })
  })

  it("not opened within the call timeout: Timeout", async () => {
    const made = Effect.runSync(Deferred.make<void>())
    DrivenSocket.onMade = () => Effect.runSync(Deferred.succeed(made, undefined))
    const r = await Effect.runPromise(
      Effect.gen(function*() {
        const fiber = yield* Effect.fork(Effect.either(Tail.tail(shape().api, {
          onFrame: () => Effect.void,
          onLost: () => Effect.void
        })))
        yield* Deferred.await(made)
        yield* TestClock.adjust(Duration.seconds(20))
        return yield* Fiber.join(fiber)
      }).pipe(Effect.provide(TestContext.TestContext))
    )
    expect(left(r)).toMatchObject({ error: "Timeout", text: "the subscription at 127.0.0.1:9 did not open in time" })
    expect(DrivenSocket.made.at(-1)?.closedByClient).toBe(true)
  })

  it("frames larger than 64 KiB are not decoded", () => {
    const big = JSON.stringify({ $type: `${Tail.NSID}#info`, name: "DeliveriesDropped", dropped: 1, pad: "" })
    const fits = big.replace(`"pad":""`, `"pad":"${"x".repeat(Tail.MAX_FRAME_BYTES - big.length)}"`)
    expect(fits.length).toBe(Tail.MAX_FRAME_BYTES)
    expect(Tail.decodeFrame(fits)._tag).toBe("Frame")
    expect(Tail.decodeFrame(`${fits} `)._tag).toBe("Invalid")
    const bin = cborFrame({ op: 1, t: "#info" }, { name: "DeliveriesDropped", dropped: 1, pad: "" })
    const padded = cborFrame({ op: 1, t: "#info" }, {
      name: "DeliveriesDropped",
      dropped: 1,
      pad: "x".repeat(Tail.MAX_FRAME_BYTES - bin.length - 2)
    })
    expect(padded.length).toBe(Tail.MAX_FRAME_BYTES)
    expect(Tail.decodeFrame(padded)._tag).toBe("Frame")
    expect(Tail.decodeFrame(Buffer.concat([padded, Buffer.from([0])]))._tag).toBe("Invalid")
  })
})
