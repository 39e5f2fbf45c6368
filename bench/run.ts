/**
 * `npm run bench`: runs every benchmark in turn (each prints its own figures), then writes the
 * report: the section of `docs/benchmarks.md` between the `bench:report` markers is replaced by this
 * run's date, command, machine, summary lines and a table of the figures against their targets and
 * the bare limits. The hand-written analysis around it is left alone.
 *
 * Arguments after `--`: a number is passed as the event count to intake, delivery and e2e, e.g.
 * `npm run bench -- 20000` for a quick run; names select benchmarks (`npm run bench -- e2e`,
 * `npm run bench -- delivery,e2e`, `npm run bench -- noisy`; `--only <names>` is the same; with a
 * number too: `npm run bench -- e2e 2000`, the e2e phase's event count). A selection prints its report without writing it (the other figures would be
 * missing); `BENCH_NO_REPORT=1` does the same for a full run.
 *
 * Runtime: the benchmarks run on Bun, the production runtime, with the environment `npm start`
 * gives the service (read from its script: start-env.ts); `BENCH_RUNTIME=node` runs them on Node 22
 * with tsx instead.
 */
import { type ChildProcess, spawn, spawnSync } from "node:child_process"
import * as Fs from "node:fs"
import * as Os from "node:os"
import * as Path from "node:path"
import { startEnv, startEnvText } from "./start-env.js"

const dir = import.meta.dirname
const reportFile = Path.join(dir, "..", "docs", "benchmarks.md")
const BEGIN = "<!-- bench:report:begin (written by `npm run bench`; edits here are replaced) -->"
const END = "<!-- bench:report:end -->"

const args = process.argv.slice(2)
const n = args.find((a) => /^[0-9]+$/.test(a))
const ALL = ["match", "intake", "delivery", "noisy", "e2e"]
const selection = args.filter((a) => !/^[0-9]+$/.test(a) && a !== "--only")
  .map((a) => a.replace(/^--only=/, "")).flatMap((a) => a.split(",")).filter((a) => a.length > 0)
const unknown = selection.filter((a) => !ALL.includes(a))
if (unknown.length > 0) {
  console.error(`unknown benchmark(s): ${unknown.join(", ")} (choose from ${ALL.join(", ")})`)
  process.exit(2)
}
const runtime = process.env["BENCH_RUNTIME"] === "node" ? "node" : "bun"
const bun = Path.join(dir, "..", "node_modules", ".bin", "bun")
const benches = (selection.length === 0 ? ALL : ALL.filter((b) => selection.includes(b)))
  .map((b) => `${b}.ts`)
  .filter((f) => Fs.existsSync(Path.join(dir, f)))
/** the benchmarks that take the event count */
const counted = new Set(["intake.ts", "delivery.ts", "e2e.ts"])

/**
 * SIGINT / SIGTERM: passed on to the running benchmark (a Ctrl-C reaches it anyway, it ignores a
 * repeated one), which stops and removes what it started; this process waits for it (its output
 * comes through this one's stdout), runs no other and writes no report, and exits 130 / 143.
 */
let current: ChildProcess | undefined
let stopSignal: NodeJS.Signals | undefined
const onSignal = (signal: NodeJS.Signals) => () => {
  stopSignal ??= signal
  if (current !== undefined && current.exitCode === null && current.signalCode === null) current.kill(signal)
}
process.on("SIGINT", onSignal("SIGINT"))
process.on("SIGTERM", onSignal("SIGTERM"))

/** Run one benchmark, echoing its output, and return it with its exit code. */
const run = (file: string) =>
  new Promise<{ readonly code: number | null; readonly output: string }>((resolve) => {
    const script = [Path.join(dir, file), ...(n !== undefined && counted.has(file) ? [n] : [])]
    const child = runtime === "bun"
      ? spawn(bun, script, {
        stdio: ["ignore", "pipe", "inherit"],
        env: { ...startEnv(), ...process.env }
      })
      : spawn(process.execPath, ["--import", "tsx", ...script], {
        stdio: ["ignore", "pipe", "inherit"],
        env: process.env
      })
    current = child
    let output = ""
    child.stdout.on("data", (d: Buffer) => {
      process.stdout.write(d)
      output += d.toString("utf8")
    })
    child.on("close", (code) => resolve({ code, output }))
  })

const num = (text: string | undefined, re: RegExp): number | undefined => {
  const m = text === undefined ? null : re.exec(text)
  const group = m?.slice(1).find((g) => g !== undefined)
  return group === undefined ? undefined : Number(group)
}

