/**
 * Typed objects of the sandpit control API (docs/api.yaml). Each interface has a field list
 * beside it; `Exact` makes the compiler refuse a list that differs from its interface, and
 * the lists are what `surface()` reports to the drift test (tests/operator/sdk.rs).
 */

/** A model's JSON fields, and the models of its nested objects (or list items). */
export interface ModelInfo {
  readonly fields: readonly string[];
  readonly nested?: Readonly<Record<string, ModelInfo>>;
}

type Exact<A, B> = [A] extends [B] ? ([B] extends [A] ? true : false) : false;
function model<T>(fields: readonly (keyof T & string)[], nested?: Record<string, ModelInfo>): ModelInfo {
  return { fields, nested };
}

export type CapMode = "truncate" | "error";
export type StatementKind = "read" | "write" | "ddl" | "transaction" | "privilege" | "utility" | "all";

/** Body of POST /v1/tokens. */
export interface IssueRequest {
  task: string;
  ttl_seconds?: number;
  max_rows?: number;
  max_bytes?: number;
  max_connections?: number;
  cap_mode?: CapMode;
  allow?: StatementKind[];
  statement_timeout_ms?: number;
  idle_in_transaction_timeout_ms?: number;
  metadata?: Record<string, string>;
  superuser?: boolean;
}
const ISSUE_REQUEST = [
  "task", "ttl_seconds", "max_rows", "max_bytes", "max_connections", "cap_mode", "allow",
  "statement_timeout_ms", "idle_in_transaction_timeout_ms", "metadata", "superuser",
] as const;
const _issueRequest: Exact<keyof IssueRequest, (typeof ISSUE_REQUEST)[number]> = true;

/** A token (`dsn` only in the answer to an issue). */
export interface Token {
  id: string;
  dsn?: string;
  task: string;
  metadata: Record<string, string>;
  created_at: string;
  expires_at: string;
  state: "issued" | "live" | "expired" | "revoked";
  max_rows: number;
  max_bytes: number;
  max_connections: number;
  cap_mode: CapMode;
  allow?: string[];
  statement_timeout_ms: number;
  idle_in_transaction_timeout_ms: number;
  backend: boolean;
  fork_count: number;
  golden?: string;
  superuser: boolean;
  sessions: number;
  /** How far its end has got (absent while usable). */
  end?: "ending" | "reviewed" | "discarded" | "destroyed";
  /** Its end-of-token review: `stored`, `pending` or `failed: <reason>` (absent while usable). */
  review?: string;
  /** Why it ended, when not by its TTL or a revoke (say, its worker was lost). */
  ended_why?: string;
}
const TOKEN = [
  "id", "dsn", "task", "metadata", "created_at", "expires_at", "state", "max_rows", "max_bytes",
  "max_connections", "cap_mode", "allow", "statement_timeout_ms", "idle_in_transaction_timeout_ms",
  "backend", "fork_count", "golden", "superuser", "sessions", "end", "review", "ended_why",
] as const;
const _token: Exact<keyof Token, (typeof TOKEN)[number]> = true;

/** One worker's copy of a golden version (a front over sandpit workers). */
export interface GoldenWorker {
  /** Position in the front's `remote.urls`. */
  worker: number;
  url: string;
  active: boolean;
  forks: number;
}
const GOLDEN_WORKER = ["worker", "url", "active", "forks"] as const;
const _goldenWorker: Exact<keyof GoldenWorker, (typeof GOLDEN_WORKER)[number]> = true;

/** A golden version. */
export interface Golden {
  id: string;
  kind: "sql" | "live";
  created_at: string;
  source: string;
  active: boolean;
  forks: number;
  schemas?: string[];
  exclude_tables?: string[];
  report?: Record<string, unknown>;
  /** A front over sandpit workers: the workers that have this version ready. */
  workers?: GoldenWorker[];
}
const GOLDEN = [
  "id", "kind", "created_at", "source", "active", "forks", "schemas", "exclude_tables", "report", "workers",
] as const;
const _golden: Exact<keyof Golden, (typeof GOLDEN)[number]> = true;

