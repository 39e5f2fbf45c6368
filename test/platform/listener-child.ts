/**
 * Run by test/platform/listener.test.ts under Bun (the production runtime):
 * `bun test/platform/listener-child.ts <host> <port>` builds `Listener.guard(BunHttpServer.layer(…))`
 * for the health listener's variables and prints the failure's message, or `listening`.
 */
import * as BunHttpServer from "@effect/platform-bun/BunHttpServer"
import { Cause, Effect, Exit, Layer, Option } from "effect"
import * as Listener from "../../src/services/platform/Listener.js"

const [host = "127.0.0.1", portText = "0"] = process.argv.slice(2)
const port = Number(portText)
const server = Listener.guard(BunHttpServer.layer({ hostname: host, port }), {
  hostVariable: "HEALTH_HOST",
  portVariable: "HEALTH_PORT",
  host,
  port
})
const exit = await Effect.runPromiseExit(Effect.scoped(Layer.build(server)))
const failure = Exit.isFailure(exit) ? Cause.failureOption(exit.cause) : Option.none()
process.stdout.write(
  Exit.isSuccess(exit)
    ? "listening\n"
    : Option.isSome(failure) && failure.value instanceof Listener.ListenerUnavailable
    ? `${failure.value._tag} ${failure.value.message}\n`
    : `other ${Cause.pretty(exit.cause).split("\n")[0] ?? ""}\n`
)
