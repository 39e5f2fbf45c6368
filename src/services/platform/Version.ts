/** The package version and the `User-Agent` every outgoing request carries (`firehook/<version>`). */
import packageJson from "../../../package.json" with { type: "json" }

export const VERSION: string = packageJson.version
export const USER_AGENT = `firehook/${VERSION}`
