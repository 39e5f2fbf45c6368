/**
 * SPEC §6.1: SIGTERM at any moment of startup runs the ordered shutdown, exit 0 when the parts
 * stopped cleanly. With the delivery child (DELIVERY_PROCESS=child), a SIGTERM that comes right
 * after the child was spawned reaches the child while it is still loading its modules, before it
 * installed any signal handling. Before LifecycleSignals and DeliveryProcess.stoppedCleanly the
 * child died of the forwarded SIGTERM and the parent counted that unclean: exit 1
 * (`{"clean":false,"exit":"signal SIGTERM"}`). The signal is sent as soon as the parent logs
 * `delivery process started` (no sleep).
 */
import { afterAll, describe, expect, it } from "vitest"
import { e2eResources } from "../support/e2e.js"
import { exitWithin, freePort, startFirehook } from "../support/proc.js"

const res = e2eResources()
afterAll(() => res.cleanup())

interface LogLine {
  readonly message?: unknown
  readonly annotations?: Record<string, unknown>
}
const logLines = (stdout: string): Array<LogLine> =>
  stdout.split("\n").filter((l) => l.startsWith("{")).map((l) => JSON.parse(l) as LogLine)

const SHUTDOWN_TIMEOUT_MS = 10_000

describe("a signal right after the delivery child was spawned", () => {
  it(
    "SIGTERM as soon as the parent logs `delivery process started`: exit 0, the child's stop counted clean",
    async () => {
      const running = startFirehook({
        DATABASE_URL: await res.freshDb(),
        FIREHOOK_DATA_DIR: res.tempDir(),
        HEALTH_PORT: String(await freePort()),
        SHUTDOWN_TIMEOUT_MS: String(SHUTDOWN_TIMEOUT_MS),
        DELIVERY_PROCESS: "child",
        NODE_ENV: "test",
        WEBHOOK_ALLOW_INSECURE_DEV: "1",
        JETSTREAM_URL: "ws://127.0.0.1:9/subscribe"
      })
      const spawned = await new Promise<boolean>((resolve) => {
        const look = () => {
          if (running.stdout().includes("\"delivery process started\"")) {
            running.child.stdout?.off("data", look)
            resolve(true)
          }
        }
        running.child.stdout?.on("data", look)
        void running.exit.then(() => resolve(false))
      })
      expect(spawned, running.stderr() + running.stdout().slice(-2000)).toBe(true)
      running.child.kill("SIGTERM")
      const exit = await exitWithin(running, SHUTDOWN_TIMEOUT_MS + 10_000)
      const stopped = logLines(running.stdout()).find((l) => l.message === "delivery process stopped")
      expect(exit, running.stdout().slice(-3000)).toEqual({ code: 0, signal: null })
      expect(stopped?.annotations?.["clean"]).toBe(true)
      expect(running.stderr()).toBe("")
    },
    60_000
  )
})
