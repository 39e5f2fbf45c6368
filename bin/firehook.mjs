#!/usr/bin/env node
/**
 * `npx firehook …`: run the operator CLI (`src/cli/main.ts`) with the project's Bun, the production
 * runtime. Same arguments, standard streams, environment and working directory; exits with the
 * CLI's exit code. Bun is looked up in `node_modules/.bin` of this package and of its parents, then
 * on PATH.
 */
import { spawn } from "node:child_process"
import { existsSync } from "node:fs"
import { dirname, join } from "node:path"
import { fileURLToPath } from "node:url"

const root = dirname(dirname(fileURLToPath(import.meta.url)))
const cli = join(root, "src", "cli", "main.ts")
const exe = process.platform === "win32" ? "bun.exe" : "bun"

const findBun = () => {
  for (let dir = root;; dir = dirname(dir)) {
    const candidate = join(dir, "node_modules", ".bin", exe)
    if (existsSync(candidate)) return candidate
    if (dirname(dir) === dir) return "bun"
  }
}

const child = spawn(findBun(), [cli, ...process.argv.slice(2)], { stdio: "inherit", env: process.env })

// Ctrl-C reaches the child through the terminal's process group: wait for it to finish cleanly.
// Signals sent to this process alone are passed on.
process.on("SIGINT", () => {})
for (const signal of ["SIGTERM", "SIGHUP"]) {
  process.on(signal, () => {
    if (child.exitCode === null) child.kill(signal)
  })
}

child.on("error", (err) => {
  process.stderr.write(
    `firehook: could not start bun (${err.code ?? "unknown error"}); install the project's dependencies\n`
  )
  process.exit(1)
})

child.on("exit", (code, signal) => {
  if (code !== null) process.exit(code)
  const signals = { SIGHUP: 1, SIGINT: 2, SIGTERM: 15, SIGKILL: 9 }
  process.exit(128 + (signals[signal] ?? 1))
})
