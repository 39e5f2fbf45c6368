/**
 * Encryption at rest for server-managed webhook secrets (SPEC §1.3).
 *
 * Envelope: `wse1.<keyId>.<nonce>.<ciphertext>.<tag>`, every part unpadded base64url.
 * - AES-256-GCM, 12-byte nonce, 16-byte tag, AAD = UTF-8 of `wse1.<keyId>`.
 * - `keyId` = first 16 chars of base64url(sha256(key)).
 * - A keyring holds one current key (used to seal) and at most 8 previous keys (open only), so keys
 *   rotate without downtime: set the new key as current, move the old one to previous, re-seal at leisure.
 *
 * Key format in configuration (decision): exactly 32 bytes written as
 * - 64 hexadecimal characters (either case), or
 * - base64 (standard alphabet) or base64url, with or without `=` padding (43 or 44 chars).
 * Surrounding whitespace is ignored; anything else is `invalid_key`. Generate one with
 * `openssl rand -base64 32`. The previous-keys variable is a comma-separated list in the same format.
 *
 * Every failure to open (bad format, unknown keyId, authentication failure, invalid UTF-8) is the one
 * generic {@link SecretUnavailable} value: it carries no detail, so nothing about the envelope, the
 * key or the plaintext can reach a log.
 *
 * @since 0.1.0
 */
import { Data, Either } from "effect"
import { createCipheriv, createDecipheriv, createHash, randomBytes } from "node:crypto"

/** Envelope version tag. */
export const ENVELOPE_VERSION = "wse1"
/** Key size in bytes (AES-256). */
export const KEY_BYTES = 32
/** GCM nonce size in bytes. */
export const NONCE_BYTES = 12
/** GCM tag size in bytes. */
export const TAG_BYTES = 16
/** Length of a key id. */
export const KEY_ID_LENGTH = 16
/** Hard limit on decrypt-only keys. */
export const MAX_PREVIOUS_KEYS = 8

/** The single, detail-free failure of this module. */
export class SecretUnavailable extends Data.TaggedError("SecretUnavailable")<{}> {
  override get message(): string {
    return "secret unavailable"
  }
}

/** Why a keyring could not be built. */
export type KeyringError = "invalid_key" | "too_many_previous_keys"

/** One key with its id. */
export interface KeyEntry {
  readonly id: string
  readonly key: Uint8Array
}

/** A current (sealing) key plus decrypt-only previous keys, indexed by key id. */
export interface Keyring {
  readonly current: KeyEntry | undefined
  readonly byId: ReadonlyMap<string, Uint8Array>
}

const encoder = new TextEncoder()
const B64URL = /^[A-Za-z0-9_-]*$/
const HEX64 = /^[0-9A-Fa-f]{64}$/
const B64_ANY = /^[A-Za-z0-9+/_-]{43}={0,1}$/

const toB64url = (bytes: Uint8Array): string => Buffer.from(bytes).toString("base64url")

const bytesOf = (buf: Buffer): Uint8Array => new Uint8Array(buf.buffer, buf.byteOffset, buf.byteLength)

/** Strict unpadded base64url decoding: rejects non-canonical encodings. */
const fromB64url = (s: string): Uint8Array | undefined => {
  if (!B64URL.test(s) || s.length % 4 === 1) return undefined
  const buf = Buffer.from(s, "base64url")
  return buf.toString("base64url") === s ? bytesOf(buf) : undefined
}

/** `keyId` = first 16 chars of base64url(sha256(key)). */
export const keyId = (key: Uint8Array): string =>
  createHash("sha256").update(key).digest("base64url").slice(0, KEY_ID_LENGTH)

/**
 * Parses a 32-byte key from configuration: 64 hex chars, or base64 / base64url (padding optional).
 */
