/**
 * A real local atproto network: `@atproto/dev-env`'s `TestNetworkNoAppView` (the real `@atproto/pds`
 * on SQLite and an in-memory PLC directory), for the end-to-end tests and `npm run demo`.
 *
 * It must run under Node ≥ 22 (the `node` devDependency, `node_modules/.bin/node`), never inside Bun
 * (better-sqlite3 is not supported there). Run it as a child process:
 *
 *   node devnet/network.ts [--max-ms N]
 *
 * Protocol (stdout, one JSON object per line):
 *   {"ready":true,"pds":"http://localhost:P","plc":"http://localhost:Q"}
 *   {"closed":true}
 * It shuts the network down cleanly (and exits 0) on SIGTERM, SIGINT, when its stdin closes (the
 * parent died or closed the pipe), or after `--max-ms` (default 15 minutes) so that it never outlives
 * a test run. A start failure prints `{"error":"…"}` and exits 1.
 */
import { TestNetworkNoAppView } from "@atproto/dev-env"

const argMax = process.argv.indexOf("--max-ms")
const maxMs = argMax >= 0 ? Number(process.argv[argMax + 1]) : 15 * 60_000

const say = (value: Record<string, unknown>) => process.stdout.write(`${JSON.stringify(value)}\n`)

let network: TestNetworkNoAppView | undefined
let closing: Promise<void> | undefined

const shutdown = (code: number): Promise<void> => {
  closing ??= (async () => {
    clearTimeout(deadline)
    try {
      await network?.close()
    } catch (e) {
      process.stderr.write(`devnet: close failed: ${String(e)}\n`)
      code = 1
    }
    say({ closed: true })
    process.exit(code)
  })()
  return closing
}

const deadline = setTimeout(() => {
  process.stderr.write(`devnet: --max-ms ${maxMs} reached, shutting down\n`)
  void shutdown(0)
}, Number.isFinite(maxMs) && maxMs > 0 ? maxMs : 15 * 60_000)

for (const signal of ["SIGTERM", "SIGINT", "SIGHUP"] as const) process.on(signal, () => void shutdown(0))
process.stdin.on("end", () => void shutdown(0))
process.stdin.on("error", () => void shutdown(0))
process.stdin.resume()

try {
  network = await TestNetworkNoAppView.create({ pds: { hostname: "localhost" } })
  say({
    ready: true,
    pds: network.pds.url,
    plc: network.plc.url
  })
} catch (e) {
  say({ error: e instanceof Error ? e.message : String(e) })
  await shutdown(1)
}
