/**
 * The strict readers of configuration (SPEC §6.5), shared by the domains' config descriptors.
 *
 * Every value comes from Effect's `ConfigProvider` (the environment in production, `fromMap` in
 * tests) and is parsed strictly: integers must match `^(0|[1-9]\d*)$` and sit in a range,
 * enumerations are closed, URLs are parsed. A bad value is a `ConfigInvalid` naming the variable
 * and the rule it broke — never the value itself, so a secret can never leak through an error.
 * An empty string counts as unset (so `VAR= npm start` falls back to the default).
 */
import { Config as EffectConfig, Data, Effect, Option, Record, Redacted } from "effect"
import * as Net from "node:net"
import { cidrContains, isLoopbackHost, parseCidr, parseIpv4, parseIpv6 } from "../../schemas/Net.js"

/** A configuration value broke a rule. `variable` and `rule` never contain the offending value. */
export class ConfigInvalid extends Data.TaggedError("ConfigInvalid")<{
  readonly variable: string
  readonly rule: string
}> {
  override get message(): string {
    return `invalid configuration: ${this.variable} ${this.rule}`
  }
}

// ---------------------------------------------------------------------------------------------
// Strict readers

const INTEGER = /^(0|[1-9]\d*)$/

/** The raw value of a variable, `None` when unset or empty. Never fails with the value. */
export const raw = (name: string): Effect.Effect<Option.Option<string>, ConfigInvalid> =>
  EffectConfig.option(EffectConfig.string(name)).pipe(
    Effect.mapError(() => new ConfigInvalid({ variable: name, rule: "could not be read" })),
    Effect.map(Option.filter((s) => s.length > 0))
  )

export const readInt = (name: string, def: number, min: number, max: number) =>
  raw(name).pipe(
    Effect.flatMap(
      Option.match({
        onNone: () => Effect.succeed(def),
        onSome: (s) => {
          const n = INTEGER.test(s) ? Number(s) : Number.NaN
          return Number.isSafeInteger(n) && n >= min && n <= max
            ? Effect.succeed(n)
            : Effect.fail(new ConfigInvalid({ variable: name, rule: `must be an integer in ${min}..${max}` }))
        }
      })
    )
  )

export const readEnum = <const A extends string>(name: string, values: ReadonlyArray<A>, def: A) =>
  raw(name).pipe(
    Effect.flatMap(
      Option.match({
        onNone: () => Effect.succeed(def),
        onSome: (s) => {
          const found = values.find((v) => v === s)
          return found !== undefined
            ? Effect.succeed(found)
            : Effect.fail(new ConfigInvalid({ variable: name, rule: `must be one of ${values.join(", ")}` }))
        }
      })
    )
  )

/** A rule a string value must pass, and the text `ConfigInvalid` names when it does not. */
export interface StringRule {
  readonly test: (s: string) => boolean
  readonly text: string
}

export const readString = (name: string, def: string, rule: StringRule) => readStringAll(name, def, [rule])

/** A string that must pass every one of `rules`; the first one it breaks is the error. */
export const readStringAll = (name: string, def: string, rules: ReadonlyArray<StringRule>) =>
  raw(name).pipe(
    Effect.flatMap(
      Option.match({
        onNone: () => Effect.succeed(def),
        onSome: (s) => {
          const broken = rules.find((rule) => !rule.test(s))
          return broken === undefined
            ? Effect.succeed(s)
            : Effect.fail(new ConfigInvalid({ variable: name, rule: broken.text }))
        }
      })
    )
  )

/** An optional secret: `None` when unset, otherwise the value `Redacted` when it passes `test`. */
export const readRedacted = (name: string, test: (s: string) => boolean, rule: string) =>
  readRedactedAll(name, [{ test, text: rule }])

