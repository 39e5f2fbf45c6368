/**
 * `npm run bench`: runs every benchmark in turn (each prints its own figures).
 * Arguments after `--` are passed as the event count to intake and delivery, e.g.
 * `npm run bench -- 20000` for a quick run.
 */
import { spawnSync } from "node:child_process"
import * as Fs from "node:fs"
import * as Path from "node:path"

const dir = import.meta.dirname
const n = process.argv[2]
const benches = ["match.ts", "intake.ts", "delivery.ts"].filter((f) => Fs.existsSync(Path.join(dir, f)))
let failed = 0
for (const file of benches) {
  console.log(`\n=== bench/${file}`)
  const args = ["--import", "tsx", Path.join(dir, file), ...(n !== undefined && file !== "match.ts" ? [n] : [])]
  const r = spawnSync(process.execPath, args, { stdio: "inherit", env: process.env })
  if (r.status !== 0) failed++
}
process.exit(failed === 0 ? 0 : 1)
