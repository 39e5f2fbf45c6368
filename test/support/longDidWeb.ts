/** A canonical did:web of exactly `len` characters, distinct per `i` (path segments of `p`). */
export const longDidWeb = (i: number, len: number): string => {
  let did = `did:web:h${i}.example.com`
  // each round adds a segment of up to 61 characters: bounded by len / 2
  for (let n = 0; did.length < len && n < len; n++) did += ":" + "p".repeat(Math.min(60, len - did.length - 1))
  return did.slice(0, len)
}