/** An optional secret that must pass every one of `rules`; the first one it breaks is the error. */
export const readRedactedAll = (name: string, rules: ReadonlyArray<StringRule>) =>
  raw(name).pipe(
    Effect.flatMap(
      Option.match({
        onNone: () => Effect.succeed(Option.none<Redacted.Redacted<string>>()),
        onSome: (s) => {
          const broken = rules.find((rule) => !rule.test(s))
          return broken === undefined
            ? Effect.succeed(Option.some(Redacted.make(s)))
            : Effect.fail(new ConfigInvalid({ variable: name, rule: broken.text }))
        }
      })
    )
  )

/** A cross-field rule: `upper` (variable `upperName`) must not be below `lower` (`lowerName`). */
export const notBelow = (
  upperName: string,
  upper: number,
  lowerName: string,
  lower: number
): Effect.Effect<void, ConfigInvalid> =>
  upper < lower
    ? Effect.fail(new ConfigInvalid({ variable: upperName, rule: `must not be below ${lowerName}` }))
    : Effect.void

// ---------------------------------------------------------------------------------------------
// Descriptors: a variable's name, default and rule, declared once in its domain's *Config module

/** An integer variable: `env` in `min..max`, `default` when unset. */
export interface IntVar {
  readonly env: string
  readonly default: number
  readonly min: number
  readonly max: number
}

/** A closed enumeration: `env` one of `values`, `default` when unset. */
export interface EnumVar<A extends string> {
  readonly env: string
  readonly default: A
  readonly values: ReadonlyArray<A>
}

/** A string variable with a fixed rule. */
export interface StringVar {
  readonly env: string
  readonly default: string
  readonly rule: StringRule
}

export const readIntVar = (v: IntVar): Effect.Effect<number, ConfigInvalid> => readInt(v.env, v.default, v.min, v.max)

export const readEnumVar = <A extends string>(v: EnumVar<A>): Effect.Effect<A, ConfigInvalid> =>
  readEnum(v.env, v.values, v.default)

export const readStringVar = (v: StringVar): Effect.Effect<string, ConfigInvalid> =>
  readString(v.env, v.default, v.rule)

/** Every integer variable of a section, read one after another in the section's key order. */
export const readIntVars = <K extends string>(section: { readonly [P in K]: IntVar }) =>
  Effect.all(Record.map(section, readIntVar))

// ---------------------------------------------------------------------------------------------
// URL and host rules

const SPACE_OR_CONTROL = /[\s\p{Cc}\p{Cf}]/u

/**
 * Whether `s` holds whitespace (ASCII or Unicode), a control character or an invisible format
 * character (zero-width space, BOM, soft hyphen) anywhere. WHATWG URL drops leading and trailing
 * spaces and controls and every tab and newline, so `URL.canParse("https://plc.directory ")` is true,
 * but a URL variable is kept as written and joined to paths later, where the space breaks it.
 */
export const hasSpaceOrControl = (s: string): boolean => SPACE_OR_CONTROL.test(s)

/**
 * SPEC §6.5 (strict parsing): every URL variable (`DATABASE_URL`, `JETSTREAM_URL`, `RELAY_URL`,
 * `PLC_DIRECTORY_URL`, `OWNER_DISCOVERY_URL`, `REDIS_URL`, `PUBLIC_URL`) is refused at startup when it
 * holds whitespace or a control character anywhere (a stray space from a copied `.env` line), instead
 * of starting and failing each request later. Checked before the variable's own rule.
 */
export const urlText: StringRule = {
  test: (s) => !hasSpaceOrControl(s),
  text: "must not contain whitespace or control characters"
}

/** The length bound of `DATABASE_URL`. */
export const DATABASE_URL_MAX_LENGTH = 4096
/** The length bound of the stream, service-base and public URL variables. */
export const URL_MAX_LENGTH = 2048

/**
 * A URL variable's length bound, listed before the variable's own rule so that a value over it is
 * told so (the own rule's "must be a … URL" would not say why a well-formed URL is refused).
 */
