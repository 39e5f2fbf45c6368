import { Either } from "effect"
import { describe, expect, it } from "vitest"
import { parseCidrs } from "../../src/schemas/Net.js"
import { type UrlErrorKind, validateWebhookUrl } from "../../src/schemas/WebhookUrl.js"

const PROD = { allowInsecureDev: false }
const DEV = { allowInsecureDev: true }

const kindOf = (input: unknown, opts = PROD): UrlErrorKind | "ok" =>
  Either.match(validateWebhookUrl(input, opts), { onLeft: (k) => k, onRight: () => "ok" as const })

describe("validateWebhookUrl: accepted", () => {
  it.each([
    "https://example.com/hook",
    "https://example.com",
    "https://EXAMPLE.com/Path?query=1&x=%20",
    "https://example.com:8443/hook",
    "https://sub.domain.example.co.uk/a/b/c",
    "https://8.8.8.8/hook",
    "https://1.1.1.1:443/",
    "https://[2606:4700:4700::1111]/hook",
    "https://[2001:4860:4860::8888]:8443/",
    "https://xn--nxasmq6b.com/",
    "https://bücher.example/",
    "https://example.com./hook",
    "https://localhost.example.com/",
    "https://metadata.google.internal.example.com/",
    // the blocked names are whole labels: a name that merely ends in the same letters is not one
    "https://notlocalhost/",
    "https://a.notlocalhost/",
    "https://xmetadata.google.internal/",
    "https://example.com/" + "a".repeat(2048 - "https://example.com/".length)
  ])("%s", (url) => {
    expect(kindOf(url)).toBe("ok")
  })

  it("returns the parsed URL", () => {
    const r = validateWebhookUrl("https://Example.COM:8443/x?y=1", PROD)
    expect(Either.isRight(r) && r.right.hostname).toBe("example.com")
    expect(Either.isRight(r) && r.right.port).toBe("8443")
    expect(Either.isRight(r) && r.right.href).toBe("https://example.com:8443/x?y=1")
  })
})

describe("validateWebhookUrl: error kinds", () => {
  it.each(
    [
      // not_string
      [undefined, "not_string"],
      [null, "not_string"],
      [42, "not_string"],
      [{ href: "https://example.com/" }, "not_string"],
      [new URL("https://example.com/"), "not_string"],
      [["https://example.com/"], "not_string"],
      // too_long
      ["https://example.com/" + "a".repeat(2049 - "https://example.com/".length), "too_long"],
      ["x".repeat(10_000), "too_long"],
      // unparseable
      ["", "unparseable"],
      ["example.com/hook", "unparseable"],
      ["/relative/path", "unparseable"],
      ["https://", "unparseable"],
      ["https://exa mple.com/", "unparseable"],
      [" https://example.com/", "unparseable"],
      ["https://example.com/ ", "unparseable"],
      ["https://exam\tple.com/", "unparseable"],
      ["https://example.com/\npath", "unparseable"],
      ["https://example.com/\u0000", "unparseable"],
      ["https://example.com/\u007f", "unparseable"],
      ["https://[::1/", "unparseable"],
      ["https://[fe80::1%25eth0]/", "unparseable"],
      ["https://1.2.3.4.5/", "unparseable"],
      ["https://999.1.1.1/", "unparseable"],
      ["https://foo.123/", "unparseable"],
      // no_host
      ["mailto:hooks@example.com", "no_host"],
      ["data:text/plain,hello", "no_host"],
      ["file:///etc/passwd", "no_host"],
      ["urn:isbn:0451450523", "no_host"],
      // a host of dots only is no host name (the transport has nothing to resolve)
      ["https://./", "no_host"],
      ["https://../hook", "no_host"],
      ["https://%2e/", "no_host"],
      ["https://%2E%2E./", "no_host"],
      ["https://。/", "no_host"],
      // credentials
      ["https://user:pass@example.com/", "credentials"],
      ["https://user@example.com/", "credentials"],
      ["https://:pass@example.com/", "credentials"],
      ["https://user:pass@127.0.0.1/", "credentials"],
      // fragment
      ["https://example.com/#frag", "fragment"],
      ["https://example.com/#", "fragment"],
      ["https://example.com#", "fragment"],
      ["https://example.com/path?q=1#", "fragment"],
      // scheme
      ["http://example.com/", "scheme"],
      ["ftp://example.com/", "scheme"],
      ["ws://example.com/", "scheme"],
      ["wss://example.com/", "scheme"],
      ["javascript://example.com/%0aalert(1)", "scheme"],
      ["gopher://example.com/", "scheme"],
      ["http://localhost/", "scheme"],
      ["http://127.0.0.1/", "scheme"],
      ["http://[::1]/", "scheme"],
      // blocked_host
      ["https://localhost/", "blocked_host"],
      ["https://LOCALHOST/", "blocked_host"],
      ["https://localhost./", "blocked_host"],
      ["https://localhost../", "blocked_host"],
      ["https://localhost:8443/", "blocked_host"],
      ["https://foo.localhost/", "blocked_host"],
      ["https://a.b.LocalHost./", "blocked_host"],
      ["https://metadata.google.internal/computeMetadata/v1/", "blocked_host"],
      ["https://METADATA.GOOGLE.INTERNAL/", "blocked_host"],
      ["https://metadata.google.internal./", "blocked_host"],
      // non_public_ip (the URL parser canonicalizes IPv4 numbers first)
      ["https://127.0.0.1/", "non_public_ip"],
      ["https://127.1/", "non_public_ip"],
      ["https://0x7f.1/", "non_public_ip"],
      ["https://0x7f000001/", "non_public_ip"],
      ["https://2130706433/", "non_public_ip"],
      ["https://017700000001/", "non_public_ip"],
      ["https://0/", "non_public_ip"],
      ["https://0.0.0.0/", "non_public_ip"],
      ["https://10.0.0.1/", "non_public_ip"],
      ["https://169.254.169.254/latest/meta-data/", "non_public_ip"],
      ["https://172.16.0.1/", "non_public_ip"],
      ["https://192.168.1.1/", "non_public_ip"],
      ["https://100.64.0.1/", "non_public_ip"],
      ["https://224.0.0.1/", "non_public_ip"],
      ["https://255.255.255.255/", "non_public_ip"],
      ["https://[::1]/", "non_public_ip"],
      ["https://[::]/", "non_public_ip"],
      ["https://[fe80::1]/", "non_public_ip"],
      ["https://[fd00::1]/", "non_public_ip"],
      ["https://[::ffff:127.0.0.1]/", "non_public_ip"],
      ["https://[::ffff:8.8.8.8]/", "non_public_ip"],
      ["https://[::ffff:7f00:1]/", "non_public_ip"],
      ["https://[::7f00:1]/", "non_public_ip"],
      ["https://[::127.0.0.1]/", "non_public_ip"],
      ["https://[64:ff9b::7f00:1]/", "non_public_ip"],
      ["https://[2001:db8::1]/", "non_public_ip"],
      ["https://[2002:7f00:1::1]/", "non_public_ip"]
    ] as const
  )("%j → %s", (input, expected) => {
    expect(kindOf(input)).toBe(expected)
  })
})

