/**
 * A loopback port for a listener that another process binds a moment later (the delivery child's
 * health port, a test's child process). Not one the kernel chose for port 0: that comes from the
 * ephemeral range, where between our close and the other process's bind (about a second for a Bun
 * child) any listener on port 0 may be given the same port (and outbound connections take their
 * local ports from that range too). A random port below the ephemeral range, checked bindable, can
 * only be taken by a listener that names it. Falls back to the kernel's choice.
 *
 * @since 0.1.0
 */
import { Effect, Random } from "effect"
import * as Fs from "node:fs"
import * as Net from "node:net"

/** Linux's default lower bound of the ephemeral range (`ip_local_port_range`). */
const DEFAULT_EPHEMERAL_LOW = 32_768
/** Ports below the ephemeral range chosen from. */
const SPAN = 12_000
/** Random ports tried before falling back to the kernel's choice. */
const TRIES = 64

/** The lowest port the kernel hands out for port 0 and outbound connections (Linux; else 32768). */
const ephemeralLow = Effect.try(() =>
  Number(Fs.readFileSync("/proc/sys/net/ipv4/ip_local_port_range", "utf8").trim().split(/\s+/)[0])
).pipe(
  Effect.map((low) => (Number.isInteger(low) && low > 2048 ? low : DEFAULT_EPHEMERAL_LOW)),
  Effect.orElseSucceed(() => DEFAULT_EPHEMERAL_LOW)
)

/** Listens on `127.0.0.1:port` and closes: the port it got (0: none). */
const listenOnce = (port: number) =>
  Effect.async<number>((resume) => {
    const server = Net.createServer()
    server.once("error", () => resume(Effect.succeed(0)))
    server.listen(port, "127.0.0.1", () => {
      const address = server.address()
      const got = typeof address === "object" && address !== null ? address.port : 0
      server.close(() => resume(Effect.succeed(got)))
    })
  })

/** A free loopback port (see the module documentation); 0 only when none could be had at all. */
export const freeLoopbackPort: Effect.Effect<number> = Effect.gen(function*() {
  const high = yield* ephemeralLow
  const low = Math.max(1025, high - SPAN)
  for (let i = 0; i < TRIES; i++) {
    const port = yield* Random.nextIntBetween(low, high)
    if ((yield* listenOnce(port)) === port) return port
  }
  return yield* listenOnce(0)
})
