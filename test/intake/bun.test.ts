import { spawnSync } from "node:child_process"
import * as Path from "node:path"
import { describe, expect, it } from "vitest"

const ROOT = Path.resolve(import.meta.dirname, "../..")
const BUN = Path.join(ROOT, "node_modules/.bin/bun")

describe("firehose decoders under Bun", () => {
  it("decode a relay frame and a Jetstream frame, and stream both over Bun's WebSocket", () => {
    const r = spawnSync(BUN, ["test/support/firehose-bun-smoke.ts"], {
      cwd: ROOT,
      encoding: "utf8",
      timeout: 30_000,
      env: { PATH: process.env["PATH"] ?? "", HOME: process.env["HOME"] ?? "/tmp" }
    })
    expect(r.stderr).toBe("")
    expect(r.stdout.trim()).toBe("ok")
    expect(r.status).toBe(0)
  })
})
