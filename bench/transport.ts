/**
 * The transport alone, CPU per request, variants interleaved in one process (diagnostic, not part
 * of `npm run bench`):
 *
 *   bun bench/transport.ts [requests=20000] [rounds=3]
 *
 * Receivers: bench/e2e-receivers.ts in a child process (4 node:http servers answering 204), so the
 * CPU measured (this process's user + system time) is the client's alone. Concurrency 64, a
 * 456-byte body (the e2e bench's average event body), 1,000 paths. Variants:
 * - `bare`: node:http keep-alive loop, content-type + content-length only (bench/loops.ts);
 * - `bare+headers`: the same loop with the headers a signed delivery carries (Host, Content-Length,
 *   User-Agent, Content-Type, the four signature headers), a string body and `setHost: false`,
 *   signatures computed per request, as SafeHttp sends them;
 * - `bare+headers fibers`: `bare+headers` inside `Effect.async`, from the fibers of one
 *   `Effect.forEach` (what an Effect fiber adds to the same call);
 * - `SafeHttp`: `SafeHttp.request` (the pinned node:http transport) with the same signed headers,
 *   one `Effect.runPromise` per request;
 * - `SafeHttp fibers`: the same requests from the fibers of one `Effect.forEach`, as the delivery
 *   worker's row fibers send them (compare with `bare+headers fibers`);
 * - `fetch`: the runtime's fetch with the same headers (not SSRF-pinned: a comparison only).
 * Prints each round, then the median CPU per request of each variant.
 */
import { Effect } from "effect"
import { spawn } from "node:child_process"
import * as Http from "node:http"
import * as Path from "node:path"
import { signatureHeaders } from "../src/services/delivery/Signer.js"
import { SafeHttp } from "../src/services/platform/http/SafeHttp.js"
import { bareHttpLoop } from "./loops.js"

const N = Number(process.argv[2] ?? 20_000)
const ROUNDS = Number(process.argv[3] ?? 3)
const C = 64
const BODY = "a".repeat(456)
const UA = "firehook/0.1.0 (+https://github.com/)"

const file = Path.join(import.meta.dirname, "e2e-receivers.ts")
const child = process.versions["bun"] !== undefined
  ? spawn(process.execPath, [file, "4"], { stdio: ["pipe", "pipe", "inherit"] })
  : spawn(process.execPath, ["--import", "tsx", file, "4"], { stdio: ["pipe", "pipe", "inherit"] })
const ports = await new Promise<ReadonlyArray<number>>((resolve) =>
  child.stdout?.once("data", (d: Buffer) => {
    const { ports } = JSON.parse(d.toString("utf8").split("\n")[0] ?? "{}") as { ports: Array<number> }
    resolve(ports)
  })
)

const signed = (i: number): Record<string, string> => ({
  "Content-Type": "application/json",
  "User-Agent": UA,
  ...signatureHeaders({
    secret: `bench-secret-${i % 1000}`,
    deliveryId: `whd_${i}`,
    timestampSeconds: 1.8e9,
    body: BODY
  })
})

const lanes = async (one: (i: number) => Promise<void>): Promise<number> => {
  let next = 0
  const cpu0 = process.cpuUsage()
  await Promise.all(Array.from({ length: C }, async () => {
    while (next < N) await one(next++)
  }))
  const cpu = process.cpuUsage(cpu0)
  return (cpu.user + cpu.system) / 1000 / N
}

const agent = new Http.Agent({ keepAlive: true, maxSockets: C, maxFreeSockets: C, scheduling: "lifo" })
const bareHeaders = (i: number) =>
  new Promise<void>((resolve) => {
    const port = ports[i % ports.length] ?? 0
    const req = Http.request({
      agent,
      host: "127.0.0.1",
      port,
      path: `/h/${i % 1000}`,
      method: "POST",
      setHost: false,
      headers: { ...signed(i), Host: `127.0.0.1:${port}`, "Content-Length": String(Buffer.byteLength(BODY)) }
    }, (res) => {
      res.resume()
      res.on("end", () => resolve())
    })
    req.on("error", () => resolve())
    req.end(BODY, "utf8")
  })

const transport = await Effect.runPromise(
  Effect.provide(SafeHttp, SafeHttp.layerDefault({ allowInsecureDev: true, allowCidrs: [], maxSocketsPerHost: C }))
)
const safeRequest = (i: number) => ({
  url: `http://127.0.0.1:${ports[i % ports.length]}/h/${i % 1000}`,
  method: "POST" as const,
  headers: signed(i),
  body: BODY,
  timeoutMs: 10_000,
  maxResponseBytes: 65_536,
  onResponseOverflow: "truncate" as const,
  keepResponseBytes: 1024
})
const safe = (i: number) => Effect.runPromise(Effect.ignore(transport.request(safeRequest(i))))

/** The same requests from fibers of one runtime, as the worker sends them (no `runPromise` each). */
const safeFibers = async (): Promise<number> => {
  const cpu0 = process.cpuUsage()
  await Effect.runPromise(Effect.forEach(
    Array.from({ length: N }, (_, i) => i),
    (i) => Effect.ignore(transport.request(safeRequest(i))),
    { concurrency: C, discard: true }
  ))
  const cpu = process.cpuUsage(cpu0)
  return (cpu.user + cpu.system) / 1000 / N
}

/** node:http with the signed headers inside `Effect.async`, from fibers (what the worker's fiber adds to `bare+headers`). */
const bareFibers = async (): Promise<number> => {
  const cpu0 = process.cpuUsage()
  await Effect.runPromise(Effect.forEach(
    Array.from({ length: N }, (_, i) => i),
    (i) => Effect.async<void>((resume) => void bareHeaders(i).then(() => resume(Effect.void))),
    { concurrency: C, discard: true }
  ))
  const cpu = process.cpuUsage(cpu0)
  return (cpu.user + cpu.system) / 1000 / N
}

const viaFetch = async (i: number) => {
  try {
    const res = await fetch(`http://127.0.0.1:${ports[i % ports.length]}/h/${i % 1000}`, {
      method: "POST",
      headers: signed(i),
      body: BODY,
      redirect: "manual"
    })
    await res.arrayBuffer()
  } catch {
    // counted as done
  }
}

const variants: ReadonlyArray<readonly [string, () => Promise<number>]> = [
  [
    "bare",
    () => bareHttpLoop({ ports, requests: N, bodyBytes: 456, concurrency: C, paths: 1000 }).then((l) => l.cpuMs)
  ],
  ["bare+headers", () => lanes(bareHeaders)],
  ["bare+headers fibers", bareFibers],
  ["SafeHttp", () => lanes(safe)],
  ["SafeHttp fibers", safeFibers],
  ["fetch", () => lanes(viaFetch)]
]
const results = new Map<string, Array<number>>()
for (const v of variants) await v[1]() // warm-up
for (let r = 0; r < ROUNDS; r++) {
  for (const [name, run] of variants) {
    const ms = await run()
    results.set(name, [...(results.get(name) ?? []), ms])
    process.stdout.write(`round ${r + 1} ${name}: ${ms.toFixed(4)} ms CPU per request\n`)
  }
}
const median = (xs: ReadonlyArray<number>) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)] ?? Number.NaN
process.stdout.write(
  `transport: ${
    [...results].map(([n, xs]) => `${n} ${median(xs).toFixed(4)} ms`).join(" | ")
  } (median CPU per request, ${
    process.versions["bun"] === undefined ? `node ${process.version}` : `bun ${process.versions["bun"]}`
  })\n`
)
agent.destroy()
child.kill("SIGTERM")
process.exit(0)
