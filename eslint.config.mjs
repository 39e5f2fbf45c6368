// Lint and format (issue 13, "Conventions"). `npm run lint` checks, `npm run format` rewrites
// (eslint --fix applies the dprint formatting). Both run over src, test, bench, devnet, demo, scripts,
// bin and the root config files; `npm test` runs `npm run lint`, so CI checks them.
//
// Only syntactic rules: none needs type information, so a run parses each file once and stays fast
// (tsc already checks types and unused names in `npm run typecheck`).
import * as effectEslint from "@effect/eslint-plugin"
import tseslint from "typescript-eslint"

// Time and randomness come from Effect (Clock, Random, Schedule) in service code, so TestClock
// drives every retry and backoff test (ARCHITECTURE.md, "Conventions").
const effectTime = "time and randomness come from Effect in service code (Clock, Random, Schedule)"

export default [
  {
    ignores: ["**/node_modules/**", ".firehook/**", ".test-pg/**", "docs/**"]
  },
  // The dprint formatter as one eslint rule, plus the stylistic core rules it replaces turned off.
  ...effectEslint.configs.dprint,
  {
    files: ["**/*.ts", "**/*.mjs"],
    languageOptions: {
      parser: tseslint.parser,
      ecmaVersion: "latest",
      sourceType: "module"
    },
    plugins: {
      "@typescript-eslint": tseslint.plugin
    },
    linterOptions: {
      reportUnusedDisableDirectives: "error"
    },
    rules: {
      // The Effect repository's own dprint settings.
      "@effect/dprint": [
        "error",
        {
          config: {
            indentWidth: 2,
            lineWidth: 120,
            semiColons: "asi",
            quoteStyle: "alwaysDouble",
            trailingCommas: "never",
            operatorPosition: "maintain",
            "arrowFunction.useParentheses": "force"
          }
        }
      ],
      // No `@ts-ignore` / `@ts-nocheck`; `@ts-expect-error` only with a reason.
      "@typescript-eslint/ban-ts-comment": [
        "error",
        {
          "ts-expect-error": "allow-with-description",
          "ts-ignore": true,
          "ts-nocheck": true,
          "ts-check": false,
          minimumDescriptionLength: 10
        }
      ],
      // Correctness rules of eslint:recommended that tsc does not cover; all pass today.
      // (no-control-regex stays off: the control-character regexes in src reject them on purpose.)
      "no-async-promise-executor": "error",
      "no-cond-assign": "error",
      "no-constant-binary-expression": "error",
      "no-debugger": "error",
      "no-dupe-else-if": "error",
      "no-duplicate-case": "error",
      "no-loss-of-precision": "error",
      "no-self-assign": "error",
      "no-self-compare": "error",
      "no-sparse-arrays": "error",
      "no-template-curly-in-string": "error",
      "no-unsafe-finally": "error",
      "no-unsafe-optional-chaining": "error",
      "use-isnan": "error"
    }
  },
  {
    // A package index loads every module of the package: `@effect/platform-bun`'s its cluster,
    // socket, worker and key-value modules (about 0.1 s of CPU on every start of the CLI and the
    // service), `@effect/sql`'s its event journal and queue modules, `@effect/platform`'s all of
    // them, in every start and in every test file's fork (docs/decisions.md, "How long the suite
    // takes"). Import the module itself: `import * as SqlClient from "@effect/sql/SqlClient"`.
    files: ["**/*.ts", "**/*.mjs"],
    rules: {
      "no-restricted-imports": [
        "error",
        {
          paths: ["@effect/platform-bun", "@effect/platform-node", "@effect/platform", "@effect/sql", "@effect/sql-pg"]
            .map((name) => ({
              name,
              message: `import the module by its subpath (${name}/<Module>): the index loads them all`
            }))
        }
      ]
    }
  },
  {
    files: ["src/**/*.ts"],
    rules: {
      "@typescript-eslint/no-explicit-any": "error"
    }
  },
  {
    files: ["src/services/**/*.ts"],
    rules: {
      // Errors are values (Data.TaggedError / Schema.TaggedError); never `throw` in service code.
      "no-restricted-syntax": [
        "error",
        {
          selector: "ThrowStatement",
          message: "errors are values in service code: fail with a tagged error (Effect.fail), not throw"
        },
        {
          selector: "NewExpression[callee.name='Date'][arguments.length=0]",
          message: `new Date() reads the wall clock: ${effectTime}`
        }
      ],
      "no-restricted-globals": [
        "error",
        { name: "setTimeout", message: effectTime },
        { name: "setInterval", message: effectTime },
        { name: "setImmediate", message: effectTime }
      ],
      "no-restricted-properties": [
        "error",
        { object: "Date", property: "now", message: effectTime },
        { object: "Math", property: "random", message: effectTime },
        { object: "performance", property: "now", message: effectTime },
        { object: "globalThis", property: "setTimeout", message: effectTime },
        { object: "globalThis", property: "setInterval", message: effectTime }
      ]
    }
  }
]
