/**
 * The help text @effect/cli prints (`--help`), corrected before it reaches the terminal:
 * - `firehook --help` lists the commands of a nested group with the path before the group twice
 *   (`hooks hooks secrets create`): @effect/cli 0.77.2 (`getHelpInternal`, case `Subcommands`)
 *   prefixes a nested group's children with the path before the group and then with the group's own
 *   usage, which already starts with that path. No command definition avoids it short of not
 *   nesting `hooks secrets`, so the repeated words are removed here, the column kept aligned;
 * - USAGE names the command alone (`$ create [--token TOKEN] <did> <name>`): it is given the
 *   command line's words (`$ firehook secrets create …`);
 * - ANSI styling only on a terminal, and not with `NO_COLOR` set (never in a pipe or a file).
 */

// ---------------------------------------------------------------------------------------------
// Help text

const ANSI = new RegExp(String.raw`\u001b\[[0-9;]*[A-Za-z]`, "g")

export const stripAnsi = (text: string): string => text.replace(ANSI, "")

/** A command's name: lower-case words with dashes (options start with `-`, arguments with `<`/`[`). */
const NAME = /^[a-z][a-z-]*$/

/** A line of a COMMANDS list: `  - <usage>`, then (two or more spaces) the description. */
const COMMAND_LINE = /^(\s*- )(.*)$/

/** The command names (`list`, `hooks`, `secrets`, …) at the start of the root help's COMMANDS lines. */
export const commandNames = (rootHelp: string): ReadonlySet<string> => {
  const names = new Set<string>()
  for (const line of stripAnsi(rootHelp).split("\n")) {
    const m = COMMAND_LINE.exec(line)
    if (m === null) continue
    for (const word of (m[2] ?? "").split(" ")) {
      if (!NAME.test(word)) break
      names.add(word)
    }
  }
  return names
}

/**
 * Every command's path (`["deliveries"]`, `["deliveries", "list"]`, `["hooks", "secrets", "create"]`,
 * …) in the order of the root help's COMMANDS lines (their repeated words removed).
 */
export const commandPaths = (rootHelp: string): ReadonlyArray<ReadonlyArray<string>> => {
  const paths: Array<ReadonlyArray<string>> = []
  for (const line of stripAnsi(rootHelp).split("\n")) {
    const m = COMMAND_LINE.exec(dedupeCommandLine(line))
    if (m === null) continue
    const words = (m[2] ?? "").split(" ")
    const end = words.findIndex((w) => !NAME.test(w))
    const path = end < 0 ? words : words.slice(0, end)
    if (path.length > 0) paths.push(path)
  }
  return paths
}

/** Built-in options whose value is the next argument (skipped when looking for command names). */
const OPTIONS_WITH_VALUE: ReadonlySet<string> = new Set(["--log-level", "--completions"])

const orList = (items: ReadonlyArray<string>): string =>
  items.length <= 1 ? items.join("") : `${items.slice(0, -1).join(", ")} or ${items[items.length - 1]}`

/**
 * The line for a command name that names no command (@effect/cli reports it as an invalid
 * subcommand of the program, listing the top-level commands, whatever the level): the words as
 * given, and the commands that level has. Undefined when every word names a command.
 */
export const unknownCommand = (
  args: ReadonlyArray<string>,
  paths: ReadonlyArray<ReadonlyArray<string>>
): string | undefined => {
  const prefix: Array<string> = []
  const childrenOf = (p: ReadonlyArray<string>) =>
    paths.filter((c) => c.length === p.length + 1 && p.every((w, i) => c[i] === w)).map((c) => c[p.length] ?? "")
  for (let i = 0; i < args.length; i++) {
    const a = args[i] ?? ""
    if (a.startsWith("-")) {
      if (OPTIONS_WITH_VALUE.has(a)) i++
      continue
    }
    const children = childrenOf(prefix)
    if (children.length === 0) return undefined
    if (!children.includes(a)) {
      const what = prefix.length === 0 ? "command" : "subcommand"
      return `unknown ${what} '${[...prefix, a].join(" ")}': use ${orList(children)} (see --help)`
    }
    prefix.push(a)
  }
  return undefined
}

