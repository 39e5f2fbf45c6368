/**
 * The package version and the `User-Agent` every outgoing request carries (`firehook/<version>`).
 *
 * A literal, not an import of `package.json`: embedders' compilers check these sources with their
 * own options, and a JSON import needs `resolveJsonModule` and import attributes, which
 * `module`/`moduleResolution` `node16` refuses (README "Embedding"). test/embedding-sample.test.ts
 * keeps it equal to `package.json`'s `version`.
 */
export const VERSION: string = "0.1.0"
export const USER_AGENT = `firehook/${VERSION}`
