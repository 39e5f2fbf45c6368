/**
 * The runtime variables `npm start` sets (its script's `NAME=value` words before `exec`), read from
 * package.json so that the benchmarks run the service exactly as `npm start` does and the values are
 * written in one place.
 */
import * as Fs from "node:fs"
import * as Path from "node:path"

const PACKAGE_JSON = Path.join(Path.dirname(new URL(import.meta.url).pathname), "..", "package.json")

/** `{ BUN_JSC_heapGrowthMaxIncrease: "1", … }` as in package.json's `scripts.start`. */
export const startEnv = (): Record<string, string> => {
  const pkg: { scripts?: { start?: string } } = JSON.parse(Fs.readFileSync(PACKAGE_JSON, "utf8"))
  const env: Record<string, string> = {}
  for (const word of (pkg.scripts?.start ?? "").split(/\s+/)) {
    const m = /^([A-Za-z_][A-Za-z0-9_]*)=(\S*)$/.exec(word)
    if (m === null) break
    env[m[1]!] = m[2]!
  }
  return env
}

/** The same variables as `A=1 B=2`, for the reports. */
export const startEnvText = (): string => Object.entries(startEnv()).map(([k, v]) => `${k}=${v}`).join(" ")

/**
 * The environment a benchmark gives the service it spawns: only PATH and HOME of its own, the
 * variables of `npm start`, and JSON logs at `warn` (the bench reads them); the caller adds the rest.
 */
export const serviceEnv = (): Record<string, string> => ({
  PATH: process.env["PATH"] ?? "",
  HOME: process.env["HOME"] ?? "/tmp",
  ...startEnv(),
  LOG_FORMAT: "json",
  LOG_LEVEL: "warn"
})
