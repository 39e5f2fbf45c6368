/**
 * docs/receivers.md's TypeScript verification samples, type-checked as a receiver's own module
 * (strict, `tsc --noEmit` in a child process) with the free variables typed as the doc tells
 * receivers to get them: `headers` as node:http's `req.headers` (`IncomingHttpHeaders`, whose values
 * are `string | string[] | undefined`) or as `Object.fromEntries(request.headers)` of a fetch
 * `Request`. receiver-samples.test.ts runs the samples with their types erased, so before stop 59
 * the wisp sample's `Buffer.from(headers["x-webhook-signature"] ?? "")`, which does not compile with
 * `IncomingHttpHeaders`, passed there.
 */
import { afterAll, describe, expect, it } from "@effect/vitest"
import * as Fs from "node:fs"
import * as Os from "node:os"
import * as Path from "node:path"
import { tscDiagnostics } from "../support/tscCheck.js"

const root = Path.resolve(import.meta.dirname, "../..")
const doc = Fs.readFileSync(Path.join(root, "docs", "receivers.md"), "utf8")

/** The first fenced block after a heading of docs/receivers.md. */
const sample = (heading: string): string => {
  const at = doc.indexOf(`\n${heading}\n`)
  expect(at, `docs/receivers.md has "${heading}"`).toBeGreaterThanOrEqual(0)
  return /```[a-z]*\n([\s\S]*?)```/.exec(doc.slice(at))?.[1] ?? ""
}

const dir = Fs.mkdtempSync(Path.join(Os.tmpdir(), "firehook-receiver-types-"))
Fs.symlinkSync(Path.join(root, "node_modules"), Path.join(dir, "node_modules"), "dir")
afterAll(() => Fs.rmSync(dir, { recursive: true, force: true }))

/** `tsc --noEmit` (strict) over one module; its diagnostics, one per line. */
const diagnostics = (name: string, source: string): Promise<ReadonlyArray<string>> => {
  const file = Path.join(dir, `${name}.ts`)
  Fs.writeFileSync(file, source)
  return tscDiagnostics(dir, name, [file], { module: "nodenext", moduleResolution: "nodenext" }, 110_000)
}

describe.concurrent("docs/receivers.md TypeScript samples, type-checked as a receiver's module", () => {
  it("Standard Webhooks: handle takes node:http's req.headers and a fetch Request's headers", async () => {
    const source = [
      sample("### TypeScript, Standard Webhooks"),
      `import type { IncomingHttpHeaders } from "node:http"`,
      `declare const secret: string`,
      `declare const req: { readonly headers: IncomingHttpHeaders }`,
      `declare const request: Request`,
      `handle("{}", req.headers)`,
      `handle("{}", Object.fromEntries(request.headers))`
    ].join("\n")
    expect(await diagnostics("standard", source)).toEqual([])
  }, 120_000)

  for (
    const [name, type] of [
      ["node-http", `import("node:http").IncomingHttpHeaders`],
      ["fetch", `Record<string, string>`]
    ] as const
  ) {
    it(`wisp-compatible header: compiles with headers as ${type}`, async () => {
      const source = [
        sample("### TypeScript, wisp-compatible header"),
        `declare const secret: string`,
        `declare const rawBody: string | Buffer`,
        `declare const headers: ${type}`,
        `export const verdict: boolean = ok`
      ].join("\n")
      expect(await diagnostics(`wisp-${name}`, source)).toEqual([])
    }, 120_000)
  }
})
