import { spawnSync } from "node:child_process"
import * as Path from "node:path"
import { describe, expect, it } from "vitest"

const ROOT = Path.resolve(import.meta.dirname, "../..")
const BUN = Path.join(ROOT, "node_modules/.bin/bun")

describe("live tail under Bun", () => {
  it("upgrade, a frame, the 24 h close and the release on BunHttpServer", () => {
    const r = spawnSync(BUN, ["test/support/tail-bun-smoke.ts"], {
      cwd: ROOT,
      encoding: "utf8",
      timeout: 60_000,
      env: { PATH: process.env["PATH"] ?? "", HOME: process.env["HOME"] ?? "/tmp" }
    })
    expect(r.stderr).toBe("")
    expect(r.stdout.trim()).toBe("ok")
    expect(r.status).toBe(0)
  }, 90_000)
})
