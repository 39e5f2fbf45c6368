/**
 * bench/proc-cpu.ts, the CPU accounting of bench/e2e.ts: a PostgreSQL backend that ends during the
 * phase counts with its last reading (it once counted 0 at the end, its earlier CPU subtracted);
 * PostgreSQL's CPU is measured only when pg_stat_activity's pids are this machine's postgres
 * processes (a server in a container or on another host once read other processes, or none, as 0).
 */
import { describe, expect, it } from "vitest"
import { postgresLocality, readComm, spent, spentKeepingLast } from "../../bench/proc-cpu.js"

const snap = (o: Record<number, number>) => new Map(Object.entries(o).map(([k, v]) => [Number(k), v]))

describe("PostgreSQL backends' CPU over a phase", () => {
  it("a backend gone by the end counts with its last reading; one started during the phase from 0", () => {
    const start = snap({ 1: 100, 2: 50, 3: 10 })
    // polls: 2 was read at 80 and then ended; 4 started during the phase; 3 never read again
    const polls = [snap({ 1: 150, 2: 80, 3: 10 }), snap({ 1: 180, 4: 30 }), snap({ 1: 200, 4: 45 })]
    expect(spentKeepingLast(start, polls)).toBe((200 - 100) + (80 - 50) + 0 + 45)
  })

  it("a reaped process of firehook's tree counts 0 at the end: its time is in its parent's cutime", () => {
    // the child (2) had 40 ms at the start and ended at 70; the root (1), read with cutime, holds it
    expect(spent(snap({ 1: 100, 2: 40 }), snap({ 1: 100 + 20 + 70 }))).toBe(20 + 30)
  })
})

describe("whether pg_stat_activity's pids are this machine's PostgreSQL", () => {
  const comms = (m: Record<number, string>) => (pid: number) => m[pid]

  it("local when every pid that exists here is a postgres process", () => {
    expect(postgresLocality([10, 11, 12], comms({ 10: "postgres", 11: "postgres: 15/main: checkpointer" })))
      .toBe("local")
  })

  it("not local when a pid is another program (a container's pid numbering)", () => {
    expect(postgresLocality([1, 7, 10], comms({ 1: "systemd", 7: "bash", 10: "postgres" }))).toBe("not local")
  })

  it("not local when no pid exists here (another host)", () => {
    expect(postgresLocality([90_001, 90_002], comms({}))).toBe("not local")
  })

  it("this process is not PostgreSQL", () => {
    expect(readComm(process.pid)).toBeDefined()
    expect(postgresLocality([process.pid])).toBe("not local")
  })
})
