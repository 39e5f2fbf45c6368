/**
 * firehook as a library: the services, layers and schemas an Effect program needs to embed it.
 */
export * as App from "./layers/App.js"
export * as Config from "./services/Config.js"
export * as Database from "./services/Database.js"
export * as EmbeddedPg from "./services/EmbeddedPg.js"
export * as Health from "./services/Health.js"
export * as Lifecycle from "./services/Lifecycle.js"
export * as Logging from "./services/Logging.js"
export * as Metrics from "./services/Metrics.js"
export * as Migrations from "./services/Migrations.js"