describe("validateWebhookUrl: insecure development mode", () => {
  it.each([
    "http://localhost/",
    "http://localhost:3000/hook",
    "http://LOCALHOST./x",
    "http://127.0.0.1:8080/",
    "http://127.5.6.7/",
    "http://127.1/",
    "http://[::1]:8080/",
    "https://localhost/",
    "https://127.0.0.1/",
    "https://[::1]/"
  ])("allows loopback %s", (url) => {
    expect(kindOf(url, DEV)).toBe("ok")
  })

  it.each(
    [
      ["http://example.com/", "scheme"],
      ["http://10.0.0.1/", "scheme"],
      ["http://192.168.1.1/", "scheme"],
      ["http://foo.localhost/", "scheme"],
      ["http://[::ffff:127.0.0.1]/", "scheme"],
      ["http://0.0.0.0/", "scheme"],
      ["https://foo.localhost/", "blocked_host"],
      ["https://10.0.0.1/", "non_public_ip"],
      ["https://[::ffff:127.0.0.1]/", "non_public_ip"],
      ["http://user:pw@localhost/", "credentials"],
      ["http://localhost/#x", "fragment"],
      ["ftp://localhost/", "scheme"]
    ] as const
  )("still rejects %s → %s", (url, expected) => {
    expect(kindOf(url, DEV)).toBe(expected)
  })

  it("is off by default: the same loopback URLs are rejected in production mode", () => {
    expect(kindOf("http://localhost:3000/hook")).toBe("scheme")
    expect(kindOf("http://127.0.0.1/")).toBe("scheme")
    expect(kindOf("https://127.0.0.1/")).toBe("non_public_ip")
  })
})

describe("validateWebhookUrl: the operator's allow-list (DELIVERY_ALLOW_CIDRS, SPEC §4.6)", () => {
  const ALLOWED = { allowInsecureDev: false, allowCidrs: parseCidrs(["10.0.0.0/8", "fd00::/8"]) }

  it.each(["https://10.0.0.5/hook", "https://10.255.1.2:8443/x", "https://[fd00::5]/hook"])(
    "an https: literal inside a block is accepted: %s",
    (url) => {
      expect(kindOf(url, ALLOWED)).toBe("ok")
      expect(kindOf(url)).toBe("non_public_ip")
    }
  )

  it.each(
    [
      ["https://192.168.1.1/", "non_public_ip"],
      ["https://127.0.0.1/", "non_public_ip"],
      ["https://[::ffff:10.0.0.5]/", "non_public_ip"],
      ["http://10.0.0.5/", "scheme"],
      ["https://localhost/", "blocked_host"]
    ] as const
  )("anything else keeps its rule: %s → %s", (url, expected) => {
    expect(kindOf(url, ALLOWED)).toBe(expected)
  })
})

describe("validateWebhookUrl: errors never carry the URL", () => {
  it("the left value is a bare kind", () => {
    const r = validateWebhookUrl("https://user:supersecret@example.com/", PROD)
    expect(r).toEqual(Either.left("credentials"))
    expect(JSON.stringify(r)).not.toContain("supersecret")
  })
})