const escapeRegExp = (s: string): string => s.replace(/[.*+?^${}()|[\]\\]/g, "\\$&")

/** Whether the root help's usages give `flag` a value (`[--limit N]`, `--status dead_letter`), not a switch. */
const takesValue = (rootHelp: string, flag: string): boolean =>
  new RegExp(`(^|[\\s\\[])${escapeRegExp(flag)} [^\\s\\[\\]-]`, "m").test(stripAnsi(rootHelp))

/** The value given to `flag` on the command line (its last occurrence: `--flag v` or `--flag=v`). */
const valueOf = (args: ReadonlyArray<string>, flag: string): string | undefined => {
  for (let i = args.length - 1; i >= 0; i--) {
    const a = args[i] ?? ""
    if (a === flag) return args[i + 1]
    if (a.startsWith(`${flag}=`)) return a.slice(flag.length + 1)
  }
  return undefined
}

/**
 * @effect/cli's line for a value that is none of a choice option's ("Expected one of the following
 * cases: pending, leased, …", the option unnamed), said with the option's name: the option of the
 * command line whose usage in the root help lists exactly these cases, and whose value is none of them.
 */
const choiceLine = (line: string, args: ReadonlyArray<string>, rootHelp: string): string | undefined => {
  const listed = /^Expected one of the following cases: ([a-z0-9_, -]+?)(?= Expected | \(see --help\)|$)/.exec(line)
    ?.[1]
  if (listed === undefined) return undefined
  const cases = listed.split(", ")
  const usage = new RegExp(
    `(?:^|[\\s\\[])(--[a-z][a-z-]*) ${cases.map(escapeRegExp).join(" \\| ")}(?=[\\s\\]]|$)`,
    "gm"
  )
  const flags = new Set([...stripAnsi(rootHelp).matchAll(usage)].map((m) => m[1] ?? ""))
  for (const flag of flags) {
    const value = valueOf(args, flag)
    if (value !== undefined && !cases.includes(value)) {
      return `invalid ${flag}: '${value}' is not one of ${cases.join(", ")} (see --help)`
    }
  }
  return undefined
}

/**
 * @effect/cli's lines for an option given without its value (`--limit` last: "Received unknown
 * argument: '--limit'"; `--limit --json`: "'--json' is not a integer") or with a value that is not
 * an integer ("'1.5' is not a integer", the option unnamed), a required option missing ("Expected
 * to find option: '--status'") or a value that is none of a choice option's, said with the option's name.
 */
export const optionValueLine = (line: string, args: ReadonlyArray<string>, rootHelp: string): string | undefined => {
  const required = /^Expected to find option: '(--[a-z][a-z-]*)'/.exec(line)?.[1]
  if (required !== undefined) return `missing ${required} (see --help)`
  const choice = choiceLine(line, args, rootHelp)
  if (choice !== undefined) return choice
  const unknown = /^Received unknown argument: '(--[a-z][a-z-]*)'/.exec(line)?.[1]
  if (unknown !== undefined) {
    const next = args[args.lastIndexOf(unknown) + 1]
    return (next === undefined || next.startsWith("-")) && takesValue(rootHelp, unknown)
      ? `${unknown} needs a value (see --help)`
      : undefined
  }
  const value = /^'(.*)' is not a integer/.exec(line)?.[1]
  if (value === undefined) return undefined
  for (let i = 0; i < args.length; i++) {
    const a = args[i] ?? ""
    const flag = a === value && i > 0 ? args[i - 1] ?? "" : a.endsWith(`=${value}`) ? a.slice(0, -value.length - 1) : ""
    if (!/^--[a-z][a-z-]*$/.test(flag)) continue
    return value.startsWith("-") && takesValue(rootHelp, flag)
      ? `${flag} needs a value (see --help)`
      : `invalid ${flag}: '${value}' is not an integer (see --help)`
  }
  return `'${value}' is not an integer (see --help)`
}

/**
 * One COMMANDS line without the repeated path (`- hooks hooks secrets create …` → `- hooks
 * secrets create …`), its description kept in its column (as many spaces added as words removed).
 */
