/**
 * A fake PostgreSQL server on 127.0.0.1 for the TLS tests of `DATABASE_URL`: it answers the
 * client's SSLRequest with `S` and upgrades the socket to TLS with the certificate it is given
 * (or answers `N` without one), then reads the startup message, asks for a clear-text password
 * and refuses it (`28P01`). It records what reached it, in the clear and inside TLS, so that a
 * test can tell whether the startup message or the password was ever sent.
 */
import * as Net from "node:net"
import * as Tls from "node:tls"

export interface FakePgState {
  /** TCP connections accepted */
  readonly accepted: number
  /** SSLRequests received (and answered `S`, or `N` without a certificate) */
  readonly sslRequests: number
  /** TLS handshakes that completed (the client accepted the certificate) */
  readonly handshakes: number
  /** TLS handshakes that failed on the server's side (the client refused the certificate, …) */
  readonly tlsErrors: number
  /** the SNI of each completed handshake (`""` when the client sent none) */
  readonly servernames: ReadonlyArray<string>
  /** startup messages received in the clear: their parameters (user, database, …) */
  readonly clearStartups: ReadonlyArray<Readonly<Record<string, string>>>
  /** startup messages received inside TLS: their parameters */
  readonly tlsStartups: ReadonlyArray<Readonly<Record<string, string>>>
  /** the passwords received (clear-text password messages, in the clear or inside TLS) */
  readonly passwords: ReadonlyArray<string>
  /** connections closed (TCP) */
  readonly closed: number
}

export interface FakePg {
  readonly port: number
  readonly state: () => FakePgState
  readonly close: () => Promise<void>
}

const SSL_REQUEST = 80877103
const PROTOCOL_3 = 196608

/** A backend message: its type byte, then its length (itself included) and the body. */
const message = (type: string, body: Buffer): Buffer => {
  const head = Buffer.alloc(5)
  head.write(type, 0, "latin1")
  head.writeInt32BE(body.length + 4, 1)
  return Buffer.concat([head, body])
}

const authCleartext = (): Buffer => {
  const body = Buffer.alloc(4)
  body.writeInt32BE(3, 0)
  return message("R", body)
}

const authFailed = (): Buffer =>
  message(
    "E",
    Buffer.from(
      ["SFATAL", "VFATAL", "C28P01", "Mpassword authentication failed (fake server)"].map((f) => `${f}\0`).join("") +
        "\0",
      "utf8"
    )
  )

/** The parameters of a startup message's body (after its length and protocol): `key\0value\0…\0`. */
const startupParams = (body: Buffer): Record<string, string> => {
  const parts = body.toString("utf8").split("\0")
  const out: Record<string, string> = {}
  for (let i = 0; i + 1 < parts.length; i += 2) {
    const key = parts[i] ?? ""
    if (key === "") break
    out[key] = parts[i + 1] ?? ""
  }
  return out
}

/**
 * Serve `stream` as a PostgreSQL connection after the SSL negotiation: a startup message (recorded
 * with `onStartup`), a password request, the password (recorded), then the refusal and the end.
 */
const serve = (
  stream: Net.Socket,
  first: Buffer,
  onStartup: (params: Record<string, string>) => void,
  onPassword: (password: string) => void
) => {
  let buf = first
  let startedUp = false
  const step = () => {
    while (true) {
      if (!startedUp) {
        if (buf.length < 8) return
        const length = buf.readInt32BE(0)
        if (buf.length < length) return
        if (buf.readInt32BE(4) !== PROTOCOL_3) return void stream.destroy()
        onStartup(startupParams(buf.subarray(8, length)))
        buf = buf.subarray(length)
        startedUp = true
        stream.write(authCleartext())
        continue
      }
      if (buf.length < 5) return
      const length = buf.readInt32BE(1)
      if (buf.length < length + 1) return
      if (buf.toString("latin1", 0, 1) === "p") onPassword(buf.toString("utf8", 5, length).replace(/\0$/, ""))
      buf = buf.subarray(length + 1)
      stream.end(authFailed())
      return
    }
  }
  stream.on("data", (d: Buffer) => {
    buf = Buffer.concat([buf, d])
    step()
  })
  step()
}

/** A fake PostgreSQL on 127.0.0.1 presenting `tls` (a key and certificate in PEM), or refusing TLS. */
export const fakePgTls = async (tls: { readonly key: string; readonly cert: string } | undefined): Promise<FakePg> => {
  let state: FakePgState = {
    accepted: 0,
    sslRequests: 0,
    handshakes: 0,
    tlsErrors: 0,
    servernames: [],
    clearStartups: [],
    tlsStartups: [],
    passwords: [],
    closed: 0
  }
  const bump = (f: (s: FakePgState) => FakePgState) => {
    state = f(state)
  }
  const sockets = new Set<Net.Socket>()
  const server = Net.createServer((socket) => {
    sockets.add(socket)
    bump((s) => ({ ...s, accepted: s.accepted + 1 }))
    socket.on("error", () => {})
    socket.on("close", () => {
      sockets.delete(socket)
      bump((s) => ({ ...s, closed: s.closed + 1 }))
    })
    let head = Buffer.alloc(0)
    const onHead = (d: Buffer) => {
      head = Buffer.concat([head, d])
      if (head.length < 8) return
      socket.off("data", onHead)
      const rest = head.subarray(8)
      if (head.readInt32BE(0) !== 8 || head.readInt32BE(4) !== SSL_REQUEST) {
        // a startup message in the clear (no SSLRequest first)
        return serve(
          socket,
          head,
          (p) => bump((s) => ({ ...s, clearStartups: [...s.clearStartups, p] })),
          (p) => bump((s) => ({ ...s, passwords: [...s.passwords, p] }))
        )
      }
      bump((s) => ({ ...s, sslRequests: s.sslRequests + 1 }))
      if (tls === undefined) {
        socket.write("N")
        return serve(
          socket,
          rest,
          (p) => bump((s) => ({ ...s, clearStartups: [...s.clearStartups, p] })),
          (p) => bump((s) => ({ ...s, passwords: [...s.passwords, p] }))
        )
      }
      socket.write("S")
      if (rest.length > 0) socket.unshift(rest)
      const secure = new Tls.TLSSocket(socket, { isServer: true, key: tls.key, cert: tls.cert })
      secure.on("error", () => bump((s) => ({ ...s, tlsErrors: s.tlsErrors + 1 })))
      secure.on("secure", () => {
        const name: unknown = Reflect.get(secure, "servername")
        bump((s) => ({
          ...s,
          handshakes: s.handshakes + 1,
          servernames: [...s.servernames, typeof name === "string" ? name : ""]
        }))
      })
      serve(
        secure,
        Buffer.alloc(0),
        (p) => bump((s) => ({ ...s, tlsStartups: [...s.tlsStartups, p] })),
        (p) => bump((s) => ({ ...s, passwords: [...s.passwords, p] }))
      )
    }
    socket.on("data", onHead)
  })
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve))
  const address = server.address()
  const port = typeof address === "object" && address !== null ? address.port : 0
  return {
    port,
    state: () => state,
    close: () =>
      new Promise<void>((resolve) => {
        for (const s of sockets) s.destroy()
        server.close(() => resolve())
      })
  }
}
