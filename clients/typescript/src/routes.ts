/**
 * The route table every client call goes through, and `surface()`, its machine-readable
 * form for the drift test against docs/api.yaml (tests/operator/sdk.rs).
 */
import { MODELS, type ModelInfo } from "./models.js";

export interface Route {
  readonly method: "GET" | "POST" | "DELETE";
  readonly path: string;
  readonly body?: ModelInfo;
  readonly query?: readonly string[];
  readonly headers?: readonly string[];
  readonly response?: ModelInfo;
  /** "admin" (admin or reviewer key), "none", or "token" (the whole token, /mcp). */
  readonly auth: "admin" | "none" | "token";
}

export const ROUTES = {
  issueToken: { method: "POST", path: "/v1/tokens", body: MODELS.IssueRequest, response: MODELS.Token, auth: "admin" },
  listTokens: { method: "GET", path: "/v1/tokens", response: MODELS.Token, auth: "admin" },
  showToken: { method: "GET", path: "/v1/tokens/{id}", response: MODELS.Token, auth: "admin" },
  revokeToken: { method: "DELETE", path: "/v1/tokens/{id}", response: MODELS.Token, auth: "admin" },
  discardToken: { method: "POST", path: "/v1/tokens/{id}/discard", response: MODELS.Token, auth: "admin" },
  listGoldens: { method: "GET", path: "/v1/goldens", response: MODELS.Golden, auth: "admin" },
  buildGolden: { method: "POST", path: "/v1/goldens", body: MODELS.GoldenBuild, response: MODELS.Golden, auth: "admin" },
  useGolden: { method: "POST", path: "/v1/goldens/{id}/use", response: MODELS.Golden, auth: "admin" },
  reap: { method: "POST", path: "/v1/reap", query: ["dry_run"], response: MODELS.ReapReport, auth: "admin" },
  statements: {
    method: "GET", path: "/v1/tokens/{id}/statements", query: ["after", "limit"], response: MODELS.Statement, auth: "admin",
  },
  diff: { method: "GET", path: "/v1/tokens/{id}/diff", query: ["format", "scan", "verify"], auth: "admin" },
  reviews: { method: "GET", path: "/v1/reviews", response: MODELS.ReviewSummary, auth: "admin" },
  review: { method: "GET", path: "/v1/tokens/{id}/review", response: MODELS.ReviewRecord, auth: "admin" },
  approve: { method: "POST", path: "/v1/tokens/{id}/approve", body: MODELS.Decision, response: MODELS.ReviewRecord, auth: "admin" },
  reject: { method: "POST", path: "/v1/tokens/{id}/reject", body: MODELS.Decision, response: MODELS.ReviewRecord, auth: "admin" },
  promote: {
    method: "POST", path: "/v1/tokens/{id}/promote", body: MODELS.PromoteRequest, response: MODELS.PromoteReport, auth: "admin",
  },
  metrics: { method: "GET", path: "/metrics", auth: "none" },
  healthz: { method: "GET", path: "/healthz", auth: "none" },
  mcp: { method: "POST", path: "/mcp", headers: ["MCP-Protocol-Version"], auth: "token" },
} as const satisfies Record<string, Route>;

export type RouteName = keyof typeof ROUTES;

/** Field names of a model, nested models' fields as `outer.inner` too. */
export function modelFields(m: ModelInfo | undefined, prefix = ""): string[] {
  if (!m) return [];
  const out: string[] = [];
  for (const f of m.fields) {
    out.push(prefix + f);
    const sub = m.nested?.[f];
    if (sub) out.push(...modelFields(sub, `${prefix}${f}.`));
  }
  return out;
}

export interface SurfaceEntry {
  name: string;
  method: string;
  path: string;
  request: string[];
  query: string[];
  headers: string[];
  response: string[];
}

/** Every route this SDK calls, with the request and response fields it knows. */
export function surface(): SurfaceEntry[] {
  return Object.entries(ROUTES).map(([name, r]: [string, Route]) => ({
    name,
    method: r.method,
    path: r.path,
    request: modelFields(r.body),
    query: [...(r.query ?? [])],
    headers: [...(r.headers ?? [])],
    response: modelFields(r.response),
  }));
}
