/**
 * The operator CLI as the CLI suites run it: `src/cli/main.ts` bundled once per test run by Bun's
 * own bundler (`bun build --target bun`), from the sources as they are at the run's start. A
 * spawned CLI then starts in about half the CPU time of `bun src/cli/main.ts` (0.44 s instead of
 * 0.87 s on a 2-core machine: one file to parse instead of some 900 modules to resolve and load),
 * and the suites spawn it about 270 times (docs/decisions.md, "How long the suite takes").
 * The bundle is the same program: the CLI reads no file relative to its own modules. The source
 * entry itself stays covered: `npx firehook` (bin/firehook.mjs), `--wizard` in help.test.ts and
 * every service start (`bun src/main.ts`) run the sources.
 */
import * as ChildProcess from "node:child_process"
import * as Fs from "node:fs"
import * as Os from "node:os"
import * as Path from "node:path"

declare module "vitest" {
  export interface ProvidedContext {
    /** the bundled CLI (`bun <cliBundle> …` runs `firehook …`) */
    cliBundle: string
  }
}

const ROOT = Path.resolve(import.meta.dirname, "../..")

/** Bundle the CLI into a temporary directory: its path, and a function that removes it. */
export const buildCliBundle = (): { readonly path: string; readonly remove: () => void } => {
  const dir = Fs.mkdtempSync(Path.join(Os.tmpdir(), "firehook-test-cli-"))
  const path = Path.join(dir, "firehook-cli.js")
  ChildProcess.execFileSync(
    Path.join(ROOT, "node_modules/.bin/bun"),
    ["build", "src/cli/main.ts", "--target", "bun", "--outfile", path],
    { cwd: ROOT, stdio: ["ignore", "ignore", "inherit"], timeout: 120_000 }
  )
  return { path, remove: () => Fs.rmSync(dir, { recursive: true, force: true }) }
}
