/**
 * Destination transforms (SPEC §4.4): a delivery plus the live subscription → the concrete HTTP request.
 *
 * A {@link Transform} is pure and runs on every attempt. It answers
 * - `Right(request)`: send it;
 * - `Right(null)`: skip: the delivery becomes `delivered` without a request;
 * - `Left("transform_failed")`: permanent failure (dead-lettered after one attempt, no request).
 *
 * Built-in presets, chosen by URL ({@link selectPreset}):
 * - `webhook` (default): the signed JSON POST of SPEC §4.5, body byte for byte as stored.
 * - `slack` (host `hooks.slack.com`): `{"text": <summary>}`.
 * - `discord` (host `discord.com` / `discordapp.com` or their `ptb.` / `canary.` hosts, path
 *   `/api/webhooks/…` or `/api/v<N>/webhooks/…`): `{"content": <summary ≤ 2000 chars>,
 *   "allowed_mentions": {"parse": []}}`.
 * The summary is `<operation> <collection> \`at://<did>/<collection>/<rkey>\`` (the AT-URI in inline
 * code so rkey characters such as `_` or `~` are not read as markdown).
 *
 * A test delivery (operation `test`, SPEC §8.5) is the same request; the `webhook` preset adds
 * `X-Firehook-Test: 1`. Slack and Discord get their usual one-line summary, which then reads
 * ``test place.wisp.v2.wh `at://<owner>/place.wisp.v2.wh/<rkey>` ``: the owner sees the message
 * arrive in the channel, which is what a test of those destinations is for.
 *
 * Decision: Slack and Discord requests carry `Content-Type`, `User-Agent` and `Idempotency-Key` but no
 * signature and no `X-Firehook-*` headers: those receivers authenticate by the secret URL and ignore
 * extra headers, and their bodies are not the stored payload anyway.
 *
 * @since 0.1.0
 */
import { Context, Either, Layer } from "effect"
import type { OutboxOperation } from "../matching/OutboxStatus.js"
import { signatureHeaders } from "./Signer.js"

/** Everything a transform may read. */
export interface DeliveryInput {
  readonly deliveryId: string
  readonly eventId: string
  /** The stored canonical payload body (exact bytes as a string). */
  readonly body: string
  readonly event: {
    readonly did: string
    readonly collection: string
    readonly rkey: string
    /** `test`: an owner's test delivery (SPEC §8.5) */
    readonly operation: OutboxOperation
    readonly cid?: string
    readonly timestamp: string
  }
  readonly subscription: {
    readonly ownerDid: string
    readonly rkey: string
    readonly url: string
    readonly match: "direct" | "backlink"
  }
  /** The resolved signing secret, or undefined when the subscription has none. */
  readonly secret: string | undefined
  /** Unix seconds of this attempt. */
  readonly timestampSeconds: number
  /** e.g. `firehook/0.1.0`. */
  readonly userAgent: string
}

/** The request to send. `Content-Length` is computed by the transport. */
export interface OutgoingRequest {
  readonly url: string
  readonly method: "POST"
  readonly headers: Record<string, string>
  readonly body: string
  /** Which statuses count as delivered; default: 2xx. */
  readonly isSuccess?: (status: number) => boolean
}

/** A delivery-time transform. */
export type Transform = (input: DeliveryInput) => Either.Either<OutgoingRequest | null, "transform_failed">

/** Names of the built-in presets. */
export type PresetName = "webhook" | "slack" | "discord"

/** A destination entry supplied by an embedding program. */
export interface CustomDestination {
  readonly name: string
  readonly matches: (url: URL) => boolean
  readonly transform: Transform
}

/** The record collection of webhook declarations. */
export const WEBHOOK_COLLECTION = "place.wisp.v2.wh"
/** Discord's message content limit. */
export const DISCORD_CONTENT_MAX = 2000

const hostOf = (url: URL): string => url.hostname.toLowerCase().replace(/\.$/, "")

const DISCORD_HOSTS: ReadonlySet<string> = new Set([
  "discord.com",
  "discordapp.com",
  "ptb.discord.com",
  "canary.discord.com",
  "ptb.discordapp.com",
  "canary.discordapp.com"
])
const DISCORD_PATH = /^\/api\/(?:v\d+\/)?webhooks\//

/** Whether a URL is a Slack incoming webhook. */
export const isSlackUrl = (url: URL): boolean => hostOf(url) === "hooks.slack.com"

/** Whether a URL is a Discord webhook. */
export const isDiscordUrl = (url: URL): boolean => DISCORD_HOSTS.has(hostOf(url)) && DISCORD_PATH.test(url.pathname)

/** The built-in preset for a URL. */
export const selectPreset = (url: URL): PresetName =>
  isSlackUrl(url) ? "slack" : isDiscordUrl(url) ? "discord" : "webhook"

/** `at://<did>/<collection>/<rkey>` of the event's record. */
export const eventUri = (event: DeliveryInput["event"]): string => `at://${event.did}/${event.collection}/${event.rkey}`