/** Body of POST /v1/goldens. */
export interface GoldenBuild {
  from_dsn: string;
  schemas?: string[];
  exclude_tables?: string[];
  mask?: string;
  activate?: boolean;
}
const GOLDEN_BUILD = ["from_dsn", "schemas", "exclude_tables", "mask", "activate"] as const;
const _goldenBuild: Exact<keyof GoldenBuild, (typeof GOLDEN_BUILD)[number]> = true;

/** How a logged statement ended. */
export interface StatementOutcome {
  seq: number;
  ts: string;
  rows: number | null;
  capped: boolean;
  duration_ms: number;
  sqlstate: string | null;
  tag: string | null;
  skipped: boolean;
  denied: boolean;
  /** The kind the server's command tags told. */
  kind?: string;
}
const OUTCOME = ["seq", "ts", "rows", "capped", "duration_ms", "sqlstate", "tag", "skipped", "denied", "kind"] as const;
const _outcome: Exact<keyof StatementOutcome, (typeof OUTCOME)[number]> = true;

/** One record of a token's statement log. */
export interface Statement {
  seq: number;
  ts: string;
  token: string;
  task: string;
  session: number;
  protocol: "simple" | "extended" | "function";
  text: string;
  text_len?: number;
  text_sha256?: string;
  params?: (string | null)[];
  kind: string;
  /** `server`: `kind` is what the command tags told; `lexical`: a guess from the text. */
  kind_source?: "server" | "lexical";
  /** Fronts sharing `registry.shared_dir`: the front whose file holds it (`seq` is then its place in the merged log). */
  front?: string;
  /** Fronts sharing `registry.shared_dir`: its seq in that front's file. */
  front_seq?: number;
  outcome: StatementOutcome | null;
}
const STATEMENT = [
  "seq", "ts", "token", "task", "session", "protocol", "text", "text_len", "text_sha256", "params", "kind",
  "kind_source", "front", "front_seq", "outcome",
] as const;
const _statement: Exact<keyof Statement, (typeof STATEMENT)[number]> = true;

/** Answer of POST /v1/reap. */
export interface ReapReport {
  dry_run: boolean;
  backends: number;
  kept: number;
  reaped: { handle: string; token: string; task: string; reason: "expired" | "revoked" | "unknown" | "orphan" }[];
  vanished: string[];
  dead?: string[];
  /** Ended tokens whose review this pass stored. */
  reviewed?: string[];
  /** Ended tokens whose review failed again (backends kept). */
  review_failed?: string[];
  skipped: { handle: string; why: "untagged" | "foreign" | "pool" }[];
  errors: string[];
}
const REAP = [
  "dry_run", "backends", "kept", "reaped", "vanished", "dead", "reviewed", "review_failed", "skipped", "errors",
] as const;
const _reap: Exact<keyof ReapReport, (typeof REAP)[number]> = true;
const REAPED = ["handle", "token", "task", "reason"] as const;
const _reaped: Exact<keyof ReapReport["reaped"][number], (typeof REAPED)[number]> = true;
const SKIPPED = ["handle", "why"] as const;
const _skipped: Exact<keyof ReapReport["skipped"][number], (typeof SKIPPED)[number]> = true;

/** Body of approve and reject. */
export interface Decision {
  comment?: string;
}

/** Body of POST /v1/tokens/{id}/promote: a DSN (admin key only) or a named target. */
export interface PromoteRequest {
  dsn?: string;
  target?: string;
  role?: string;
  dry_run?: boolean;
}
const PROMOTE_REQUEST = ["dsn", "target", "role", "dry_run"] as const;
const _promoteRequest: Exact<keyof PromoteRequest, (typeof PROMOTE_REQUEST)[number]> = true;

export interface Counts {
  schema: number;
  inserted: number;
  updated: number;
  deleted: number;
  sequences: number;
}
const COUNTS = ["schema", "inserted", "updated", "deleted", "sequences"] as const;
const _counts: Exact<keyof Counts, (typeof COUNTS)[number]> = true;

