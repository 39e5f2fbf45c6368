/**
 * The CLI when its stdout's reader goes away (`firehook hooks tail | head -n 1`, or a long listing
 * piped to `head`): the runtime reports the failed write (EPIPE) as an `error` event, which ended
 * the process with an uncaught error and its stack, exit 1, before the command's clean-up ran (the
 * PDS session was left open). Now the command is interrupted, its clean-up runs, and the process
 * exits quietly with 141, as a command killed by SIGPIPE does.
 *
 * A fake PDS (signs in, mints service tokens) and a fake firehook XRPC server whose live tail sends
 * an outcome every 5 ms, on real sockets; the CLI runs as the suites run it (bundled, under Bun).
 */
import { Effect, Exit, Scope } from "effect"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { killAllChildren, killUnlessExited, spawnCli } from "../support/proc.js"
import { type FakePds, fakePds, PDS_DID, PDS_HANDLE, PDS_PASSWORD } from "./hook-records-fake-pds.js"
import { FAKE_DID, type FakeXrpc, startFake } from "./owner-api-fake.js"

const scope = Effect.runSync(Scope.make())
let pds: FakePds
let service: FakeXrpc

const b64 = (v: unknown) => Buffer.from(JSON.stringify(v), "utf8").toString("base64url")

beforeAll(async () => {
  pds = await Effect.runPromise(Scope.extend(fakePds, scope))
  // a service token as a PDS mints it (the fake service reads its claims, not its signature)
  pds.override.set("com.atproto.server.getServiceAuth", (call) => ({
    status: 200,
    body: {
      token: `${b64({ alg: "ES256K", typ: "JWT" })}.${
        b64({
          iss: PDS_DID,
          aud: call.query.get("aud"),
          lxm: call.query.get("lxm"),
          // a PDS's own default when the caller names no `exp` (the CLI names none): 60 s
          exp: Number(call.query.get("exp") ?? Math.floor(Date.now() / 1000) + 60)
        })
      }.c2ln`
    }
  }))
  service = await startFake()
}, 60_000)

afterAll(async () => {
  // a tail left running by a test that timed out (its `finally` never ran)
  killAllChildren()
  await service?.close()
  await Effect.runPromise(Scope.close(scope, Exit.void))
})

describe("stdout's reader goes away", () => {
  it("`hooks tail | head -n 1`: exit 141, nothing on stderr, the PDS session deleted", async () => {
    let timer: NodeJS.Timeout | undefined
    service.onSubscribe = (ws) => {
      let n = 0
      timer = setInterval(() => {
        if (n++ < 10_000 && ws.readyState === ws.OPEN) {
          ws.send(JSON.stringify({
            $type: "dev.firehook.webhook.subscribeDeliveries#outcome",
            id: `whd_v1_${String(n).padStart(4, "0")}`,
            rkey: "hook",
            event: "create",
            status: "delivered",
            httpStatus: 200,
            at: "2026-11-20T10:00:00.000Z"
          }))
        }
      }, 5)
    }
    const running = spawnCli(["hooks", "tail"], {
      ATPROTO_PDS: pds.url,
      ATPROTO_IDENTIFIER: PDS_HANDLE,
      ATPROTO_APP_PASSWORD: PDS_PASSWORD,
      FIREHOOK_SERVICE_URL: service.url,
      FIREHOOK_SERVICE_DID: FAKE_DID
    })
    try {
      // the first line read, then the reader goes away (as `head -n 1` does)
      // (or its exit: a CLI that failed fails the expectations below, it does not leave this waiting)
      await Promise.race([
        new Promise<void>((resolve) => running.child.stdout?.once("data", () => resolve())),
        running.exit
      ])
      running.child.stdout?.destroy()
      expect(await running.exit).toBe(141)
      expect(running.stderr()).toBe("")
      expect(pds.calls.map((c) => c.nsid)).toContain("com.atproto.server.deleteSession")
    } finally {
      clearInterval(timer)
      // a tail that did not stop must not outlive its test (it runs until it is stopped)
      killUnlessExited(running.child)
    }
  }, 60_000)
})
