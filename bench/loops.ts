/**
 * The bare request loops the delivery benchmarks compare against: a plain node:http keep-alive
 * loop and a plain `fetch` loop, `concurrency` requests in flight, posting a body of `bodyBytes` to
 * the given receivers on 127.0.0.1. Each returns requests/s and this process's CPU per request
 * (every thread of it: receivers running in a worker thread of the same process are included).
 */
import * as Http from "node:http"

/** A loop's requests/s and the process CPU per request. */
export type Loop = { readonly rate: number; readonly cpuMs: number }

export interface LoopOptions {
  readonly ports: ReadonlyArray<number>
  readonly requests: number
  readonly bodyBytes: number
  readonly concurrency: number
  /** paths are `/h/<i mod paths>` */
  readonly paths: number
}

const timed = (requests: number, body: () => Promise<void>): Promise<Loop> => {
  const cpu0 = process.cpuUsage()
  const t0 = performance.now()
  return body().then(() => {
    const cpu = process.cpuUsage(cpu0)
    return { rate: requests / ((performance.now() - t0) / 1000), cpuMs: (cpu.user + cpu.system) / 1000 / requests }
  })
}

/** node:http with a keep-alive agent (what SafeHttp is built on). */
export const bareHttpLoop = (o: LoopOptions): Promise<Loop> =>
  timed(o.requests, () =>
    new Promise<void>((resolve) => {
      const agent = new Http.Agent({ keepAlive: true, maxSockets: o.concurrency })
      const body = Buffer.alloc(o.bodyBytes, 0x61)
      let started = 0
      let done = 0
      const one = (): void => {
        if (started >= o.requests) return
        const i = started++
        const req = Http.request(
          {
            agent,
            host: "127.0.0.1",
            port: o.ports[i % o.ports.length],
            method: "POST",
            path: `/h/${i % o.paths}`,
            headers: { "content-type": "application/json", "content-length": body.length }
          },
          (res) => {
            res.resume()
            res.on("end", () => {
              done++
              if (done === o.requests) {
                agent.destroy()
                resolve()
              } else one()
            })
          }
        )
        req.on("error", () => {
          done++
          if (done === o.requests) {
            agent.destroy()
            resolve()
          } else one()
        })
        req.end(body)
      }
      for (let k = 0; k < o.concurrency; k++) one()
    }))

/** The runtime's `fetch`, same concurrency, bodies and receivers. */
export const fetchLoop = (o: LoopOptions): Promise<Loop> => {
  const body = "a".repeat(o.bodyBytes)
  let started = 0
  const lane = async (): Promise<void> => {
    while (started < o.requests) {
      const i = started++
      try {
        const res = await fetch(`http://127.0.0.1:${o.ports[i % o.ports.length]}/h/${i % o.paths}`, {
          method: "POST",
          headers: { "content-type": "application/json" },
          body
        })
        await res.arrayBuffer()
      } catch {
        // counted like the http loop: an error ends that request
      }
    }
  }
  return timed(o.requests, () => Promise.all(Array.from({ length: o.concurrency }, lane)).then(() => undefined))
}
