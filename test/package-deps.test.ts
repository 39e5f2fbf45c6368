/**
 * The package as an embedder installs it: `exports` points at the TypeScript sources, so a
 * TypeScript consumer's compiler checks firehook's `src` with the packages npm installs for a
 * dependent, the `dependencies` (never the `devDependencies`). Every package `src` imports must be
 * a dependency, and one that ships no types of its own needs its `@types/…` package among the
 * dependencies too (else `tsc` in the consumer fails: "Could not find a declaration file for module").
 */
import * as Fs from "node:fs"
import * as Path from "node:path"
import { describe, expect, it } from "vitest"

const root = Path.resolve(import.meta.dirname, "..")
const manifest = JSON.parse(Fs.readFileSync(Path.join(root, "package.json"), "utf8")) as {
  readonly dependencies: Record<string, string>
}

const sourceFiles = (dir: string): ReadonlyArray<string> =>
  Fs.readdirSync(dir, { withFileTypes: true }).flatMap((e) =>
    e.isDirectory()
      ? sourceFiles(Path.join(dir, e.name))
      : e.name.endsWith(".ts")
      ? [Path.join(dir, e.name)]
      : []
  )

/** The packages `src` imports (bare specifiers, without `node:` built-ins), by their package name. */
const importedPackages = (): ReadonlyArray<string> => {
  const names = new Set<string>()
  for (const file of sourceFiles(Path.join(root, "src"))) {
    const text = Fs.readFileSync(file, "utf8")
    const specifiers = [
      ...text.matchAll(/\bfrom\s+"([^"\n]+)"/g),
      ...text.matchAll(/^\s*import\s+"([^"\n]+)"/gm),
      ...text.matchAll(/\bimport\(\s*"([^"\n]+)"\s*\)/g)
    ].map((m) => m[1]!)
    for (const spec of specifiers) {
      if (spec.startsWith(".") || spec.startsWith("node:")) continue
      const parts = spec.split("/")
      names.add(spec.startsWith("@") ? `${parts[0]}/${parts[1]}` : parts[0]!)
    }
  }
  return [...names].sort()
}

/** The files a package's `exports["."]` (or `main`) names, where TypeScript looks for a sibling `.d.ts`. */
const entryFiles = (pkg: Record<string, unknown>): ReadonlyArray<string> => {
  const dot = typeof pkg.exports === "object" && pkg.exports !== null ? Reflect.get(pkg.exports, ".") : pkg.exports
  const targets = (v: unknown): ReadonlyArray<string> =>
    typeof v === "string" ? [v] : typeof v === "object" && v !== null ? Object.values(v).flatMap(targets) : []
  return [...targets(dot), ...(typeof pkg.main === "string" ? [pkg.main] : []), "index.js"]
}

/** Whether the installed package carries its own type declarations (as TypeScript finds them). */
const shipsTypes = (name: string): boolean => {
  const dir = Path.join(root, "node_modules", name)
  const pkg = JSON.parse(Fs.readFileSync(Path.join(dir, "package.json"), "utf8")) as Record<string, unknown>
  if (typeof pkg.types === "string" || typeof pkg.typings === "string") return true
  if (JSON.stringify(pkg.exports ?? null).includes("\"types\"")) return true
  return entryFiles(pkg).some((file) =>
    /\.(c|m)?js$/.test(file)
      ? Fs.existsSync(Path.join(dir, file.replace(/\.(c|m)?js$/, ".d.$1ts")))
      : Fs.existsSync(Path.join(dir, `${file}.d.ts`)) || Fs.existsSync(Path.join(dir, file, "index.d.ts"))
  )
}

const typesPackage = (name: string): string =>
  `@types/${name.startsWith("@") ? name.slice(1).replace("/", "__") : name}`

describe("package dependencies for embedders", () => {
  it("src imports only runtime dependencies", () => {
    const missing = importedPackages().filter((name) => manifest.dependencies[name] === undefined)
    expect(missing).toEqual([])
  })

  it("a dependency src imports without types of its own has its @types package among the dependencies", () => {
    const untyped = importedPackages().filter((name) => !shipsTypes(name))
    expect(untyped.filter((name) => manifest.dependencies[typesPackage(name)] === undefined)).toEqual([])
  })
})
