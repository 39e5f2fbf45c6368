/**
 * The live tail under Bun, the production runtime (vitest runs on Node: Bun runs as a child).
 * - The smoke (test/support/tail-bun-smoke.ts): upgrade, a frame, the 24 h close, the release.
 * - A reader that stops reading: the tail served by Bun (`bun test/api/tailClient.ts`, the real
 *   TailMethods handler on BunHttpServer, on a TestClock driven over HTTP), a `ws` client in this
 *   process that pauses its socket. Bun's buffer for the socket stays bounded, the hub drops and
 *   counts, the `#info` frame with the exact count follows the kept frames once the reader resumes,
 *   and a reader that takes nothing for 30 s is closed with 1008 `slow reader`.
 */
import { Duration, Effect } from "effect"
import { type ChildProcessWithoutNullStreams, spawn, spawnSync } from "node:child_process"
import * as Path from "node:path"
import { describe, expect, it } from "vitest"
import { BUFFER_FRAMES, INFO_TYPE, OUTCOME_TYPE } from "../../src/services/api/Tail.js"
import { DRAIN_DEADLINE, SOCKET_BUFFER_BYTES } from "../../src/services/api/TailSocket.js"
import { type BunTailStats, openTailOrDie } from "./tailClient.js"

const ROOT = Path.resolve(import.meta.dirname, "../..")
const BUN = Path.join(ROOT, "node_modules/.bin/bun")
const ENV = { PATH: process.env["PATH"] ?? "", HOME: process.env["HOME"] ?? "/tmp" }
/** Bun may hold the bound plus one batch taken from the hub (a frame here is under 512 bytes). */
const BUN_BUFFER_MAX = SOCKET_BUFFER_BYTES + BUFFER_FRAMES * 512

/** Wait (real time, at most `tries` × 20 ms, doing `step` before each look) until `cond` holds. */
const until = async (what: string, cond: () => boolean | Promise<boolean>, step?: () => Promise<void>, tries = 500) => {
  for (let i = 0; i < tries; i++) {
    if (step !== undefined) await step()
    if (await cond()) return
    await new Promise((r) => setTimeout(r, 20))
  }
  expect.fail(`timed out waiting: ${what}`)
}

const startBun = async () => {
  const child: ChildProcessWithoutNullStreams = spawn(BUN, ["test/api/tailClient.ts"], { cwd: ROOT, env: ENV })
  let stderr = ""
  child.stderr.on("data", (d: Buffer) => (stderr += d.toString("utf8")))
  const port = await new Promise<number>((resolve, reject) => {
    let out = ""
    child.stdout.on("data", (d: Buffer) => {
      out += d.toString("utf8")
      const line = out.split("\n")[0]
      if (out.includes("\n") && line !== undefined) resolve((JSON.parse(line) as { port: number }).port)
    })
    child.once("exit", (code) => reject(new Error(`bun exited (${code}): ${stderr}`)))
  })
  const base = `http://127.0.0.1:${port}`
  const post = async (path: string) => expect((await fetch(base + path, { method: "POST" })).status).toBe(204)
  return {
    port,
    pid: child.pid ?? 0,
    stderr: () => stderr,
    stop: () => void child.kill(),
    stats: async () => (await (await fetch(`${base}/stats`)).json()) as BunTailStats,
    publish: (n: number) => post(`/publish?n=${n}`),
    advance: (ms: number) => post(`/advance?ms=${ms}`)
  }
}

