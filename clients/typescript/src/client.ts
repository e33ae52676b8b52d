/**
 * `Sandpit`, the client of the control API over global fetch, and `withTask`, which issues a
 * token for one agent task and revokes it however the task's function ends.
 */
import { errorFor, NotFoundError, SandpitError } from "./errors.js";
import type * as M from "./models.js";
import { ROUTES, type Route, type RouteName } from "./routes.js";

declare const process: { env: Record<string, string | undefined> };

export const DEFAULT_API = "http://127.0.0.1:6433";

export interface SandpitOptions {
  /** Base URL; default `SANDPIT_API`, else http://127.0.0.1:6433. */
  api?: string;
  /** Admin (or reviewer) key; default `SANDPIT_ADMIN_KEY`. */
  adminKey?: string;
}

/** Options of `withTask` / `Sandpit.task`: the token's caps and metadata. */
export interface TaskOptions {
  ttl?: number;
  maxRows?: number;
  maxBytes?: number;
  maxConnections?: number;
  capMode?: M.CapMode;
  allow?: M.StatementKind[];
  statementTimeoutMs?: number;
  idleInTransactionTimeoutMs?: number;
  superuser?: boolean;
  meta?: Record<string, string>;
}

/** What the task's function gets: the token, and its DSN (a credential: keep it from the model). */
export interface Task {
  id: string;
  dsn: string;
  token: M.Token;
}

interface CallOptions {
  id?: string;
  body?: unknown;
  query?: Record<string, string | number | boolean | undefined>;
  headers?: Record<string, string>;
  bearer?: string;
}

/** The whole token `<id>.<secret>` of a DSN (its user and password joined by a dot). */
export function tokenFromDsn(dsn: string): string {
  const u = new URL(dsn);
  if (!u.username || !u.password) throw new Error("not a sandpit DSN: no user and password");
  return `${decodeURIComponent(u.username)}.${decodeURIComponent(u.password)}`;
}

export class Sandpit {
  readonly api: string;
  readonly adminKey: string;

  constructor(opts: SandpitOptions = {}) {
    this.api = (opts.api ?? process.env.SANDPIT_API ?? DEFAULT_API).replace(/\/+$/, "");
    this.adminKey = opts.adminKey ?? process.env.SANDPIT_ADMIN_KEY ?? "";
  }

  /** One request along `ROUTES[name]`; throws a `SandpitError` subclass on 4xx/5xx. */
  async call(name: RouteName, o: CallOptions = {}): Promise<{ status: number; headers: Headers; body: unknown }> {
    const r: Route = ROUTES[name];
    let path = r.path;
    if (path.includes("{id}")) {
      if (!o.id) throw new TypeError(`${name} needs an id`);
      path = path.replace("{id}", encodeURIComponent(o.id));
    }
    const q = new URLSearchParams();
    for (const [k, v] of Object.entries(o.query ?? {})) {
      if (v === undefined) continue;
      if (!(r.query ?? []).includes(k)) throw new TypeError(`${name}: unknown query parameter ${k}`);
      q.set(k, String(v));
    }
    const url = this.api + path + (q.size ? `?${q}` : "");
    const headers: Record<string, string> = { ...(o.headers ?? {}) };
    if (r.auth === "admin") headers.Authorization = `Bearer ${this.adminKey}`;
    if (r.auth === "token" && o.bearer) headers.Authorization = `Bearer ${o.bearer}`;
    if (o.body !== undefined) headers["Content-Type"] = "application/json";
    let res: Response;
    try {
      res = await fetch(url, {
        method: r.method,
        headers,
        body: o.body === undefined ? undefined : JSON.stringify(o.body),
      });
    } catch (e) {
      throw errorFor(0, String((e as Error).cause ?? e), r.method, path);
    }
    const text = await res.text();
    const isJson = (res.headers.get("content-type") ?? "").includes("json");
    let body: unknown = text;
    if (isJson && text) {
      try {
        body = JSON.parse(text);
      } catch {
        body = text;
      }
    }
    if (!res.ok) {
      const msg = (body as { error?: unknown } | null)?.error;
      throw errorFor(res.status, typeof msg === "string" ? msg : text.trim() || res.statusText, r.method, path);
    }
    return { status: res.status, headers: res.headers, body };
  }

  private async json<T>(name: RouteName, o: CallOptions = {}): Promise<T> {
    return (await this.call(name, o)).body as T;
  }

  issue(req: M.IssueRequest): Promise<M.Token> {
    return this.json("issueToken", { body: req });
  }
  tokens(): Promise<M.Token[]> {
    return this.json("listTokens");
  }
  token(id: string): Promise<M.Token> {
    return this.json("showToken", { id });
  }
  /** Ends the token's sessions and destroys its scratch database; the log is kept. */
  revoke(id: string): Promise<M.Token> {
    return this.json("revokeToken", { id });
  }

