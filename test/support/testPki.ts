/**
 * Certificates for TLS tests, made with the `openssl` CLI into a new temporary directory: a CA and
 * leaf certificates signed by it, and a self-signed one. Every key is P-256; every certificate is
 * valid for two days. `remove` deletes the directory.
 */
import { execFileSync } from "node:child_process"
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import * as Path from "node:path"

export interface Pem {
  readonly keyPath: string
  readonly certPath: string
  readonly key: string
  readonly cert: string
}

export interface TestPki {
  readonly dir: string
  /** the CA's certificate (what NODE_EXTRA_CA_CERTS names to trust it) */
  readonly caPath: string
  /** a leaf signed by the CA, for the subjectAltName entries given (`DNS:localhost`, `IP:127.0.0.1`) */
  readonly signed: (name: string, altNames: ReadonlyArray<string>) => Pem
  /** a self-signed certificate (trusted by nobody) */
  readonly selfSigned: (name: string, altNames: ReadonlyArray<string>) => Pem
  readonly remove: () => void
}

const openssl = (args: ReadonlyArray<string>): void => {
  execFileSync("openssl", args, { stdio: "ignore", timeout: 30_000 })
}

const newKey = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]

export const makeTestPki = (prefix: string): TestPki => {
  const dir = mkdtempSync(Path.join(tmpdir(), `firehook-${prefix}-`))
  const at = (file: string) => Path.join(dir, file)
  const read = (name: string): Pem => ({
    keyPath: at(`${name}.key`),
    certPath: at(`${name}.pem`),
    key: readFileSync(at(`${name}.key`), "utf8"),
    cert: readFileSync(at(`${name}.pem`), "utf8")
  })
  const caPath = at("ca.pem")
  openssl([
    "req",
    "-x509",
    ...newKey,
    "-keyout",
    at("ca.key"),
    "-out",
    caPath,
    "-days",
    "2",
    "-subj",
    `/CN=firehook test CA ${prefix}`,
    "-addext",
    "basicConstraints=critical,CA:TRUE",
    "-addext",
    "keyUsage=critical,keyCertSign"
  ])
  let serial = 1
  const signed = (name: string, altNames: ReadonlyArray<string>): Pem => {
    openssl(["req", "-new", ...newKey, "-keyout", at(`${name}.key`), "-out", at(`${name}.csr`), "-subj", `/CN=${name}`])
    writeFileSync(
      at(`${name}.ext`),
      `subjectAltName=${altNames.join(",")}\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n`
    )
    openssl([
      "x509",
      "-req",
      "-in",
      at(`${name}.csr`),
      "-CA",
      caPath,
      "-CAkey",
      at("ca.key"),
      "-set_serial",
      String(serial++),
      "-days",
      "2",
      "-extfile",
      at(`${name}.ext`),
      "-out",
      at(`${name}.pem`)
    ])
    return read(name)
  }
  const selfSigned = (name: string, altNames: ReadonlyArray<string>): Pem => {
    openssl([
      "req",
      "-x509",
      ...newKey,
      "-keyout",
      at(`${name}.key`),
      "-out",
      at(`${name}.pem`),
      "-days",
      "2",
      "-subj",
      `/CN=${name}`,
      "-addext",
      `subjectAltName=${altNames.join(",")}`
    ])
    return read(name)
  }
  return { dir, caPath, signed, selfSigned, remove: () => rmSync(dir, { recursive: true, force: true }) }
}

/**
 * stderr's lines other than the runtime's own warning about `NODE_TLS_REJECT_UNAUTHORIZED` (which
 * Node and Bun print when it is set): what a child run with that variable must not print otherwise.
 */
export const stderrBesideTlsWarning = (stderr: string): ReadonlyArray<string> =>
  stderr.split("\n").filter((l) =>
    l.length > 0 && !l.includes("NODE_TLS_REJECT_UNAUTHORIZED") && !l.includes("--trace-warnings")
  )
