/**
 * `--help` as users read it: every command listed once under its own path (no `hooks hooks
 * secrets …`, @effect/cli's nested-group defect), USAGE with the whole command line, no ANSI
 * escapes in a pipe; and the pure corrections of src/cli/Help.ts.
 */
import { spawn } from "node:child_process"
import { describe, expect, it } from "vitest"
import {
  commandNames,
  commandPath,
  commandPaths,
  dedupeCommandLine,
  fixHelp,
  optionValueLine,
  unknownCommand
} from "../../src/cli/Help.js"
import { BUN, ROOT, runCli, SOURCE_CLI } from "../support/proc.js"
import { expectOneLineError, lines } from "./cli-expect.js"

const ESC = "\u001b"

describe("firehook --help (piped, as a user's pager or grep sees it)", () => {
  it("lists every command once under its path, USAGE with the command line, no ANSI escapes", async () => {
    const root = await runCli(["--help"], {})
    expect(root.code, root.stderr).toBe(0)
    expect(root.stdout).not.toContain(ESC)
    expect(root.stdout).not.toContain("hooks hooks")
    expect(root.stdout).toContain("$ firehook\n")
    const commands = lines(root.stdout).filter((l) => l.startsWith("  - ")).map((l) => l.slice(4))
    for (const c of ["hooks secrets create", "hooks secrets rotate", "hooks secrets list", "hooks secrets delete"]) {
      expect(commands.some((l) => l.startsWith(`${c} `)), c).toBe(true)
    }
    // the descriptions stay in one column (the same for the corrected lines as for the others)
    const column = (start: string) => {
      const line = commands.find((l) => l.startsWith(start)) ?? ""
      const gap = /\S( {2,})(?=\S)/.exec(line)
      return gap === null ? undefined : gap.index + 1 + (gap[1] ?? "").length
    }
    // (a corrected row that fits the column: `hooks secrets` was `hooks hooks secrets`)
    expect(column("hooks secrets ")).toBeDefined()
    expect(column("hooks secrets ")).toBe(column("deliveries show"))
    // in a column a terminal can show: a row wider than it (deliveries list's usage lists every
    // error kind) has its description on the next line, in the column (before: every row padded
    // to the widest usage, 650 characters)
    const rows = lines(root.stdout)
    expect(Math.max(...rows.map((l) => /\S( {2,})(?=\S)/.exec(l)?.[1]?.length ?? 0))).toBeLessThan(60)
    const listRow = rows.findIndex((l) => l.startsWith("  - deliveries list "))
    expect(rows[listRow + 1]).toMatch(/^ {10,60}list deliveries, newest first/)
    expect(rows[listRow + 1]?.indexOf("list deliveries")).toBe(4 + (column("deliveries show") ?? 0))

    const cases: ReadonlyArray<readonly [ReadonlyArray<string>, string]> = [
      [["secrets", "create", "--help"], "$ firehook secrets create [--token TOKEN] <did> <name>"],
      [["hooks", "secrets", "--help"], "$ firehook hooks secrets"],
      [["hooks", "secrets", "list", "--help"], "$ firehook hooks secrets list [--json]"],
      [["--log-level", "debug", "deliveries", "show", "-h"], "$ firehook deliveries show [--json] [--show-urls] <id>"],
      [["hooks", "--help"], "$ firehook hooks"]
    ]
    // every option of `deliveries list` says what it does (--status said only its choices)
    const list = await runCli(["deliveries", "list", "--help"], {})
    expect(list.stdout).toMatch(
      /^--status pending \| leased .*\n\n {2}One of the following: .*\n\n {2}only deliveries in this status\n/m
    )
    for (const [args, usage] of cases) {
      const r = await runCli(args, {})
      expect(r.code, r.stderr).toBe(0)
      expect(r.stdout).not.toContain(ESC)
      expect(lines(r.stdout).find((l) => l.startsWith("$ ")), args.join(" ")).toMatch(
        new RegExp(`^${usage.replace(/[[\]$]/g, "\\$&")}`)
      )
    }
  }, 120_000)
})

