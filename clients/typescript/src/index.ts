/**
 * sandpit harness SDK: a throwaway Postgres database per agent task through the gateway's
 * control API (docs/api.yaml). `withTask` / `Sandpit`, `runSqlTool`, typed models, error
 * classes; `surface()` lists every route and field this SDK implements.
 */
export { Sandpit, withTask, tokenFromDsn, DEFAULT_API } from "./client.js";
export type { SandpitOptions, Task, TaskOptions } from "./client.js";
export {
  SandpitError,
  BadRequestError,
  UnauthorizedError,
  ForbiddenError,
  NotFoundError,
  ConflictError,
  ServerError,
  SandpitConnectionError,
} from "./errors.js";
export type * from "./models.js";
export { MODELS } from "./models.js";
export { ROUTES, surface } from "./routes.js";
export type { Route, RouteName, SurfaceEntry } from "./routes.js";
export { runSqlTool, NAME as RUN_SQL_NAME, DESCRIPTION as RUN_SQL_DESCRIPTION } from "./tool.js";
export type { SqlTool, JsonSchema } from "./tool.js";
