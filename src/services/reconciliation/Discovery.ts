/**
 * Relay discovery of owners (SPEC §5.2): the relay's `com.atproto.sync.listReposByCollection` for
 * `place.wisp.v2.wh`, paged (at most `maxPages` pages of `pageLimit` repos), every page's
 * canonical DIDs recorded as owners (`from_discovery`) as it arrives. A page that is not a 2xx, not
 * valid, too large, or whose cursor is empty, too long, seen before or not well-formed UTF-16 ends
 * discovery with a {@link DiscoveryFailure} (a reason only); a `StoreError` is the caller's. A
 * listing longer than `maxPages` pages ends there, `truncated` (each sweep starts from its first page).
 */
import { Data, Effect } from "effect"
import { isCanonicalDid } from "../../schemas/AtUri.js"
import { WH_COLLECTION } from "../../schemas/WhRecord.js"
import { decodeJsonBody, isWellFormedText, ReposByCollectionPage } from "../../schemas/Xrpc.js"
import { MAX_SERVICE_URL_LENGTH, type SafeHttpShape, type SafeResponse } from "../platform/http/SafeHttp.js"
import { USER_AGENT } from "../platform/Version.js"
import type { ReconcileStoreShape } from "./ReconcileStore.js"

export class DiscoveryFailure extends Data.TaggedError("DiscoveryFailure")<{ readonly reason: string }> {}

const MAX_CURSOR_LENGTH = 2048
const DISCOVERY_MAX_RESPONSE_BYTES = 1024 * 1024
const DISCOVERY_TIMEOUT_MS = 10_000

export interface DiscoveryOptions {
  /** pages per sweep */
  readonly maxPages: number
  /** repos per page */
  readonly pageLimit: number
}

export interface DiscoveryResult {
  readonly pages: number
  /** the relay had more pages than `maxPages` (its last answer named a next cursor) */
  readonly truncated: boolean
}

/** Page through the relay at `base`, recording the owners of every page. */
export const discoverPages = (
  http: SafeHttpShape,
  store: ReconcileStoreShape,
  base: string,
  options: DiscoveryOptions
) =>
  Effect.gen(function*() {
    const cursors = new Set<string>()
    let cursor: string | undefined = undefined
    for (let page = 0; page < options.maxPages; page++) {
      const url: string =
        `${base}/xrpc/com.atproto.sync.listReposByCollection?collection=${encodeURIComponent(WH_COLLECTION)}` +
        `&limit=${options.pageLimit}` +
        (cursor === undefined ? "" : `&cursor=${encodeURIComponent(cursor)}`)
      const res: SafeResponse = yield* http
        .request({
          url,
          method: "GET",
          headers: { accept: "application/json", "user-agent": USER_AGENT },
          timeoutMs: DISCOVERY_TIMEOUT_MS,
          maxResponseBytes: DISCOVERY_MAX_RESPONSE_BYTES,
          // a cursor of up to 2,048 characters, percent-encoded
          maxUrlLength: MAX_SERVICE_URL_LENGTH
        })
        .pipe(Effect.mapError((e) => new DiscoveryFailure({ reason: e.kind })))
      if (res.status < 200 || res.status > 299) return yield* new DiscoveryFailure({ reason: "status" })
      const body: ReposByCollectionPage | undefined = decodeJsonBody(ReposByCollectionPage, res.body)
      if (body === undefined || body.repos.length > options.pageLimit) {
        return yield* new DiscoveryFailure({ reason: "invalid" })
      }
      const dids = body.repos.map((r) => r.did).filter(isCanonicalDid)
      yield* store.addOwners(dids, "discovery")
      if (body.repos.length === 0 || body.cursor === undefined) {
        return { pages: page + 1, truncated: false } satisfies DiscoveryResult
      }
      const next: string = body.cursor
      // a lone surrogate cannot be put in the next URL (encodeURIComponent would throw)
      if (next.length === 0 || next.length > MAX_CURSOR_LENGTH || cursors.has(next) || !isWellFormedText(next)) {
        return yield* new DiscoveryFailure({ reason: "cursor" })
      }
      cursors.add(next)
      cursor = next
    }
    return { pages: options.maxPages, truncated: true } satisfies DiscoveryResult
  })
