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
import ts from "typescript"
import { afterAll, describe, expect, it } from "vitest"
import * as Version from "../src/services/platform/Version.js"

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

const diagnostics = (options: ts.CompilerOptions): ReadonlyArray<string> => {
  const dir = consumer()
  const program = ts.createProgram({
    rootNames: [Path.join(dir, "main.ts")],
    options: {
      target: ts.ScriptTarget.ES2022,
      strict: true,
      noEmit: true,
      skipLibCheck: true,
      types: ["node"],
      paths: { firehook: [Path.join(root, "src", "index.ts")] },
      ...options
    }
  })
  return ts.getPreEmitDiagnostics(program).map((d) => {
    const where = d.file === undefined
      ? ""
      : `${Path.relative(root, d.file.fileName)}(${d.file.getLineAndCharacterOfPosition(d.start ?? 0).line + 1}): `
    return `${where}${ts.flattenDiagnosticMessageText(d.messageText, "\n")}`
  })
}

describe("README Embedding sample, type-checked as a consumer", () => {
  it("with moduleResolution node16", () => {
    expect(diagnostics({ module: ts.ModuleKind.Node16, moduleResolution: ts.ModuleResolutionKind.Node16 })).toEqual([])
  }, 180_000)

  it("with moduleResolution nodenext", () => {
    expect(diagnostics({ module: ts.ModuleKind.NodeNext, moduleResolution: ts.ModuleResolutionKind.NodeNext }))
      .toEqual([])
  }, 180_000)

  it("with moduleResolution bundler", () => {
    expect(diagnostics({ module: ts.ModuleKind.ESNext, moduleResolution: ts.ModuleResolutionKind.Bundler })).toEqual([])
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