  /** Destroys an ended token's scratch data whose review keeps failing (no review). */
  discard(id: string): Promise<M.Token> {
    return this.json("discardToken", { id });
  }

  /** Issues a token for `name`, runs `fn` with it, revokes it in `finally`. */
  async task<T>(name: string, fn: (task: Task) => Promise<T> | T, opts: TaskOptions = {}): Promise<T> {
    const token = await this.issue(issueRequest(name, opts));
    if (!token.dsn) throw new SandpitError(0, "the gateway returned no DSN");
    try {
      return await fn({ id: token.id, dsn: token.dsn, token });
    } finally {
      await this.revoke(token.id).catch((e: unknown) => {
        // Already ended is fine; any other failure must not hide the task's own error.
        if (!(e instanceof NotFoundError)) console.error(`sandpit: revoking ${token.id} failed: ${e}`);
      });
    }
  }

  goldens(): Promise<M.Golden[]> {
    return this.json("listGoldens");
  }
  buildGolden(req: M.GoldenBuild): Promise<M.Golden> {
    return this.json("buildGolden", { body: req });
  }
  useGolden(id: string): Promise<M.Golden> {
    return this.json("useGolden", { id });
  }
  reap(opts: { dryRun?: boolean } = {}): Promise<M.ReapReport> {
    return this.json("reap", { query: { dry_run: opts.dryRun ?? false } });
  }

  /** One page of the statement log and the `after` of the next page (undefined: last page). */
  async statementsPage(id: string, after = 0, limit?: number): Promise<{ statements: M.Statement[]; next?: number }> {
    const r = await this.call("statements", { id, query: { after, limit } });
    const next = r.headers.get("sandpit-next-after");
    return { statements: r.body as M.Statement[], next: next ? Number(next) : undefined };
  }
  /** The whole statement log of a token, page by page. */
  async statements(id: string): Promise<M.Statement[]> {
    const out: M.Statement[] = [];
    let after: number | undefined = 0;
    while (after !== undefined) {
      const page: { statements: M.Statement[]; next?: number } = await this.statementsPage(id, after);
      out.push(...page.statements);
      after = page.next;
    }
    return out;
  }
  /** The token's review (diff against the golden): an object for json, else text. */
  diff(
    id: string,
    opts: { format?: "json" | "text" | "sql" | "html"; scan?: "touched" | "all"; verify?: boolean } = {},
  ): Promise<unknown> {
    return this.json("diff", { id, query: { format: opts.format ?? "json", scan: opts.scan, verify: opts.verify } });
  }
  reviews(): Promise<M.ReviewSummary[]> {
    return this.json("reviews");
  }
  review(id: string): Promise<M.ReviewRecord> {
    return this.json("review", { id });
  }
  approve(id: string, comment?: string): Promise<M.ReviewRecord> {
    return this.json("approve", { id, body: { comment } satisfies M.Decision });
  }
  reject(id: string, comment: string): Promise<M.ReviewRecord> {
    return this.json("reject", { id, body: { comment } satisfies M.Decision });
  }
  /** Applies the approved change to a named target (or a DSN, admin key only); `dryRun` commits nothing. */
  promote(id: string, opts: { target?: string; dsn?: string; role?: string; dryRun?: boolean } = {}): Promise<M.PromoteReport> {
    const body: M.PromoteRequest = { target: opts.target, dsn: opts.dsn, role: opts.role, dry_run: opts.dryRun ?? false };
    return this.json("promote", { id, body });
  }

  async healthz(): Promise<string> {
    return String((await this.call("healthz")).body);
  }
  async metrics(): Promise<string> {
    return String((await this.call("metrics")).body);
  }
  /** One JSON-RPC message (or batch) to POST /mcp as `token` (`tokenFromDsn`); null for 202. */
  async mcp(token: string, message: unknown, protocolVersion = "2025-06-18"): Promise<unknown> {
    const r = await this.call("mcp", { body: message, bearer: token, headers: { "MCP-Protocol-Version": protocolVersion } });
    return r.status === 202 ? null : r.body;
  }
}

function issueRequest(task: string, o: TaskOptions): M.IssueRequest {
  return {
    task,
    ttl_seconds: o.ttl ?? 900,
    max_rows: o.maxRows,
    max_bytes: o.maxBytes,
    max_connections: o.maxConnections,
    cap_mode: o.capMode,
    allow: o.allow,
    statement_timeout_ms: o.statementTimeoutMs,
    idle_in_transaction_timeout_ms: o.idleInTransactionTimeoutMs,
    metadata: o.meta,
    superuser: o.superuser,
  };
}

/** `new Sandpit(opts).task(name, fn, taskOpts)`: the three-line form. */
export function withTask<T>(
  name: string,
  fn: (task: Task) => Promise<T> | T,
  opts: TaskOptions & SandpitOptions = {},
): Promise<T> {
  return new Sandpit(opts).task(name, fn, opts);
}
