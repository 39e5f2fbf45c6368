/**
 * The transport's named limits (SafeHttp), and the clamp that applies them to caller values.
 *
 * @since 0.1.0
 */

// ---------------------------------------------------------------------------------------------
// Limits

/** Default request body bound (SPEC §4.5: request body ≤ 512 KiB). */
export const DEFAULT_MAX_REQUEST_BYTES = 512 * 1024

/** Default keep-alive sockets per destination (address + port [+ TLS name]). */
export const DEFAULT_MAX_SOCKETS_PER_HOST = 64

/** Upper bound accepted for `maxSocketsPerHost`. */
export const MAX_SOCKETS_PER_HOST_LIMIT = 4096

/** Total bytes of request header names and values a caller may add (Host/Content-Length excluded). */
export const MAX_REQUEST_HEADER_BYTES = 64 * 1024

/**
 * An idle keep-alive socket is closed after this long. Below the 5 s keep-alive timeout of Node's
 * HTTP server (the most common short one) so we rarely write into a socket the server is closing.
 */
export const IDLE_SOCKET_TIMEOUT_MS = 4_000

/** At most this many distinct addresses of one name are tried (all answers are still validated). */
export const MAX_CONNECT_ADDRESSES = 16

/** Largest overall deadline accepted for one request (a larger `timeoutMs` is clamped). */
export const MAX_TIMEOUT_MS = 5 * 60 * 1000

/**
 * Longest request URL accepted from a caller that raises `maxUrlLength` (PDS, PLC, did:web and relay
 * calls): a cursor of up to 2,048 characters (SPEC §5.3), percent-encoded (up to 6,144), after an
 * endpoint, a did:plc and the other parameters, fits. 8 KiB is also what common servers accept in a
 * request line (a longer one would be a 414 or 431 anyway). Webhook URLs keep their 2,048 (SPEC §1).
 */
export const MAX_SERVICE_URL_LENGTH = 8 * 1024

/** URL plans (`planTarget` results) memoised per transport. */
export const PLAN_CACHE_MAX = 4096

/** At most this many operator allow-list entries (`parseAllowCidrs`). */
export const MAX_ALLOW_CIDRS = 256

/** `n` as an integer in [min, max]; `def` when it is not finite. */
export const clampInt = (n: number, min: number, max: number, def: number): number =>
  Number.isFinite(n) ? Math.min(Math.max(Math.floor(n), min), max) : def
