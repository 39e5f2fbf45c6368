/**
 * Run by test/platform/platform-bounds.test.ts under Bun: `bun test/platform/lifecycle-signals-child.ts
 * [handed-over]` loads LifecycleSignals (and, with `handed-over`, calls its `handOver`), prints
 * `ready`, then answers each `ping` line on stdin with `pong` and exits with the code of any number line.
 */
import * as LifecycleSignals from "../../src/services/platform/LifecycleSignals.js"

if (process.argv[2] === "handed-over") LifecycleSignals.handOver()
process.stdin.setEncoding("utf8")
process.stdin.on("data", (data) => {
  for (const line of String(data).split("\n").filter((l) => l.length > 0)) {
    if (line === "ping") process.stdout.write("pong\n")
    else process.exit(Number(line))
  }
})
process.stdout.write("ready\n")