describe("firehook with a command name that names no command", () => {
  it("says which word at which level, and that level's commands: exit 2, one line", async () => {
    const cases: ReadonlyArray<readonly [ReadonlyArray<string>, string]> = [
      [["nosuch"], "firehook: unknown command 'nosuch': use deliveries, webhooks, secrets, owners, status or hooks"],
      [["deliveries", "lst"], "firehook: unknown subcommand 'deliveries lst': use list, show, redeliver or replay"],
      [["hooks", "secrets", "creat", "main"], "firehook: unknown subcommand 'hooks secrets creat': use create, rotate"],
      [
        ["--log-level", "debug", "owners", "ad"],
        "firehook: unknown subcommand 'owners ad': use add, reconcile or status"
      ]
    ]
    for (const [args, line] of cases) {
      // no database is reached: the command line is refused first
      const r = await runCli(args, { DATABASE_URL: "postgres://firehook@127.0.0.1:1/none" })
      expectOneLineError(r, 2)
      expect(r.stderr.startsWith(line), `${args.join(" ")}: ${r.stderr}`).toBe(true)
    }
  }, 120_000)
})

describe("firehook with an option missing its value, or a non-integer --limit", () => {
  it("names the option: exit 2, one line", async () => {
    const cases: ReadonlyArray<readonly [ReadonlyArray<string>, string]> = [
      [["deliveries", "list", "--limit"], "firehook: --limit needs a value (see --help)\n"],
      [["deliveries", "list", "--limit", "--json"], "firehook: --limit needs a value (see --help)\n"],
      [["deliveries", "list", "--owner"], "firehook: --owner needs a value (see --help)\n"],
      [["deliveries", "list", "--limit", "1.5"], "firehook: invalid --limit: '1.5' is not an integer (see --help)\n"],
      [["owners", "status", "--limit=abc"], "firehook: invalid --limit: 'abc' is not an integer (see --help)\n"],
      [["deliveries", "list", "--nope"], "firehook: Received unknown argument: '--nope' (see --help)\n"]
    ]
    for (const [args, line] of cases) {
      const r = await runCli(args, { DATABASE_URL: "postgres://firehook@127.0.0.1:1/none" })
      expectOneLineError(r, 2)
      expect(r.stderr, args.join(" ")).toBe(line)
    }
  }, 120_000)
})

describe("firehook --wizard without a terminal", () => {
  it("is refused at once (exit 2, one line) instead of waiting for an answer forever", async () => {
    const child = spawn(BUN, ["src/cli/main.ts", "--wizard"], {
      cwd: ROOT,
      env: { PATH: process.env["PATH"] ?? "", HOME: process.env["HOME"] ?? "/tmp" },
      stdio: ["pipe", "pipe", "pipe"]
    })
    let stdout = ""
    let stderr = ""
    child.stdout.on("data", (d: Buffer) => (stdout += d.toString("utf8")))
    child.stderr.on("data", (d: Buffer) => (stderr += d.toString("utf8")))
    const timer = setTimeout(() => child.kill("SIGKILL"), 15_000)
    const code = await new Promise<number | null>((resolve) => child.on("close", (c) => resolve(c)))
    clearTimeout(timer)
    expectOneLineError({ code, stdout, stderr }, 2)
    expect(stderr).toBe("firehook: --wizard asks its questions on a terminal: stdin is not one\n")
  }, 60_000)
})

describe("the bundled CLI the suites run (test/support/cliBundle.ts)", () => {
  it("answers as the sources do: help pages, the version, refusals and an operational failure", async () => {
    const unreachable = { DATABASE_URL: "postgres://firehook@127.0.0.1:1/none" }
    const cases: ReadonlyArray<readonly [ReadonlyArray<string>, Record<string, string>, number]> = [
      [["--help"], {}, 0],
      [["--version"], {}, 0],
      [["deliveries", "list", "--limit", "0"], unreachable, 2],
      [["deliveries", "list"], unreachable, 1],
      [["hooks", "status"], {}, 2]
    ]
    for (const [args, env, code] of cases) {
      const [bundled, sources] = await Promise.all([runCli(args, env), runCli(args, env, SOURCE_CLI)])
      expect(bundled, args.join(" ")).toEqual(sources)
      expect(bundled.code, args.join(" ")).toBe(code)
    }
  }, 120_000)
})