/** `at://<owner>/place.wisp.v2.wh/<rkey>` of the webhook record. */
export const webhookUri = (subscription: DeliveryInput["subscription"]): string =>
  `at://${subscription.ownerDid}/${WEBHOOK_COLLECTION}/${subscription.rkey}`

/** One-line summary: ``create app.bsky.feed.post `at://did/app.bsky.feed.post/rkey` `` (backticks removed from fields). */
export const summarize = (input: DeliveryInput): string => {
  const clean = (s: string) => s.replace(/`/g, "'")
  return `${input.event.operation} ${clean(input.event.collection)} \`${clean(eventUri(input.event))}\``
}

const baseHeaders = (input: DeliveryInput): Record<string, string> => ({
  "Content-Type": "application/json",
  "User-Agent": input.userAgent,
  "Idempotency-Key": input.deliveryId
})

/** The default preset (SPEC §4.5): the stored body, signed when a secret is given. */
export const webhookPreset: Transform = (input) =>
  Either.right({
    url: input.subscription.url,
    method: "POST",
    headers: {
      ...baseHeaders(input),
      ...(input.secret === undefined
        ? {}
        : signatureHeaders({
          secret: input.secret,
          deliveryId: input.deliveryId,
          timestampSeconds: input.timestampSeconds,
          body: input.body
        })),
      "X-Firehook-Webhook": webhookUri(input.subscription),
      "X-Firehook-Match": input.subscription.match,
      ...(input.event.operation === "test" ? { "X-Firehook-Test": "1" } : {})
    },
    body: input.body
  })

/** Slack mrkdwn control characters. */
const slackEscape = (s: string): string => s.replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;")

/** Slack incoming webhook: `{"text": <summary>}` (with `&`, `<`, `>` escaped as Slack requires). */
export const slackPreset: Transform = (input) =>
  Either.right({
    url: input.subscription.url,
    method: "POST",
    headers: baseHeaders(input),
    body: JSON.stringify({ text: slackEscape(summarize(input)) })
  })

/** Truncates to at most `max` UTF-16 units without splitting a surrogate pair, marking the cut with `…`. */
const truncate = (s: string, max: number): string => {
  if (s.length <= max) return s
  let cut = max - 1
  const code = s.charCodeAt(cut - 1)
  if (code >= 0xd800 && code <= 0xdbff) cut -= 1
  return s.slice(0, cut) + "…"
}

/** Discord webhook: `{"content": <summary ≤ 2000>, "allowed_mentions": {"parse": []}}`. */
export const discordPreset: Transform = (input) =>
  Either.right({
    url: input.subscription.url,
    method: "POST",
    headers: baseHeaders(input),
    body: JSON.stringify({
      content: truncate(summarize(input), DISCORD_CONTENT_MAX),
      allowed_mentions: { parse: [] }
    })
  })

/** The built-in presets by name. */
export const presets: Readonly<Record<PresetName, Transform>> = {
  webhook: webhookPreset,
  slack: slackPreset,
  discord: discordPreset
}

/** Makes a custom transform total: a throw becomes `transform_failed`. */
const guard = (transform: Transform): Transform => (input) =>
  Either.flatMap(
    Either.try({ try: () => transform(input), catch: (): "transform_failed" => "transform_failed" }),
    (result) => result
  )

/**
 * A resolver over custom entries and the built-ins. Custom entries are checked first, in order. A custom
 * entry named like a built-in (`slack`, `discord`) removes that built-in; one named `webhook` also
 * replaces the fallback used for URLs no entry matches. Custom transforms that throw yield
 * `transform_failed`.
 */
export const makeResolver = (extra: ReadonlyArray<CustomDestination>): (url: URL) => Transform => {
  const names = new Set(extra.map((e) => e.name))
  const entries: ReadonlyArray<{ readonly matches: (url: URL) => boolean; readonly transform: Transform }> = [
    ...extra.map((e) => ({ matches: e.matches, transform: guard(e.transform) })),
    ...(names.has("slack") ? [] : [{ matches: isSlackUrl, transform: slackPreset }]),
    ...(names.has("discord") ? [] : [{ matches: isDiscordUrl, transform: discordPreset }])
  ]
  const custom = extra.find((e) => e.name === "webhook")
  const fallback = custom === undefined ? webhookPreset : guard(custom.transform)
  return (url) => {
    for (const entry of entries) {
      const hit = Either.try(() => entry.matches(url))
      if (Either.isRight(hit) && hit.right) return entry.transform
    }
    return fallback
  }
}

/** The `Destinations` service: URL → transform. */
export class Destinations extends Context.Tag("firehook/Destinations")<
  Destinations,
  { readonly resolve: (url: URL) => Transform }
>() {
  /** The built-in presets only. */
  static readonly layer: Layer.Layer<Destinations> = Layer.succeed(this, { resolve: makeResolver([]) })

  /** Built-ins plus custom entries (checked first). */
  static readonly layerWith = (extra: ReadonlyArray<CustomDestination>): Layer.Layer<Destinations> =>
    Layer.succeed(this, { resolve: makeResolver(extra) })
}

/** {@link Destinations.layer} at module level. */
export const layer = Destinations.layer
/** {@link Destinations.layerWith} at module level. */
export const layerWith = Destinations.layerWith
