#!/usr/bin/env node
/**
 * `npm test`'s static checks before vitest: `npm run typecheck`, `npm run lint` and `npm run shape`,
 * started together (tsc and ESLint each keep one core busy for 20–40 s, so on a machine with two
 * or more cores running them side by side saves the shorter one's time). Each check's output is
 * held and printed whole when it ends, under its name, so that the outputs never interleave. Exits
 * 1 when any check failed (after all of them ended), naming the ones that did.
 */
import { spawn } from "node:child_process"

const CHECKS = ["typecheck", "lint", "shape"]
/** a check that runs longer than this is stopped and counts as failed (a hung tool must not hang CI) */
const TIMEOUT_MS = 15 * 60_000

const run = (name) =>
  new Promise((resolve) => {
    const started = Date.now()
    const child = spawn("npm", ["run", "-s", name], { stdio: ["ignore", "pipe", "pipe"] })
    const chunks = []
    child.stdout.on("data", (d) => chunks.push(d))
    child.stderr.on("data", (d) => chunks.push(d))
    const timer = setTimeout(() => child.kill("SIGKILL"), TIMEOUT_MS)
    const finish = (code, reason) => {
      clearTimeout(timer)
      const seconds = ((Date.now() - started) / 1000).toFixed(1)
      const output = Buffer.concat(chunks).toString("utf8")
      const ok = code === 0
      process.stdout.write(`== npm run ${name}: ${ok ? "ok" : `failed (${reason})`} in ${seconds} s\n${output}`)
      if (output.length > 0 && !output.endsWith("\n")) process.stdout.write("\n")
      resolve(ok)
    }
    child.on("error", (e) => finish(1, e.message))
    child.on("close", (code, signal) => finish(code, signal !== null ? `signal ${signal}` : `exit ${code}`))
  })

const results = await Promise.all(CHECKS.map(run))
const failed = CHECKS.filter((_, i) => !results[i])
if (failed.length > 0) {
  process.stdout.write(`checks failed: ${failed.join(", ")}\n`)
  process.exit(1)
}
