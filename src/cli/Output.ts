/**
 * What the command line prints: lines and JSON on stdout, tables whose cells never carry control
 * characters, and the flush before the process exits.
 */
import { Effect } from "effect"

// ---------------------------------------------------------------------------------------------
// Output

export const write = (stream: NodeJS.WriteStream, text: string) => Effect.sync(() => void stream.write(text))
export const out = (text: string) => write(process.stdout, text.endsWith("\n") ? text : `${text}\n`)
/**
 * Indented JSON for a terminal: `JSON.stringify` escapes U+0000–U+001F but not DEL and the C1
 * controls U+0080–U+009F (U+009B is CSI), which occur only inside strings, so escaping them keeps
 * the JSON valid and the terminal safe from the values of other people's records.
 */
export const terminalJson = (value: unknown, indent = 2): string =>
  JSON.stringify(value, null, indent).replace(
    /[\u007f-\u009f]/g,
    (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, "0")}`
  )

export const printJson = (value: unknown) => out(terminalJson(value))

/** Wait until everything written so far has been handed to the OS (before the process exits). */
export const flush = (stream: NodeJS.WriteStream) =>
  Effect.async<void>((resume) => {
    stream.write("", () => resume(Effect.void))
  })

/** A table cell: control characters never reach the terminal. */
export const cell = (v: string | number | undefined): string =>
  v === undefined ? "-" : String(v).replace(/[\u0000-\u001f\u007f-\u009f]/g, " ")

export const table = (headers: ReadonlyArray<string>, rows: ReadonlyArray<ReadonlyArray<string>>): string => {
  const widths = headers.map((h, i) => rows.reduce((w, r) => Math.max(w, (r[i] ?? "").length), h.length))
  const line = (r: ReadonlyArray<string>) =>
    r.map((c, i) => (i === r.length - 1 ? c : c.padEnd(widths[i] ?? 0))).join("  ").trimEnd()
  return [line(headers), ...rows.map(line)].join("\n")
}

export const iso = (d: Date | undefined): string | undefined => d?.toISOString()

export const REDACTED_URL = "[redacted]"
