/**
 * What the CLI tests expect of every command's output: lines, one-line refusals, clean successes.
 */
import { expect } from "vitest"
import type { CliResult } from "../support/proc.js"

/** The non-empty lines of an output. */
export const lines = (s: string) => s.split("\n").filter((l) => l.length > 0)

/** One line on stderr (`firehook: …`), nothing on stdout, exit `code`. */
export const expectOneLineError = (r: CliResult, code: number) => {
  expect(r.code, r.stderr).toBe(code)
  expect(r.stdout).toBe("")
  expect(lines(r.stderr)).toHaveLength(1)
  expect(r.stderr).toMatch(/^firehook: \S/)
}

/** Exit 0 with nothing on stderr. */
export const expectOk = (r: CliResult) => {
  expect(r.code, r.stderr).toBe(0)
  expect(r.stderr).toBe("")
}
