/**
 * `tsc --noEmit` over a consumer's module in a child process, for the tests that type-check the
 * docs' samples as their readers' own code (test/embedding-sample.test.ts,
 * test/delivery/receiver-samples-types.test.ts). A child process, not the compiler API: a program
 * over firehook's sources and Effect's declarations takes tens of seconds, and checked in the test's
 * own process it blocked the worker's event loop that long (vitest then reported `Timeout calling
 * "onTaskUpdate"`, failing the run although every test passed).
 */
import * as ChildProcess from "node:child_process"
import * as Fs from "node:fs"
import * as Path from "node:path"

const root = Path.resolve(import.meta.dirname, "../..")

/**
 * Writes `tsconfig.<name>.json` in `dir` (strict, no emit, `skipLibCheck`, Node's types, ES2022,
 * then `options` in tsconfig spelling) over `files`, runs `tsc -p` on it with `dir` as its working
 * directory, and resolves to its diagnostics, one per line (none when it passed; the error itself
 * when it failed silently, e.g. killed at `timeoutMs`).
 */
export const tscDiagnostics = (
  dir: string,
  name: string,
  files: ReadonlyArray<string>,
  options: Readonly<Record<string, unknown>>,
  timeoutMs: number
): Promise<ReadonlyArray<string>> => {
  const config = Path.join(dir, `tsconfig.${name}.json`)
  Fs.writeFileSync(
    config,
    JSON.stringify({
      compilerOptions: {
        target: "es2022",
        strict: true,
        noEmit: true,
        skipLibCheck: true,
        types: ["node"],
        ...options
      },
      files
    })
  )
  const tsc = Path.join(root, "node_modules", "typescript", "bin", "tsc")
  return new Promise((resolve) => {
    ChildProcess.execFile(
      process.execPath,
      [tsc, "-p", config, "--pretty", "false"],
      { cwd: dir, timeout: timeoutMs, maxBuffer: 16 << 20 },
      (error, stdout, stderr) => {
        const lines = `${stdout}${stderr}`.split("\n").filter((l) => l.trim() !== "")
        resolve(error === null ? [] : lines.length > 0 ? lines : [String(error)])
      }
    )
  })
}
