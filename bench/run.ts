/**
 * `npm run bench`: runs every benchmark in turn (each prints its own figures), then writes the
 * report: the section of `docs/benchmarks.md` between the `bench:report` markers is replaced by this
 * run's date, command, machine, summary lines and a table of the figures against their targets and
 * the bare limits. The hand-written analysis around it is left alone.
 *
 * Arguments after `--` are passed as the event count to intake and delivery, e.g.
 * `npm run bench -- 20000` for a quick run. `BENCH_NO_REPORT=1` prints without writing the report.
 * `--only <names>` (comma-separated: match, intake, delivery, noisy) runs only those benchmarks,
 * e.g. `npm run bench -- --only noisy`; the report is then printed, not written (the figures of the
 * others would be missing from it).
 *
 * Runtime: the benchmarks run on Bun, the production runtime, with the environment `npm start`
 * gives the service (`BUN_JSC_heapGrowthMaxIncrease=1`); `BENCH_RUNTIME=node` runs them on Node 22
 * with tsx instead.
 */
import { spawn, spawnSync } from "node:child_process"
import * as Fs from "node:fs"
import * as Os from "node:os"
import * as Path from "node:path"

const dir = import.meta.dirname
const reportFile = Path.join(dir, "..", "docs", "benchmarks.md")
const BEGIN = "<!-- bench:report:begin (written by `npm run bench`; edits here are replaced) -->"
const END = "<!-- bench:report:end -->"

const args = process.argv.slice(2)
const onlyAt = args.findIndex((a) => a === "--only" || a.startsWith("--only="))
const onlyArg = onlyAt < 0 ? undefined : args[onlyAt]?.startsWith("--only=") ? args[onlyAt]?.slice(7) : args[onlyAt + 1]
const only = onlyArg === undefined ? undefined : new Set(onlyArg.split(",").map((s) => `${s.trim()}.ts`))
const n = args.find((a, i) => !a.startsWith("--") && (onlyAt < 0 || (i !== onlyAt && i !== onlyAt + 1)))
const runtime = process.env["BENCH_RUNTIME"] === "node" ? "node" : "bun"
const bun = Path.join(dir, "..", "node_modules", ".bin", "bun")
const benches = ["match.ts", "intake.ts", "delivery.ts", "noisy.ts"].filter((f) =>
  Fs.existsSync(Path.join(dir, f)) && (only === undefined || only.has(f))
)
/** the benchmarks that take the event count */
const counted = new Set(["intake.ts", "delivery.ts"])

/** Run one benchmark, echoing its output, and return it with its exit code. */
const run = (file: string) =>
  new Promise<{ readonly code: number | null; readonly output: string }>((resolve) => {
    const script = [Path.join(dir, file), ...(n !== undefined && counted.has(file) ? [n] : [])]
    const child = runtime === "bun"
      ? spawn(bun, script, {
        stdio: ["ignore", "pipe", "inherit"],
        env: { BUN_JSC_heapGrowthMaxIncrease: "1", ...process.env }
      })
      : spawn(process.execPath, ["--import", "tsx", ...script], {
        stdio: ["ignore", "pipe", "inherit"],
        env: process.env
      })
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
  console.log(`\n=== bench/${file}`)
  const { code, output } = await run(file)
  if (code !== 0) failed++
  for (const line of output.split("\n")) {
    const m = /^(match|intake|delivery|noisy|summary): /.exec(line)
    if (m !== null) lines.set(m[1] === "summary" ? "delivery" : (m[1] ?? ""), line.trim())
  }
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
const floor = num(delivery, /floor ([\d.]+) ms/)
const spent = num(delivery, /spent ([\d.]+) ms/)

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
    ? `bun (${bunVersion()}, BUN_JSC_heapGrowthMaxIncrease=1 as in npm start)`
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
  `| delivery: its floor (bare HTTP exchange + signatures + PostgreSQL's writes without a client) | ${
    fmt(floor, 3)
  } ms | – | |`,
  `| delivery: CPU per delivery spent in this run (worker process + PostgreSQL) | ${fmt(spent, 3)} ms | – | |`,
  `| noisy neighbours: healthy p99 enqueue → first attempt beside a hanging and a 503 origin | ${
    fmt(noisyP99, 1)
  } ms | < 100 ms | ${verdict(noisyP99 === undefined ? undefined : noisyP99 < 100)} |`,
  "",
  "Summary lines as printed:",
  "",
  "```",
  ...[match, intake, delivery, noisy].filter((l): l is string => l !== undefined),
  "```",
  END
].join("\n")

if (process.env["BENCH_NO_REPORT"] !== "1" && only === undefined) {
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