export const dedupeCommandLine = (line: string): string => {
  const m = COMMAND_LINE.exec(line)
  if (m === null) return line
  const prefix = m[1] ?? ""
  const words = (m[2] ?? "").split(" ")
  let names = 0
  while (names < words.length && NAME.test(words[names] ?? "")) names++
  for (let n = Math.floor(names / 2); n >= 1; n--) {
    const head = words.slice(0, n).join(" ")
    if (head === words.slice(n, 2 * n).join(" ")) {
      const rest = words.slice(n).join(" ")
      const gap = /\S {2,}(?=\S)/.exec(rest)
      if (gap === null) return `${prefix}${rest}`
      const at = gap.index + 1
      return `${prefix}${rest.slice(0, at)}${" ".repeat(head.length + 1)}${rest.slice(at)}`
    }
  }
  return line
}

/**
 * The words of the command line that name the command whose help this is (`leaf`): the command
 * names among `args` up to the first `leaf` (option values and arguments are not command names).
 */
export const commandPath = (
  args: ReadonlyArray<string>,
  names: ReadonlySet<string>,
  leaf: string
): ReadonlyArray<string> | undefined => {
  const path: Array<string> = []
  for (const a of args) {
    if (a === leaf) return [...path, a]
    if (names.has(a)) path.push(a)
  }
  return undefined
}

const USAGE_LINE = /^\$ ([a-z][a-z-]*)(.*)$/

export interface HelpContext {
  /** the command line's arguments (without the runtime and the script) */
  readonly args: ReadonlyArray<string>
  /** the program's name (`firehook`) */
  readonly program: string
  /** the command names of the root help ({@link commandNames}) */
  readonly names: () => ReadonlySet<string>
  /** keep the ANSI styling (a terminal without NO_COLOR) */
  readonly color: boolean
}

/** Whether a text @effect/cli prints is a help page (its banner and a USAGE section). */
const isHelp = (plain: string, program: string): boolean => plain.startsWith(`${program}\n`) && /^USAGE$/m.test(plain)

/** The help text as printed: commands listed once, USAGE with the full command line, styled on a terminal. */
export const fixHelp = (text: string, ctx: HelpContext): string => {
  const plain = stripAnsi(text)
  if (!isHelp(plain, ctx.program)) return ctx.color ? text : plain
  const lines = (ctx.color ? text : plain).split("\n").map((line) => {
    const usage = USAGE_LINE.exec(line)
    if (usage !== null && usage[1] !== ctx.program) {
      const path = commandPath(ctx.args, ctx.names(), usage[1] ?? "")
      return path === undefined ? line : `$ ${[ctx.program, ...path].join(" ")}${usage[2] ?? ""}`
    }
    return dedupeCommandLine(line)
  })
  return narrowCommandRows(lines).join("\n")
}

/** The widest COMMANDS row whose description stays on its line; a longer row's goes below it. */
export const DESCRIPTION_COLUMN_MAX = 60

/**
 * The COMMANDS rows with their descriptions in a column at most {@link DESCRIPTION_COLUMN_MAX}
 * wide: @effect/cli pads every row to its longest usage (`deliveries list` lists every error
 * kind: rows of 650 characters on any terminal); a row whose usage is wider ends there and its
 * description follows on the next line, in the column. Rows are written without colour.
 */
export const narrowCommandRows = (lines: ReadonlyArray<string>): ReadonlyArray<string> => {
  const rows = lines.map((line) => {
    const m = /^(\s*- )(\S(?:.*?\S)?)(?: {2,}(\S.*))?\s*$/.exec(stripAnsi(line))
    return m === null ? undefined : { prefix: m[1] ?? "", usage: m[2] ?? "", description: m[3] }
  })
  const fits = rows.map((r) => (r === undefined ? 0 : r.prefix.length + r.usage.length))
    .filter((n) => n > 0 && n + 2 <= DESCRIPTION_COLUMN_MAX)
  const column = Math.max(0, ...fits) + 2
  return lines.flatMap((line, i) => {
    const r = rows[i]
    if (r === undefined) return [line]
    const head = `${r.prefix}${r.usage}`
    if (r.description === undefined) return [head]
    return head.length + 2 <= column
      ? [`${head.padEnd(column)}${r.description}`]
      : [head, `${" ".repeat(column)}${r.description}`]
  })
}
