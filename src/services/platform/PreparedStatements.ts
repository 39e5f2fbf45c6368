/**
 * Named prepared statements for the `pg` pool behind `@effect/sql-pg` (issue 16 item 3).
 *
 * `@effect/sql-pg` sends every statement unnamed, so PostgreSQL parses, analyses and plans each one
 * every time; on the delivery path (claim, settle, intake's insert, the subscription read) that was
 * 14 % of the server's statement time plus the parse work, measured in docs/benchmarks.md. The
 * pool's connections are made by {@link preparingClient}: a `pg` client that sends a statement
 * text it has seen often under a name, so that each connection parses it once and PostgreSQL keeps
 * its plan (PostgreSQL's own plan cache decides between a generic and a per-call plan, and replans
 * after DDL or ANALYZE of a table the statement reads).
 *
 * Which texts get a name ({@link StatementNames}):
 * - only statements with parameters (the extended protocol; parameterless texts, such as
 *   migrations' multi-statement scripts, `BEGIN` or `LISTEN`, go as before);
 * - only texts seen {@link PREPARE_AFTER} times, so one-off texts (operator listings with their
 *   filters) do not fill the connections' statement caches; at most {@link MAX_NAMED} names per
 *   pool, and the count of texts not yet named is forgotten past {@link MAX_TRACKED};
 * - never a text whose result columns follow a table's (`SELECT *`, `RETURNING *`, `t.*`): after a
 *   migration adds a column, PostgreSQL refuses a prepared statement whose result type changed
 *   ("cached plan must not change result type"), so those stay unnamed. `SELECT * FROM unnest(…)` and
 *   `jsonb_to_recordset(…)` name their columns themselves and are allowed.
 *
 * `DATABASE_PREPARED_STATEMENTS=0` turns it off (a connection pooler in transaction mode without
 * prepared-statement support, PgBouncer before 1.21 or with `max_prepared_statements = 0`).
 */
import Pg from "pg"

/** Uses of a text before it is sent under a name. */
export const PREPARE_AFTER = 5
/** Names per pool (each connection prepares only the named texts it runs). */
export const MAX_NAMED = 100
/** Texts counted towards a name at once; the counts start over past it. */
export const MAX_TRACKED = 2_000

const TABLE_SHAPED = /(?:SELECT|RETURNING)\s+\*(?!\s+FROM\s+(?:unnest|jsonb_to_recordset)\s*\()|[\w")]\.\*/i

/** The names of one pool's statement texts. */
export class StatementNames {
  private readonly counts = new Map<string, number>()
  private readonly names = new Map<string, string>()

  /** The name to send `text` under, or `undefined` to send it unnamed (counting this use). */
  nameOf(text: string): string | undefined {
    const named = this.names.get(text)
    if (named !== undefined || this.names.size >= MAX_NAMED) return named
    const uses = (this.counts.get(text) ?? 0) + 1
    if (uses < PREPARE_AFTER) {
      if (uses === 1 && this.counts.size >= MAX_TRACKED) this.counts.clear()
      this.counts.set(text, uses)
      return undefined
    }
    this.counts.delete(text)
    if (TABLE_SHAPED.test(text)) {
      this.counts.set(text, Number.NEGATIVE_INFINITY)
      return undefined
    }
    const name = `firehook_${this.names.size + 1}`
    this.names.set(text, name)
    return name
  }

  /** How many texts have a name. */
  get size(): number {
    return this.names.size
  }
}

type QueryFn = (...args: ReadonlyArray<unknown>) => unknown

/**
 * A `pg` client class whose `query(text, values, callback)` (the call `@effect/sql-pg` makes for
 * every statement) sends the texts `names` picks as named statements; every other call is passed
 * through unchanged.
 */
export const preparingClient = (names: StatementNames): typeof Pg.Client =>
  class PreparingClient extends Pg.Client {
    constructor(config?: string | Pg.ClientConfig) {
      super(config)
      const query: QueryFn = this.query.bind(this)
      const self: { query: QueryFn } = this as unknown as { query: QueryFn }
      self.query = (...args) => {
        const [text, values, callback] = args
        if (typeof text === "string" && Array.isArray(values) && values.length > 0 && typeof callback === "function") {
          const name = names.nameOf(text)
          if (name !== undefined) return query({ name, text, values }, callback)
        }
        return query(...args)
      }
    }
  }
