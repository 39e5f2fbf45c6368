/**
 * `firehook hooks tail --json` writes each decoded frame as one JSON line (src/cli/OwnerTail.ts,
 * src/cli/OwnerApiCommand.ts). `JSON.stringify` escapes C0 controls but not DEL or the C1 controls
 * (U+009B is CSI), so the service's free text, `#info`'s `message`, is made printable when the frame
 * is decoded, in both encodings: no frame handed on holds a control character, and no JSON line does.
 */
import { describe, expect, it } from "vitest"
import * as Tail from "../../src/cli/OwnerTail.js"
import { cborFrame } from "./owner-api-fake.js"

const CONTROL = /[\u0000-\u001f\u007f-\u009f]/
const INFO = `${Tail.NSID}#info`
/** CSI (C1) starting a colour, ESC (C0), BEL, DEL, NEL (C1), a newline */
const hostile = "slow \u009b31mreader\u001b[0m\u0007 \u007fdropped\u0085 some\nframes"

const frameOf = (d: Tail.Decoded): Tail.TailFrame => {
  if (d._tag !== "Frame") throw new Error(`not a frame: ${d._tag}`)
  return d.frame
}

describe("hooks tail: frames hold no control character", () => {
  it("#info's message, as a JSON text frame and as a binary frame: printable, the rest kept", () => {
    const decoded = [
      Tail.decodeFrame(JSON.stringify({ $type: INFO, name: "DeliveriesDropped", message: hostile, dropped: 3 })),
      Tail.decodeFrame(cborFrame({ op: 1, t: "#info" }, { name: "DeliveriesDropped", message: hostile, dropped: 3 }))
    ].map(frameOf)
    for (const frame of decoded) {
      const line = JSON.stringify(frame)
      expect(line).not.toMatch(CONTROL)
      expect(JSON.parse(line)).toEqual({
        $type: INFO,
        name: "DeliveriesDropped",
        message: "slow  31mreader [0m   dropped  some frames",
        dropped: 3
      })
    }
  })

  it("an #outcome frame is handed on as it came (its strings are tokens, keys and datetimes)", () => {
    const outcome = {
      id: "whd_v1_0002",
      rkey: "hook",
      event: "create",
      status: "dead_letter",
      httpStatus: 500,
      errorKind: "http_5xx",
      at: "2026-01-01T00:00:00.000Z"
    }
    expect(frameOf(Tail.decodeFrame(cborFrame({ op: 1, t: "#outcome" }, outcome)))).toEqual({
      $type: `${Tail.NSID}#outcome`,
      ...outcome
    })
    // a control character in one of them is no outcome at all
    expect(Tail.decodeFrame(cborFrame({ op: 1, t: "#outcome" }, { ...outcome, errorKind: "http\u009b5xx" }))._tag)
      .toBe("Invalid")
  })
})