/** A promotion's report: outcome applied, dry_run, conflicts, refused or failed. */
export interface PromoteReport {
  outcome: "applied" | "dry_run" | "conflicts" | "refused" | "failed";
  target: string;
  role: string | null;
  dry_run: boolean;
  at: string;
  by: string;
  counts: Counts;
  conflicts: string[];
  conflicts_total: number;
  refusals: string[];
  error?: string;
}
const PROMOTE_REPORT = [
  "outcome", "target", "role", "dry_run", "at", "by", "counts", "conflicts", "conflicts_total", "refusals", "error",
] as const;
const _promoteReport: Exact<keyof PromoteReport, (typeof PROMOTE_REPORT)[number]> = true;

export interface ReviewEvent {
  at: string;
  by: string;
  action: string;
  comment: string;
}
const EVENT = ["at", "by", "action", "comment"] as const;
const _event: Exact<keyof ReviewEvent, (typeof EVENT)[number]> = true;

export interface ValidatorResult {
  name: string;
  kind: string;
  passed: boolean;
  detail: string;
}

export interface CaptureInfo {
  complete: boolean;
  reason?: string;
  rows: number;
  schema_changes: number;
  masked: string[];
}

export type ReviewState = "needs_review" | "approved" | "rejected" | "promoted";

/** A token's review record. */
export interface ReviewRecord {
  token: string;
  task: string;
  golden: string | null;
  state: ReviewState;
  trail: ReviewEvent[];
  validators: ValidatorResult[];
  validated_at: string | null;
  capture: CaptureInfo | null;
  promotions: PromoteReport[];
}
const RECORD = ["token", "task", "golden", "state", "trail", "validators", "validated_at", "capture", "promotions"] as const;
const _record: Exact<keyof ReviewRecord, (typeof RECORD)[number]> = true;

/** One row of GET /v1/reviews. */
export interface ReviewSummary {
  token: string;
  task: string;
  token_state: string;
  golden: string | null;
  state: ReviewState;
  schema_changes: number | null;
  rows_changed: number | null;
  validators_failed: number;
  last: ReviewEvent | null;
}
const SUMMARY = [
  "token", "task", "token_state", "golden", "state", "schema_changes", "rows_changed", "validators_failed", "last",
] as const;
const _summary: Exact<keyof ReviewSummary, (typeof SUMMARY)[number]> = true;

// The compile-time checks above are values only so that the compiler evaluates them.
void [
  _issueRequest, _token, _goldenWorker, _golden, _goldenBuild, _outcome, _statement, _reap, _reaped, _skipped,
  _promoteRequest, _counts, _promoteReport, _event, _record, _summary,
];

const promoteReport = model<PromoteReport>(PROMOTE_REPORT, { counts: model<Counts>(COUNTS) });
const event = model<ReviewEvent>(EVENT);

/** The models, by name, as the route table uses them. */
export const MODELS = {
  IssueRequest: model<IssueRequest>(ISSUE_REQUEST),
  Token: model<Token>(TOKEN),
  Golden: model<Golden>(GOLDEN, { workers: model<GoldenWorker>(GOLDEN_WORKER) }),
  GoldenBuild: model<GoldenBuild>(GOLDEN_BUILD),
  Statement: model<Statement>(STATEMENT, { outcome: model<StatementOutcome>(OUTCOME) }),
  ReapReport: model<ReapReport>(REAP, { reaped: { fields: REAPED }, skipped: { fields: SKIPPED } }),
  Decision: model<Decision>(["comment"]),
  PromoteRequest: model<PromoteRequest>(PROMOTE_REQUEST),
  PromoteReport: promoteReport,
  ReviewRecord: model<ReviewRecord>(RECORD, { trail: event, promotions: promoteReport }),
  ReviewSummary: model<ReviewSummary>(SUMMARY, { last: event }),
} as const;
