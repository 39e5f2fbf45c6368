/**
 * The owners' API client's live tail (SPEC §8.6, src/cli/OwnerTail.ts) over a typed fake WebSocket
 * the test drives: frames in both encodings, losses reported, a refused upgrade, timeouts, and the
 * frames' decoding and size bound.
 */
import { Deferred, Duration, Effect, Either, Fiber, Option, Redacted, TestClock, TestContext } from "effect"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import * as OwnerApi from "../../src/cli/OwnerApi.js"
import * as Tail from "../../src/cli/OwnerTail.js"
import { left, OWNER, run, T0 } from "./owner-api-client-support.js"
import { cborFrame, FAKE_DID } from "./owner-api-fake.js"

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
    script: (s: DrivenSocket) => void,
    onEach: (handled: number, s: DrivenSocket) => void = () => undefined
  ) => {
    const frames: Array<Tail.TailFrame> = []
    const lost: Array<[string, number]> = []
    DrivenSocket.onMade = script
    const r = await run(Tail.tail(api, {
      onFrame: (f) =>
        Effect.sync(() => {
          frames.push(f)
          const s = DrivenSocket.made.at(-1)
          if (s !== undefined) onEach(frames.length, s)
        }),
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

  it("drops reported as they happen: a second overflow reports only its own", async () => {
    const burst = (s: DrivenSocket, n: number) => {
      for (let i = 0; i < n; i++) s.send(cborFrame({ op: 1, t: "#outcome" }, outcome))
    }
    const t = await drive(shape().api, (s) => {
      s.open()
      burst(s, Tail.TAIL_BUFFER + 5)
    }, (handled, s) => {
      if (handled === Tail.TAIL_BUFFER) {
        burst(s, Tail.TAIL_BUFFER + 3)
        s.end(1000)
      }
    })
    expect(t.r).toEqual(Either.right({ code: 1000, reason: "" }))
    expect(t.frames).toHaveLength(2 * Tail.TAIL_BUFFER)
    expect(t.lost).toEqual([["dropped", 5], ["dropped", 3]])
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

  /** tail with handlers that do nothing, on the TestClock: `steps` runs once the socket is made */
  const onTestClock = (
    onMade: (s: DrivenSocket) => void,
    steps: (fiber: Fiber.RuntimeFiber<Either.Either<Tail.TailEnd, unknown>>) => Effect.Effect<void>
  ) => {
    const made = Effect.runSync(Deferred.make<void>())
    DrivenSocket.onMade = (s) => {
      onMade(s)
      Effect.runSync(Deferred.succeed(made, undefined))
    }
    return Effect.runPromise(
      Effect.gen(function*() {
        const fiber = yield* Effect.fork(Effect.either(Tail.tail(shape().api, {
          onFrame: () => Effect.void,
          onLost: () => Effect.void
        })))
        yield* Deferred.await(made)
        yield* steps(fiber)
        return yield* Fiber.join(fiber)
      }).pipe(Effect.provide(TestContext.TestContext))
    )
  }

  it("not opened within the call timeout: Timeout", async () => {
    const r = await onTestClock(() => undefined, () => TestClock.adjust(Duration.seconds(20)))
    expect(left(r)).toMatchObject({ error: "Timeout", text: "the subscription at 127.0.0.1:9 did not open in time" })
    expect(DrivenSocket.made.at(-1)?.closedByClient).toBe(true)
  })

  it("open but never closed by the service: Timeout after 25 h (the service closes at 24 h), the socket closed", async () => {
    const r = await onTestClock((s) => s.open(), (fiber) =>
      Effect.gen(function*() {
        yield* TestClock.adjust(Duration.hours(25).pipe(Duration.subtract(Duration.seconds(1))))
        expect(fiber.unsafePoll()).toBeNull()
        yield* TestClock.adjust(Duration.seconds(1))
      }))
    expect(left(r)).toMatchObject({ error: "Timeout", text: "the subscription was not closed within 25 h" })
    expect(DrivenSocket.made.at(-1)?.closedByClient).toBe(true)
  })

  it("binary frames: op 1 with a type, op -1 an error (its name printable, at most 64 characters)", () => {
    expect(Tail.decodeFrame(cborFrame({ op: 2, t: "#outcome" }, outcome))._tag).toBe("Invalid")
    expect(Tail.decodeFrame(cborFrame({ op: 1, t: "#outcome" }, outcome))._tag).toBe("Frame")
    expect(Tail.decodeFrame(cborFrame({ op: -1 }, { error: `Too\u001bSlow${"x".repeat(100)}`, message: "m" }))).toEqual(
      {
        _tag: "Error",
        error: `Too Slow${"x".repeat(56)}`,
        message: "m"
      }
    )
    expect(Tail.decodeFrame(cborFrame({ op: -1 }, { message: 1 }))).toEqual({
      _tag: "Error",
      error: "Error",
      message: ""
    })
    // a JSON text frame is an error only without a $type: a typed message with an "error" field is a message
    const typedWithError = JSON.stringify({ $type: `${Tail.NSID}#outcome`, ...outcome, error: "x" })
    expect(Tail.decodeFrame(typedWithError)._tag).toBe("Frame")
    expect(Tail.decodeFrame(JSON.stringify({ error: "Gone", message: "bye" }))).toEqual({
      _tag: "Error",
      error: "Gone",
      message: "bye"
    })
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