describe("live tail under Bun", () => {
  it("upgrade, a frame, the 24 h close and the release on BunHttpServer", () => {
    const r = spawnSync(BUN, ["test/support/tail-bun-smoke.ts"], {
      cwd: ROOT,
      encoding: "utf8",
      timeout: 60_000,
      env: ENV
    })
    expect(r.stderr).toBe("")
    expect(r.stdout.trim()).toBe("ok")
    expect(r.status).toBe(0)
  }, 90_000)

  it(
    "a reader that stops reading: Bun's buffer stays bounded, the drops are counted in an #info frame, 1008 after 30 s",
    async () => {
      const bun = await startBun()
      try {
        const tail = await Effect.runPromise(openTailOrDie(bun.port, "unused"))
        tail.ws.pause()
        // publish in steps the tail keeps up with while its socket takes them, until the tail drops
        // (the kernel's buffers are full, then Bun's bound) or Bun holds over 1 MiB
        let s = await bun.stats()
        for (let i = 0; i < 500 && s.dropped === 0 && s.buffered <= 1 << 20; i++) {
          await bun.publish(500)
          s = await bun.stats()
        }
        expect(s.buffered, JSON.stringify(s)).toBeLessThanOrEqual(BUN_BUFFER_MAX)
        // over the bound: the tail waits for room (and the test sees Bun's socket)
        expect(s.buffered).toBeGreaterThan(SOCKET_BUFFER_BYTES)
        expect(s.dropped).toBeGreaterThan(0)
        // while the reader takes nothing, Bun's buffer does not grow: every further outcome is dropped
        await bun.publish(2_000)
        const full = await bun.stats()
        expect(full.buffered).toBeLessThanOrEqual(BUN_BUFFER_MAX)
        expect(full.dropped).toBe(s.dropped + 2_000)

        // the reader resumes: the frames kept (the oldest, in order), then the exact count of the others
        tail.ws.resume()
        const isInfo = (f: { readonly [k: string]: unknown }) => f["$type"] === INFO_TYPE
        await until("#info", () => tail.frames.some(isInfo), () => bun.advance(20), 1_000)
        const kept = tail.frames.filter((f) => f["$type"] === OUTCOME_TYPE)
        const info = tail.frames.find(isInfo)
        expect(info).toEqual({
          $type: INFO_TYPE,
          name: "DeliveriesDropped",
          message: "the connection's buffer was full",
          dropped: full.dropped
        })
        expect(tail.frames.at(-1)).toBe(info)
        expect(kept.length + full.dropped).toBe(full.published)
        expect(kept.map((f) => f["id"])).toEqual(
          Array.from({ length: kept.length }, (_, i) => `01TAIL${String(i + 1).padStart(8, "0")}`)
        )
        // the connection goes on
        await bun.publish(1)
        await until("the next frame", () => tail.frames.length === kept.length + 2)
        expect(tail.frames.at(-1)?.["id"]).toBe(`01TAIL${String(full.published + 1).padStart(8, "0")}`)
        tail.ws.close(1000)
        await until("released", async () => (await bun.stats()).connections === 0)

        // a reader that takes nothing for 30 s is closed
        const slow = await Effect.runPromise(openTailOrDie(bun.port, "unused"))
        slow.ws.pause()
        const before = (await bun.stats()).dropped
        await until("the slow reader drops", async () => (await bun.stats()).dropped > before, () => bun.publish(500))
        await bun.advance(Duration.toMillis(DRAIN_DEADLINE) - 1_000)
        expect((await bun.stats()).connections).toBe(1)
        await bun.advance(1_000)
        await until("closed and released", async () => (await bun.stats()).connections === 0)
        slow.ws.resume()
        await until("the close reaches the reader", () => slow.closed !== undefined)
        expect(slow.closed).toEqual({ code: 1008, reason: "slow reader" })
        expect(bun.stderr()).toBe("")
      } finally {
        bun.stop()
      }
    },
    120_000
  )

  it("the service's shutdown closes an open tail with 1001 (going away), not 1011", async () => {
    const bun = await startBun()
    try {
      const tail = await Effect.runPromise(openTailOrDie(bun.port, "unused"))
      await bun.publish(1)
      await until("a frame", () => tail.frames.length === 1)
      process.kill(bun.pid, "SIGTERM")
      await until("closed", () => tail.closed !== undefined)
      expect(tail.closed).toEqual({ code: 1001, reason: "shutdown" })
    } finally {
      bun.stop()
    }
  }, 60_000)
})
