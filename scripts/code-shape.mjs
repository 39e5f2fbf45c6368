#!/usr/bin/env node
/**
 * The shape of the source tree, as ARCHITECTURE.md bounds it: files over 600 lines, functions over
 * 250 lines, and closures nested inside another function over 80 lines (a function's lines are the
 * whole node, its `Effect.gen` body included). `node scripts/code-shape.mjs [dir]` prints the
 * largest of each and exits 1 when a bound is broken (`--report` prints without failing).
 */
import fs from "node:fs"
import path from "node:path"
import ts from "typescript"

const args = process.argv.slice(2)
const report = args.includes("--report")
const dir = args.find((a) => !a.startsWith("--")) ?? "src"
const LIMITS = { file: 600, fn: 250, nested: 80 }

const walk = (d) =>
  fs.readdirSync(d, { withFileTypes: true }).flatMap((e) => {
    const p = path.join(d, e.name)
    return e.isDirectory() ? walk(p) : /\.tsx?$/.test(e.name) ? [p] : []
  })

const isFn = (n) =>
  ts.isFunctionDeclaration(n) || ts.isFunctionExpression(n) || ts.isArrowFunction(n) || ts.isMethodDeclaration(n) ||
  ts.isGetAccessorDeclaration(n) || ts.isSetAccessorDeclaration(n) || ts.isConstructorDeclaration(n)

const nameOf = (n) => {
  if (n.name && ts.isIdentifier(n.name)) return n.name.text
  const p = n.parent
  if (p && ts.isVariableDeclaration(p) && ts.isIdentifier(p.name)) return p.name.text
  if (p && ts.isPropertyAssignment(p) && (ts.isIdentifier(p.name) || ts.isStringLiteral(p.name))) return p.name.text
  if (p && ts.isCallExpression(p)) {
    // Effect.gen(function* () {…}) / Effect.fn("name")(function* …): name it after its holder
    let q = p
    while (q.parent && (ts.isCallExpression(q.parent) || ts.isParenthesizedExpression(q.parent))) q = q.parent
    const h = q.parent
    if (h && ts.isVariableDeclaration(h) && ts.isIdentifier(h.name)) return `${h.name.text} (body)`
    if (h && ts.isPropertyAssignment(h) && ts.isIdentifier(h.name)) return `${h.name.text} (body)`
    return `<callback of ${p.expression.getText().slice(0, 40)}>`
  }
  return "<anonymous>"
}

/** Climb from a function through the call chain it is an argument of (`Effect.gen(…).pipe(…)`). */
const holderOf = (fn) => {
  let q = fn
  while (
    q.parent && (ts.isCallExpression(q.parent) || ts.isPropertyAccessExpression(q.parent) ||
      ts.isParenthesizedExpression(q.parent) || ts.isAsExpression(q.parent))
  ) q = q.parent
  return q === fn ? undefined : { top: q, holder: q.parent }
}

/**
 * A generator passed to `Effect.gen`/`Effect.fn` that is what a function returns (its arrow body or
 * a `return` directly in its block) is that function's own body, not a closure of its own: it is
 * counted once, as the enclosing function (whose lines include it). One that initializes a `const`
 * is the function of that name.
 */
const bodyKind = (fn) => {
  if (!(ts.isFunctionExpression(fn) && fn.asteriskToken)) return undefined
  const h = holderOf(fn)
  if (!h || !h.holder) return undefined
  if (ts.isArrowFunction(h.holder) && h.holder.body === h.top) return "own"
  if (
    ts.isReturnStatement(h.holder) && h.holder.parent && ts.isBlock(h.holder.parent) && h.holder.parent.parent &&
    isFn(h.holder.parent.parent)
  ) return "own"
  if (ts.isVariableDeclaration(h.holder) && ts.isIdentifier(h.holder.name)) return "named"
  if (ts.isPropertyAssignment(h.holder) && ts.isIdentifier(h.holder.name)) return "named"
  return undefined
}

const files = []
const fns = []
for (const file of walk(dir)) {
  const text = fs.readFileSync(file, "utf8")
  const sf = ts.createSourceFile(file, text, ts.ScriptTarget.Latest, true)
  files.push({ file, lines: text.split("\n").length - (text.endsWith("\n") ? 1 : 0) })
  const visit = (node, depth) => {
    let d = depth
    if (isFn(node)) {
      const kind = bodyKind(node)
      if (kind === "own") {
        d = depth // already inside its function
      } else {
        const start = sf.getLineAndCharacterOfPosition(node.getStart(sf)).line
        const end = sf.getLineAndCharacterOfPosition(node.getEnd()).line
        const name = kind === "named" ? holderOf(node).holder.name.text : nameOf(node)
        fns.push({ file, line: start + 1, name, lines: end - start + 1, nested: depth > 0 })
        d = depth + 1
      }
    }
    ts.forEachChild(node, (c) => visit(c, d))
  }
  visit(sf, 0)
}

const top = (list, n) => [...list].sort((a, b) => b.lines - a.lines).slice(0, n)
const rel = (f) => path.relative(process.cwd(), f)
const bigFiles = files.filter((f) => f.lines > LIMITS.file)
const bigFns = fns.filter((f) => f.lines > LIMITS.fn)
const nested = fns.filter((f) => f.nested)
const bigNested = nested.filter((f) => f.lines > LIMITS.nested)
console.log(`files: ${files.length}, largest:`)
for (const f of top(files, 5)) console.log(`  ${f.lines}\t${rel(f.file)}`)
console.log(`functions: ${fns.length}, largest:`)
for (const f of top(fns, 5)) console.log(`  ${f.lines}\t${rel(f.file)}:${f.line} ${f.name}`)
console.log("nested closures, largest:")
for (const f of top(nested, 5)) console.log(`  ${f.lines}\t${rel(f.file)}:${f.line} ${f.name}`)
const broken = [
  ...bigFiles.map((f) => `file ${rel(f.file)}: ${f.lines} lines > ${LIMITS.file}`),
  ...bigFns.map((f) => `function ${rel(f.file)}:${f.line} ${f.name}: ${f.lines} lines > ${LIMITS.fn}`),
  ...bigNested.map((f) => `nested closure ${rel(f.file)}:${f.line} ${f.name}: ${f.lines} lines > ${LIMITS.nested}`)
]
for (const b of broken) console.log(`over: ${b}`)
console.log(broken.length === 0 ? "shape: within bounds" : `shape: ${broken.length} over the bounds`)
process.exit(broken.length > 0 && !report ? 1 : 0)
