/**
 * The transport's keep-alive connection pools (SafeHttp): one `http` and one `https` agent.
 *
 * @since 0.1.0
 */
import * as Http from "node:http"
import * as Https from "node:https"
import { clampInt, DEFAULT_MAX_SOCKETS_PER_HOST, IDLE_SOCKET_TIMEOUT_MS, MAX_SOCKETS_PER_HOST_LIMIT } from "./Limits.js"
import type { SafeHttpOptions } from "./SafeHttp.js"

export interface Agents {
  readonly http: Http.Agent
  readonly https: Https.Agent
}

export const makeAgents = (options: SafeHttpOptions): Agents => {
  const maxSockets = clampInt(
    options.maxSocketsPerHost ?? DEFAULT_MAX_SOCKETS_PER_HOST,
    1,
    MAX_SOCKETS_PER_HOST_LIMIT,
    DEFAULT_MAX_SOCKETS_PER_HOST
  )
  const common = {
    keepAlive: true,
    keepAliveMsecs: 1_000,
    maxSockets,
    maxFreeSockets: maxSockets,
    scheduling: "lifo" as const,
    // applies to idle (pooled) sockets: Node destroys a free socket on timeout; an in-use socket only
    // emits 'timeout', which nothing here listens to (the request deadline is enforced by Effect)
    timeout: IDLE_SOCKET_TIMEOUT_MS
  }
  const ca = options.tls?.ca
  return {
    http: new Http.Agent(common),
    https: new Https.Agent({
      ...common,
      // explicit, so NODE_TLS_REJECT_UNAUTHORIZED=0 in the environment cannot turn verification off
      rejectUnauthorized: true,
      ...(ca !== undefined ? { ca } : {})
    })
  }
}
