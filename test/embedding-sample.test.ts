/**
 * README "Embedding" as a TypeScript consumer meets it: the section's sample, with `"firehook"`
 * resolved to this package's `src/index.ts` (as an installed tarball's `exports` does), type-checks
 * under `strict` with each `moduleResolution` the section names (`node16`, `nodenext`, `bundler`),
 * and with no compiler option beyond those (a consumer's `resolveJsonModule` is off by default under
 * `node16`). A consumer's compiler checks firehook's sources with the consumer's own options, so
 * every file `src/index.ts` reaches must compile under each of them.
 */
import * as Fs from "node:fs"
import * as Os from "node:os"
import * as Path from "node:path"
import { afterAll, describe, expect, it } from "vitest"
import * as Version from "../src/services/platform/Version.js"
import { tscDiagnostics } from "./support/tscCheck.js"

const root = Path.resolve(import.meta.dirname, "..")

/** The first `ts` block of README's "Embedding" section. */
const sample = (): string => {
  const readme = Fs.readFileSync(Path.join(root, "README.md"), "utf8")
  const section = readme.slice(readme.indexOf("\n## Embedding\n"))
  const block = /```ts\n([\s\S]*?)```/.exec(section)
  expect(block, "README has an Embedding section with a ts sample").not.toBeNull()
  return block?.[1] ?? ""
}

/** A consumer project in a temporary directory: `package.json` (ESM), the sample, the dependencies. */
const consumer = (() => {
  let dir: string | undefined
  return () => {
    if (dir !== undefined) return dir
    dir = Fs.mkdtempSync(Path.join(Os.tmpdir(), "firehook-consumer-"))
    Fs.writeFileSync(Path.join(dir, "package.json"), JSON.stringify({ type: "module" }))
    Fs.writeFileSync(Path.join(dir, "main.ts"), sample())
    Fs.symlinkSync(Path.join(root, "node_modules"), Path.join(dir, "node_modules"), "dir")
    return dir
  }
})()

afterAll(() => {
  const dir = consumer()
  Fs.rmSync(dir, { recursive: true, force: true })
})

/** `tsc --noEmit` over the sample with `options` (tsconfig spelling); its diagnostics, one per line. */
const diagnostics = (name: string, options: Readonly<Record<string, string>>): Promise<ReadonlyArray<string>> => {
  const dir = consumer()
  return tscDiagnostics(
    dir,
    name,
    [Path.join(dir, "main.ts")],
    { paths: { firehook: [Path.join(root, "src", "index.ts")] }, ...options },
    170_000
  )
}

// the three checks run side by side (each is its own `tsc` process): the file is small, so vitest
// starts it late in a run, and one after another they held the run's end by about a minute
describe.concurrent("README Embedding sample, type-checked as a consumer", () => {
  it("with moduleResolution node16", async () => {
    expect(await diagnostics("node16", { module: "node16", moduleResolution: "node16" })).toEqual([])
  }, 180_000)

  it("with moduleResolution nodenext", async () => {
    expect(await diagnostics("nodenext", { module: "nodenext", moduleResolution: "nodenext" })).toEqual([])
  }, 180_000)

  it("with moduleResolution bundler", async () => {
    expect(await diagnostics("bundler", { module: "esnext", moduleResolution: "bundler" })).toEqual([])
  }, 180_000)
})

describe("Version", () => {
  it("VERSION is package.json's version (a literal, so that no source imports JSON)", () => {
    const manifest = JSON.parse(Fs.readFileSync(Path.join(root, "package.json"), "utf8")) as {
      readonly version: string
    }
    expect(Version.VERSION).toBe(manifest.version)
    expect(Version.USER_AGENT).toBe(`firehook/${manifest.version}`)
  })
})
