/**
 * Processes' CPU time from Linux /proc, for bench/e2e.ts: firehook's process tree and the
 * PostgreSQL processes serving the bench database.
 *
 * - firehook's tree: every process is read with the CPU of its reaped children (`cutime` +
 *   `cstime`), so a process that ends and is reaped by its parent in the tree moves its time into
 *   the parent's reading: counted as 0 once gone ({@link spent}), it is not counted twice.
 * - PostgreSQL: the backends are the postmaster's children, which is not read; a backend that ends
 *   takes its time with it, so each one's last reading (the polls during the phase) stands for it
 *   once it is gone ({@link spentKeepingLast}).
 * - A pid from `pg_stat_activity` is this machine's only when `/proc/<pid>/comm` names postgres: a
 *   server in a container (another pid namespace) or on another host has pids that are other
 *   processes here, or none ({@link postgresLocality}).
 */
import * as Fs from "node:fs"

/** ms per clock tick (USER_HZ 100) */
const TICK = 1000 / 100

/** The fields of /proc/<pid>/stat after the command name (state is [0], ppid [1]); undefined: gone. */
export const readStat = (pid: number): ReadonlyArray<string> | undefined => {
  try {
    const s = Fs.readFileSync(`/proc/${pid}/stat`, "utf8")
    return s.slice(s.lastIndexOf(")") + 2).split(" ")
  } catch {
    return undefined
  }
}

/** utime + stime (+ cutime + cstime with `reaped`) in ms; undefined for a process that is gone. */
export const cpuMs = (pid: number, reaped = false): number | undefined => {
  const f = readStat(pid)
  if (f === undefined) return undefined
  const own = Number(f[11]) + Number(f[12])
  return (reaped ? own + Number(f[13]) + Number(f[14]) : own) * TICK
}

/** `root` and every process below it. */
export const tree = (root: number): ReadonlyArray<number> => {
  const children = new Map<number, Array<number>>()
  for (const name of Fs.readdirSync("/proc")) {
    if (!/^[0-9]+$/.test(name)) continue
    const ppid = Number(readStat(Number(name))?.[1])
    if (!Number.isFinite(ppid)) continue
    const list = children.get(ppid) ?? []
    list.push(Number(name))
    children.set(ppid, list)
  }
  const out: Array<number> = []
  const queue = [root]
  for (let i = 0; i < queue.length && i < 10_000; i++) {
    const pid = queue[i] ?? 0
    out.push(pid)
    queue.push(...(children.get(pid) ?? []))
  }
  return out
}

/** CPU ms per pid (the processes that are gone are left out). */
export type CpuSnapshot = ReadonlyMap<number, number>

/** Read `pids` now (`reaped`: with their reaped children's time, as firehook's tree is read). */
export const snapshot = (pids: Iterable<number>, reaped = false): CpuSnapshot => {
  const out = new Map<number, number>()
  for (const pid of pids) {
    const ms = cpuMs(pid, reaped)
    if (ms !== undefined) out.set(pid, ms)
  }
  return out
}

/**
 * CPU spent between two readings of a process tree read with `reaped`: a process gone by `b`
 * counts 0 there (its time is in its parent's `cutime`), one new in `b` counts from 0.
 */
export const spent = (a: CpuSnapshot, b: CpuSnapshot): number => {
  let total = 0
  for (const pid of new Set([...a.keys(), ...b.keys()])) total += (b.get(pid) ?? 0) - (a.get(pid) ?? 0)
  return total
}

/**
 * CPU spent since `start` by processes that no parent of theirs in the set reaps (PostgreSQL's
 * backends): each pid's latest reading among `readings` (oldest first) is its end; a pid read at
 * the start and never again counts 0; a pid first read later (started during the phase) counts
 * from 0.
 */
export const spentKeepingLast = (start: CpuSnapshot, readings: Iterable<CpuSnapshot>): number => {
  const last = new Map(start)
  for (const r of readings) for (const [pid, ms] of r) last.set(pid, ms)
  let total = 0
  for (const [pid, ms] of last) total += ms - (start.get(pid) ?? 0)
  return total
}

/** `/proc/<pid>/comm`, trimmed; undefined for a pid with no process here. */
export const readComm = (pid: number): string | undefined => {
  try {
    return Fs.readFileSync(`/proc/${pid}/comm`, "utf8").trim()
  } catch {
    return undefined
  }
}

/**
 * Whether the processes behind `pids` (from `pg_stat_activity`) are this machine's PostgreSQL:
 * "local" when every pid that has a process here is a `postgres*` one and at least one has; "not
 * local" when one is another program (a container's or another host's pid numbering) or none
 * exists here. A pid that ended between the query and the reading is passed over.
 */
export const postgresLocality = (
  pids: ReadonlyArray<number>,
  comm: (pid: number) => string | undefined = readComm
): "local" | "not local" => {
  let seen = 0
  for (const pid of pids) {
    const name = comm(pid)
    if (name === undefined) continue
    if (!name.startsWith("postgres")) return "not local"
    seen++
  }
  return seen > 0 ? "local" : "not local"
}