const fmt = (v: number | undefined, digits = 0) =>
  v === undefined ? "–" : v.toLocaleString("en-US", { maximumFractionDigits: digits, minimumFractionDigits: digits })

const verdict = (ok: boolean | undefined) => (ok === undefined ? "not measured" : ok ? "met" : "**not met**")

const startLoad = Os.loadavg()[0] ?? 0
const started = new Date()
const lines = new Map<string, string>()
let failed = 0
for (const file of benches) {
  if (stopSignal !== undefined) break
  console.log(`\n=== bench/${file}`)
  const { code, output } = await run(file)
  if (code !== 0) failed++
  for (const line of output.split("\n")) {
    const m = /^(match|intake|delivery|noisy|summary|e2e): /.exec(line)
    if (m !== null) lines.set(m[1] === "summary" ? "delivery" : (m[1] ?? ""), line.trim())
  }
}
if (stopSignal !== undefined) {
  console.log(`\nstopped by ${stopSignal}: no report`)
  process.exit(stopSignal === "SIGINT" ? 130 : 143)
}
const endLoad = Os.loadavg()[0] ?? 0

const match = lines.get("match")
const intake = lines.get("intake")
const delivery = lines.get("delivery")
const noisy = lines.get("noisy")
const noisyP99 = num(noisy, /^noisy: healthy p99 ([\d.]+) ms/)
const matchRate = num(match, /^match: (\d+) events\/s/)
const intakeRate = num(intake, /^intake: (\d+) events\/s/)
const intakeRss = num(intake, /peak rss ([\d.]+) MiB/)
const deliveryRate = num(delivery, /deliveries\/s:? ?(\d+)|(\d+) deliveries\/s/)
const deliveryP99 = num(delivery, /p99[^\d]*([\d.]+) ms/)
const bare = num(delivery, /bare[^\d]*(\d+)/)
const ratio = num(delivery, /ratio ([\d.]+)/)
const budget = num(delivery, /budget at 0\.30 ([\d.]+) ms/)
// the floor with the client side of the HTTP exchange alone (what e2e's CPU, which leaves the
// receivers out, is compared with) and with the receivers' thread counted (like delivery's "spent")
const floor = num(delivery, /floor client-only ([\d.]+) ms/)
const floorInProcess = num(delivery, /floor in-process ([\d.]+) ms/)
const spent = num(delivery, /spent ([\d.]+) ms/)

const e2e = lines.get("e2e")
const e2eRate = num(e2e, /^e2e: deliveries\/s (\d+)/)
const e2eBare = num(e2e, /\| bare (\d+)\/s/)
const e2eRatio = num(e2e, /\| ratio ([\d.]+)/)
const e2eFh = num(e2e, /cpu firehook ([\d.]+) ms/)
const e2ePg = num(e2e, /\+ postgres ([\d.]+) ms/)
const e2eCpu = num(e2e, /= ([\d.]+) ms\/delivery/)
const e2eP99 = num(e2e, /\| p99 ([\d.]+) ms/)
const e2eRss = num(e2e, /peak rss (\d+) MiB/)

const bunVersion = () => {
  const r = spawnSync(bun, ["--version"], { encoding: "utf8" })
  return r.status === 0 ? r.stdout.trim() : "unknown version"
}

const cpu = Os.cpus()
const machine = [
  `${cpu.length} × ${cpu[0]?.model.trim() ?? "unknown CPU"}`,
  `${(Os.totalmem() / 2 ** 30).toFixed(0)} GiB RAM`,
  `${Os.type()} ${Os.release()}`,
  runtime === "bun"
    ? `bun (${bunVersion()}, ${startEnvText()} as in npm start)`
    : `node ${process.version} with tsx`,
  process.env["DATABASE_URL"] === undefined ? "embedded PostgreSQL" : "PostgreSQL from DATABASE_URL"
].join(", ")

