/**
 * What the command line prints: lines and JSON on stdout, tables whose cells never carry control
 * characters, and the flush before the process exits.
 */
import { Effect } from "effect"

// ---------------------------------------------------------------------------------------------
// Output

export const write = (stream: NodeJS.WriteStream, text: string) => Effect.sync(() => void stream.write(text))
export const out = (text: string) => write(process.stdout, text.endsWith("\n") ? text : `${text}\n`)
export const printJson = (value: unknown) => out(JSON.stringify(value, null, 2))

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