describe("Help (pure)", () => {
  it("says which option lacks its value or has a non-integer one", () => {
    const help = "  - deliveries list [--limit N] [--json]  l\n  - deliveries replay --status dead_letter  r\n"
    expect(optionValueLine("Received unknown argument: '--limit' (see --help)", ["list", "--limit"], help)).toBe(
      "--limit needs a value (see --help)"
    )
    expect(optionValueLine("Received unknown argument: '--status' (see --help)", ["replay", "--status"], help))
      .toBe("--status needs a value (see --help)")
    // a switch, or an option followed by a value: @effect/cli's line stands
    expect(optionValueLine("Received unknown argument: '--json' (see --help)", ["list", "--json"], help))
      .toBeUndefined()
    expect(optionValueLine("'--json' is not a integer (see --help)", ["list", "--limit", "--json"], help)).toBe(
      "--limit needs a value (see --help)"
    )
    expect(optionValueLine("'7x' is not a integer (see --help)", ["list", "--limit=7x"], help)).toBe(
      "invalid --limit: '7x' is not an integer (see --help)"
    )
    expect(optionValueLine("Missing argument <id> (see --help)", ["show"], help)).toBeUndefined()
  })

  it("finds the level of an unknown command name from the command paths", () => {
    const paths = commandPaths(
      [
        "COMMANDS",
        "  - deliveries  d",
        "  - deliveries list [--json]  l",
        "  - hooks  h",
        "  - hooks secrets  s",
        "  - hooks hooks secrets list [--json]  sl"
      ].join("\n")
    )
    expect(paths).toEqual([["deliveries"], ["deliveries", "list"], ["hooks"], ["hooks", "secrets"], [
      "hooks",
      "secrets",
      "list"
    ]])
    expect(unknownCommand(["hooks", "secrets", "lst"], paths)).toBe(
      "unknown subcommand 'hooks secrets lst': use list (see --help)"
    )
    expect(unknownCommand(["--log-level", "debug", "x"], paths)).toBe(
      "unknown command 'x': use deliveries or hooks (see --help)"
    )
    expect(unknownCommand(["deliveries", "list", "whatever"], paths)).toBeUndefined()
  })

  it("removes the repeated path of a nested group's commands and keeps the description's column", () => {
    const line = "  - hooks hooks secrets list [--json] [--pds URL]      your secrets"
    expect(dedupeCommandLine(line)).toBe("  - hooks secrets list [--json] [--pds URL]            your secrets")
    expect(dedupeCommandLine(line).length).toBe(line.length)
    // two-word prefixes, as a deeper nesting would print them
    expect(dedupeCommandLine("  - a b a b c  d")).toBe("  - a b c      d")
    for (
      const unchanged of [
        "  - hooks secrets list [--json]  your secrets",
        "  - deliveries list [--status pending | leased]  list deliveries",
        "  - status [--json]  health summary",
        "no command line"
      ]
    ) {
      expect(dedupeCommandLine(unchanged)).toBe(unchanged)
    }
  })

  it("names the command path from the arguments, skipping option values", () => {
    const names = commandNames("COMMANDS\n\n  - secrets create [--token TOKEN]  x\n  - hooks hooks secrets list  y\n")
    expect([...names].sort()).toEqual(["create", "hooks", "list", "secrets"])
    expect(commandPath(["--log-level", "debug", "secrets", "create", "--help"], names, "create")).toEqual([
      "secrets",
      "create"
    ])
    expect(commandPath(["secrets", "create", "list", "--help"], names, "create")).toEqual(["secrets", "create"])
    expect(commandPath(["--help"], names, "create")).toBeUndefined()
  })

  it("keeps ANSI on a terminal, strips it elsewhere, and leaves other output alone", () => {
    const help = `${ESC}[1mfirehook${ESC}[0m\n\nfirehook 0.1.0\n\n${ESC}[1mUSAGE${ESC}[0m\n\n$ list [--json]\n`
    const ctx = { args: ["deliveries", "list", "--help"], program: "firehook", names: () => new Set(["deliveries"]) }
    expect(fixHelp(help, { ...ctx, color: false })).toBe(
      "firehook\n\nfirehook 0.1.0\n\nUSAGE\n\n$ firehook deliveries list [--json]\n"
    )
    expect(fixHelp(help, { ...ctx, color: true })).toContain(`${ESC}[1mUSAGE`)
    expect(fixHelp(help, { ...ctx, color: true })).toContain("$ firehook deliveries list [--json]")
    expect(fixHelp("0.1.0", { ...ctx, color: false })).toBe("0.1.0")
    expect(fixHelp("$ list\n  - a a b  c", { ...ctx, color: false })).toBe("$ list\n  - a a b  c")
  })
})