export const urlLength = (max: number): StringRule => ({
  test: (s) => s.length <= max,
  text: `must be at most ${max} characters`
})

/** A URL that parses and holds no whitespace or control character ({@link urlText}). */
const parseStrictUrl = (s: string, maxLength: number): URL | undefined =>
  s.length <= maxLength && !hasSpaceOrControl(s) && URL.canParse(s) ? new URL(s) : undefined

export const isPostgresUrl = (s: string): boolean => {
  const u = parseStrictUrl(s, DATABASE_URL_MAX_LENGTH)
  return u !== undefined && (u.protocol === "postgres:" || u.protocol === "postgresql:") &&
    (u.hostname.length > 0 || u.searchParams.has("host"))
}

/** wss:// anywhere; ws:// only to a loopback host ({@link isLoopbackHost}) and only in insecure development mode. */
export const isStreamUrl = (s: string, insecure: boolean): boolean => {
  const u = parseStrictUrl(s, URL_MAX_LENGTH)
  if (u === undefined || u.username !== "" || u.password !== "" || u.hash !== "") return false
  if (u.protocol === "wss:") return u.hostname.length > 0
  return u.protocol === "ws:" && insecure && isLoopbackHost(u.hostname)
}

/**
 * An HTTP base URL for identity / discovery requests (PLC directory, relay): https:// with a host,
 * no credentials, query or fragment, no whitespace or control character; http:// only to a loopback
 * host ({@link isLoopbackHost}) in insecure development mode.
 * The transport re-checks every request (public addresses only).
 */
export const isServiceBaseUrl = (s: string, insecure: boolean): boolean => {
  const u = parseStrictUrl(s, URL_MAX_LENGTH)
  if (u === undefined || s.includes("#") || s.includes("?")) return false
  if (u.username !== "" || u.password !== "" || u.hostname.length === 0) return false
  if (u.protocol === "https:") return true
  return u.protocol === "http:" && insecure && isLoopbackHost(u.hostname)
}

/**
 * A comma-separated list (entries trimmed, empty entries dropped; empty = none) of at most `max`
 * entries, each passing `valid`; undefined when one does not or when there are too many.
 */
export const parseCommaList = (
  s: string,
  max: number,
  valid: (entry: string) => boolean
): ReadonlyArray<string> | undefined => {
  const parts = s.split(",").map((p) => p.trim()).filter((p) => p.length > 0)
  if (parts.length > max) return undefined
  for (const p of parts) if (!valid(p)) return undefined
  return parts
}

export const stripTrailingSlashes = (s: string): string => s.replace(/\/+$/, "")

/**
 * SPEC §6.5: `JETSTREAM_URL` and `RELAY_URL` carry no query and no fragment (`?` or `#` anywhere,
 * even empty): firehook sets `cursor`, `requireHello` and the filters itself, so a query of the
 * operator's would be dropped silently.
 */
export const noQueryOrFragment: StringRule = {
  test: (s) => !s.includes("?") && !s.includes("#"),
  text: "must not have a query or a fragment"
}

/**
 * SPEC §6.5: an address to listen on (`HEALTH_HOST`, `API_HOST`) is an IPv4 or IPv6 literal
 * (without brackets; a link-local one with its zone, {@link listenZone}) or `localhost`; any other
 * name (`eth0`, a DNS name) is refused at startup
 * instead of failing, or binding somewhere unexpected, when the listener starts.
 */
export const listenHost: StringRule = {
  test: (s) => s === "localhost" || (s.length <= 64 && Net.isIP(s) !== 0),
  text: "must be an IP literal or localhost"
}

/** A listen host without its IPv6 zone (`fe80::1%eth0` → `fe80::1`). */
const withoutZone = (host: string): string => {
  const at = host.indexOf("%")
  return at < 0 ? host : host.slice(0, at)
}