export const parseKey = (s: string): Either.Either<Uint8Array, "invalid_key"> => {
  const t = s.trim()
  if (HEX64.test(t)) return Either.right(bytesOf(Buffer.from(t, "hex")))
  if (!B64_ANY.test(t)) return Either.left("invalid_key")
  // one alphabet or the other, never both
  if (/[+/]/.test(t) && /[_-]/.test(t)) return Either.left("invalid_key")
  const unpadded = t.endsWith("=") ? t.slice(0, -1) : t
  const bytes = fromB64url(unpadded.replace(/\+/g, "-").replace(/\//g, "_"))
  if (bytes !== undefined && bytes.length === KEY_BYTES) return Either.right(bytes)
  return Either.left("invalid_key")
}

/**
 * Parses a comma-separated key list (the previous-keys variable). Empty items are ignored.
 */
export const parseKeyList = (s: string): Either.Either<ReadonlyArray<Uint8Array>, "invalid_key"> => {
  const items = s.split(",").map((x) => x.trim()).filter((x) => x.length > 0)
  const out: Array<Uint8Array> = []
  for (const item of items) {
    const parsed = parseKey(item)
    if (Either.isLeft(parsed)) return Either.left("invalid_key")
    out.push(parsed.right)
  }
  return Either.right(out)
}

/**
 * Builds a keyring. `current` may be undefined (decrypt-only operation: {@link seal} then fails).
 * Every key must be 32 bytes; at most {@link MAX_PREVIOUS_KEYS} previous keys.
 * A previous key equal to the current one is harmless (ids are deduplicated).
 */
export const makeKeyring = (
  current: Uint8Array | undefined,
  previous: ReadonlyArray<Uint8Array>
): Either.Either<Keyring, KeyringError> => {
  if (previous.length > MAX_PREVIOUS_KEYS) return Either.left("too_many_previous_keys")
  const all = current === undefined ? previous : [current, ...previous]
  if (all.some((k) => k.length !== KEY_BYTES)) return Either.left("invalid_key")
  const byId = new Map<string, Uint8Array>()
  for (const k of all) {
    const id = keyId(k)
    if (!byId.has(id)) byId.set(id, Uint8Array.from(k))
  }
  const cur = current === undefined ? undefined : { id: keyId(current), key: Uint8Array.from(current) }
  return Either.right({ current: cur, byId })
}

/** An empty keyring: nothing seals, nothing opens. */
export const emptyKeyring: Keyring = { current: undefined, byId: new Map() }

const aadFor = (id: string): Uint8Array => encoder.encode(`${ENVELOPE_VERSION}.${id}`)

/**
 * Seals `plaintext` with the current key and the given 12-byte nonce. A nonce must never be reused
 * with the same key: production code uses {@link sealRandom}. Fails (generic) when the keyring has no
 * current key or the nonce has the wrong size.
 */
export const seal = (
  keyring: Keyring,
  plaintext: string,
  nonce: Uint8Array
): Either.Either<string, SecretUnavailable> => {
  const current = keyring.current
  if (current === undefined || nonce.length !== NONCE_BYTES) return Either.left(new SecretUnavailable())
  const cipher = createCipheriv("aes-256-gcm", current.key, nonce, { authTagLength: TAG_BYTES })
  cipher.setAAD(aadFor(current.id))
  const ciphertext = Buffer.concat([cipher.update(encoder.encode(plaintext)), cipher.final()])
  const tag = cipher.getAuthTag()
  return Either.right(
    [ENVELOPE_VERSION, current.id, toB64url(nonce), toB64url(ciphertext), toB64url(tag)].join(".")
  )
}

/** {@link seal} with a fresh random nonce from the operating system's CSPRNG. */
export const sealRandom = (keyring: Keyring, plaintext: string): Either.Either<string, SecretUnavailable> =>
  seal(keyring, plaintext, bytesOf(randomBytes(NONCE_BYTES)))

const strictUtf8 = new TextDecoder("utf-8", { fatal: true })

/**
 * Opens an envelope with whichever keyring key its keyId names. Every failure is the same
 * {@link SecretUnavailable}.
 */
export const open = (keyring: Keyring, envelope: string): Either.Either<string, SecretUnavailable> => {
  const parts = envelope.split(".")
  if (parts.length !== 5) return Either.left(new SecretUnavailable())
  const [version, id, nonceS, ctS, tagS] = parts as [string, string, string, string, string]
  if (version !== ENVELOPE_VERSION || id.length !== KEY_ID_LENGTH || !B64URL.test(id)) {
    return Either.left(new SecretUnavailable())
  }
  const key = keyring.byId.get(id)
  const nonce = fromB64url(nonceS)
  const ciphertext = fromB64url(ctS)
  const tag = fromB64url(tagS)
  if (
    key === undefined || nonce === undefined || ciphertext === undefined || tag === undefined ||
    nonce.length !== NONCE_BYTES || tag.length !== TAG_BYTES
  ) {
    return Either.left(new SecretUnavailable())
  }
  return Either.try({
    try: () => {
      const decipher = createDecipheriv("aes-256-gcm", key, nonce, { authTagLength: TAG_BYTES })
      decipher.setAAD(aadFor(id))
      decipher.setAuthTag(tag)
      const plain = Buffer.concat([decipher.update(ciphertext), decipher.final()])
      return strictUtf8.decode(plain)
    },
    catch: () => new SecretUnavailable()
  })
}

/** Token prefix of generated tokens (Standard Webhooks style). */
export const TOKEN_PREFIX = "whsec_"

/** A generated token from 32 given bytes: `whsec_` + base64 (standard, padded). */
export const tokenFromBytes = (bytes: Uint8Array): string => TOKEN_PREFIX + Buffer.from(bytes).toString("base64")

/** A fresh generated token: `whsec_` + base64 of 32 random bytes from the OS CSPRNG. */
export const generateToken = (): string => tokenFromBytes(bytesOf(randomBytes(32)))

/** Caller-supplied tokens: 32–256 printable ASCII characters (0x21–0x7e), so no whitespace. */
export const validateCallerToken = (s: string): boolean => {
  if (s.length < 32 || s.length > 256) return false
  for (let i = 0; i < s.length; i++) {
    const c = s.charCodeAt(i)
    if (c < 0x21 || c > 0x7e) return false
  }
  return true
}