const report = [
  BEGIN,
  "## Latest `npm run bench`",
  "",
  `- Date: ${started.toISOString().slice(0, 16).replace("T", " ")} UTC; command: \`npm run bench${
    args.length === 0 ? "" : ` -- ${args.join(" ")}`
  }\``,
  `- Machine: ${machine}`,
  `- Load average (1 min) at start / end: ${startLoad.toFixed(1)} / ${
    endLoad.toFixed(1)
  } (other work on the machine lowers every figure)`,
  failed === 0 ? "- Every benchmark completed." : `- ${failed} benchmark(s) failed; their figures are missing.`,
  "",
  "| figure | this run | target | |",
  "|---|---|---|---|",
  `| match: events/s against 10,000 webhooks, in memory | ${fmt(matchRate)} | – | |`,
  `| intake: events/s (Jetstream → outbox, PostgreSQL) | ${fmt(intakeRate)} | ≥ 20,000 | ${
    verdict(intakeRate === undefined ? undefined : intakeRate >= 20_000)
  } |`,
  `| intake: peak RSS | ${fmt(intakeRss, 1)} MiB | < 300 MiB | ${
    verdict(intakeRss === undefined ? undefined : intakeRss < 300)
  } |`,
  `| delivery: deliveries/s | ${fmt(deliveryRate)} | ≥ 3,000 | ${
    verdict(deliveryRate === undefined ? undefined : deliveryRate >= 3_000)
  } |`,
  `| delivery: bare loop, same concurrency (the faster of node:http and fetch; the limit) | ${
    fmt(bare)
  } requests/s | – | |`,
  `| delivery: ratio to the bare loop | ${fmt(ratio, 2)} | ≥ 0.30 | ${
    verdict(ratio === undefined ? undefined : ratio >= 0.3)
  } |`,
  `| delivery: p99 enqueue → first attempt at 500/s | ${fmt(deliveryP99, 1)} ms | < 100 ms | ${
    verdict(deliveryP99 === undefined ? undefined : deliveryP99 < 100)
  } |`,
  `| delivery: CPU per delivery the cores allow at ratio 0.30 | ${fmt(budget, 3)} ms | – | |`,
  `| delivery: its floor (bare HTTP exchange, client side only + signatures + PostgreSQL's writes without a client) | ${
    fmt(floor, 3)
  } ms | – | |`,
  `| delivery: the same floor with the receivers' thread's CPU in its HTTP term (as in "spent" below) | ${
    fmt(floorInProcess, 3)
  } ms | – | |`,
  `| delivery: CPU per delivery spent in this run (worker process, receivers' thread included, + PostgreSQL) | ${
    fmt(spent, 3)
  } ms | – | |`,
  `| noisy neighbours: healthy p99 enqueue → first attempt beside a hanging and a 503 origin | ${
    fmt(noisyP99, 1)
  } ms | < 100 ms | ${verdict(noisyP99 === undefined ? undefined : noisyP99 < 100)} |`,
  `| e2e: deliveries/s (Jetstream → \`bun src/main.ts\` → receivers) | ${fmt(e2eRate)} | – | |`,
  `| e2e: bare loop to the same receivers, same run | ${fmt(e2eBare)} requests/s | – | |`,
  `| e2e: ratio to the bare loop | ${fmt(e2eRatio, 3)} | ≥ 0.15 | ${
    verdict(e2eRatio === undefined ? undefined : e2eRatio >= 0.15)
  } |`,
  `| e2e: CPU per delivery, firehook + PostgreSQL | ${fmt(e2eFh, 3)} + ${fmt(e2ePg, 3)} = ${
    fmt(e2eCpu, 3)
  } ms | ≤ 2 × floor, client side (${fmt(floor === undefined ? undefined : 2 * floor, 3)} ms) | ${
    verdict(e2eCpu === undefined || floor === undefined ? undefined : e2eCpu <= 2 * floor)
  } |`,
  `| e2e: p99 enqueue → first attempt at 500/s | ${fmt(e2eP99, 1)} ms | < 25 ms | ${
    verdict(e2eP99 === undefined ? undefined : e2eP99 < 25)
  } |`,
  `| e2e: peak RSS of the largest firehook process | ${fmt(e2eRss)} MiB | < 300 MiB | ${
    verdict(e2eRss === undefined ? undefined : e2eRss < 300)
  } |`,
  "",
  "Summary lines as printed:",
  "",
  "```",
  ...[match, intake, delivery, noisy, e2e].filter((l): l is string => l !== undefined),
  "```",
  END
].join("\n")

if (process.env["BENCH_NO_REPORT"] !== "1" && selection.length === 0) {
  const current = Fs.existsSync(reportFile) ? Fs.readFileSync(reportFile, "utf8") : "# Benchmarks\n"
  const b = current.indexOf(BEGIN)
  const e = current.indexOf(END)
  let next: string
  if (b >= 0 && e > b) next = current.slice(0, b) + report + current.slice(e + END.length)
  else {
    // first report: after the introduction, before the first benchmark section
    const firstSection = current.indexOf("\n## ")
    next = firstSection < 0
      ? `${current.trimEnd()}\n\n${report}\n`
      : `${current.slice(0, firstSection + 1)}${report}\n\n${current.slice(firstSection + 1)}`
  }
  Fs.writeFileSync(reportFile, next)
  console.log(`\nreport written to docs/benchmarks.md`)
} else console.log(`\n${report}`)

process.exit(failed === 0 ? 0 : 1)
