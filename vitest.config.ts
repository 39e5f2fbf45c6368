import { defineConfig } from "vitest/config"

export default defineConfig({
  test: {
    include: ["test/**/*.test.ts"],
    globalSetup: ["test/support/globalSetup.ts"],
    testTimeout: 60_000,
    hookTimeout: 120_000,
    pool: "forks",
    // three forks on the 2-core machines the suite runs on: its files spend much of their time
    // waiting on child processes and PostgreSQL (docs/decisions.md, "How long the suite takes")
    poolOptions: { forks: { maxForks: 3, minForks: 1 } },
    reporters: ["default"]
  }
})