const LINK_LOCAL_IPV6 = parseCidr("fe80::/10")
/** Whether `host` (a zone left off) is an IPv6 link-local address (fe80::/10). */
const isLinkLocal = (host: string): boolean => {
  const bytes = parseIpv6(withoutZone(host))
  return bytes !== undefined && LINK_LOCAL_IPV6 !== undefined && cidrContains(LINK_LOCAL_IPV6, bytes)
}

/**
 * SPEC §6.5: an IPv6 zone (`%eth0`, or an interface index `%2`) only after a link-local address
 * (fe80::/10), the one kind of address that needs it. Bun listens on `fe80::…%eth0`, but a zone on
 * any other address throws a TypeError in `Bun.serve` (`::1%lo`, `::%eth0`) or fails the bind
 * (`fd00::1%eth0`: EINVAL), which startup could only report as an unexpected error.
 */
export const listenZone: StringRule = {
  test: (s) => s.indexOf("%") < 0 || isLinkLocal(s),
  text: "may have an IPv6 zone (%eth0) only after a link-local fe80:: address"
}

/**
 * A link-local address needs its zone: the system cannot listen on `fe80::1` without knowing the
 * interface (Linux's bind answers EINVAL), so it is refused at startup, in one line, instead of
 * when the listener starts.
 */
export const linkLocalZone: StringRule = {
  test: (s) => s.indexOf("%") >= 0 || !isLinkLocal(s),
  text: "needs an IPv6 zone after a link-local fe80:: address (fe80::1%eth0)"
}

/**
 * A listen host's address bytes (an IPv4-mapped IPv6 address as its IPv4; a zoned address as the
 * address alone), `undefined` for `localhost`.
 */
const listenBytes = (host: string): Uint8Array | undefined => {
  const v4 = parseIpv4(host)
  if (v4 !== undefined) return v4
  const v6 = parseIpv6(withoutZone(host))
  const mapped = v6 !== undefined && v6.subarray(0, 10).every((b) => b === 0) && v6[10] === 0xff && v6[11] === 0xff
  return mapped ? v6.subarray(12) : v6
}

/** Whether `bytes` (from {@link listenBytes}) is an address `localhost` resolves to: 127.0.0.1 or ::1. */
const isLocalhostAddress = (bytes: Uint8Array): boolean =>
  bytes.length === 4
    ? bytes[0] === 127 && bytes[1] === 0 && bytes[2] === 0 && bytes[3] === 1
    : bytes.every((byte, i) => byte === (i === 15 ? 1 : 0))

/**
 * Whether two listeners on the same port would take the same address (SPEC §6.5: the health and
 * the API listener): the same address, either one a wildcard (`0.0.0.0`, `::`), or `localhost`
 * against itself or an address it resolves to (127.0.0.1 or ::1; another 127/8 address such as
 * 127.0.0.2 is a listener of its own). Port 0 never collides (each listener gets a free port).
 */
export const listenersCollide = (
  a: { readonly host: string; readonly port: number },
  b: { readonly host: string; readonly port: number }
): boolean => {
  if (a.port !== b.port || a.port === 0) return false
  if (a.host === b.host) return true
  const ba = listenBytes(a.host)
  const bb = listenBytes(b.host)
  const wildcard = (x: Uint8Array | undefined) => x !== undefined && x.every((byte) => byte === 0)
  if (wildcard(ba) || wildcard(bb)) return true
  if (ba === undefined || bb === undefined) {
    const other = ba ?? bb
    return other === undefined ? a.host === "localhost" && b.host === "localhost" : isLocalhostAddress(other)
  }
  return ba.length === bb.length && ba.every((byte, i) => byte === bb[i])
}

/**
 * A listen address variable (`HEALTH_HOST`, `API_HOST`): {@link listenHost}, {@link listenZone},
 * then {@link linkLocalZone}; `default` when unset.
 */
export const readListenHost = (v: { readonly env: string; readonly default: string }) =>
  readStringAll(v.env, v.default, [listenHost, listenZone, linkLocalZone])
