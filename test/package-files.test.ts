/**
 * The `npm pack` tarball, as an embedder or an operator installing it meets it: package.json's
 * `files` list carries the sources, the CLI, the postinstall script, the lexicons, the systemd unit
 * and the docs, and none of the tests, benches, devnet or demo. Unpacked beside this checkout's
 * dependencies, its `firehook` command runs.
 */
import * as ChildProcess from "node:child_process"
import * as Fs from "node:fs"
import * as Os from "node:os"
import * as Path from "node:path"
import { afterAll, describe, expect, it } from "vitest"

const root = Path.resolve(import.meta.dirname, "..")
const work = Fs.mkdtempSync(Path.join(Os.tmpdir(), "firehook-pack-"))

afterAll(() => Fs.rmSync(work, { recursive: true, force: true }))

const run = (cmd: string, args: ReadonlyArray<string>, cwd: string) =>
  ChildProcess.spawnSync(cmd, args, { cwd, encoding: "utf8", timeout: 60_000 })

/** Every file under `dir` (relative to `base`), depth-first. */
const filesUnder = (base: string, dir: string): Array<string> =>
  Fs.readdirSync(Path.join(base, dir), { withFileTypes: true }).flatMap((e) =>
    e.isDirectory() ? filesUnder(base, Path.join(dir, e.name)) : [Path.join(dir, e.name)]
  )

describe("npm pack", () => {
  it("carries src, bin, the postinstall script, lexicons, deploy and docs, and no tests, benches or devnet", () => {
    const packed = run("npm", ["pack", root, "--silent", "--pack-destination", work], work)
    expect(packed.status, packed.stderr).toBe(0)
    const tarball = Path.join(work, packed.stdout.trim().split("\n").pop() ?? "")
    expect(run("tar", ["xzf", tarball], work).status).toBe(0)
    const pkg = Path.join(work, "package")
    const files = filesUnder(pkg, ".").map((f) => Path.normalize(f))
    const top = new Set(files.map((f) => f.split(Path.sep)[0]))
    expect([...top].sort()).toEqual([
      "README.md",
      "bin",
      "deploy",
      "docs",
      "lexicons",
      "package.json",
      "scripts",
      "src"
    ])
    // every source file of the checkout, and the package's entry points
    expect(files.filter((f) => f.startsWith(`src${Path.sep}`)).sort()).toEqual(
      filesUnder(root, "src").map((f) => Path.normalize(f)).sort()
    )
    for (const f of ["src/index.ts", "bin/firehook.mjs", "scripts/postinstall.mjs", "deploy/firehook.service"]) {
      expect(files).toContain(Path.normalize(f))
    }

    // the unpacked package, with this checkout's dependencies: the CLI answers
    Fs.symlinkSync(Path.join(root, "node_modules"), Path.join(pkg, "node_modules"), "dir")
    const help = run(process.execPath, ["bin/firehook.mjs", "--version"], pkg)
    expect(help.status, help.stderr).toBe(0)
    expect(help.stdout).toContain("0.1.0")
  }, 120_000)
})
