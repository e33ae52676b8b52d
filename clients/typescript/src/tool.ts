/**
 * `runSqlTool(dsn)`: the one-field `run_sql` tool an agent gets, with its JSON schema in the
 * shapes agent frameworks take, and the gateway's cap notice passed back in the result.
 * Needs `pg` (node-postgres), an optional peer dependency, loaded when the tool first runs.
 */

export const NAME = "run_sql";
export const DESCRIPTION =
  "Run SQL on your own scratch copy of the database. Nothing you do here reaches production; " +
  "the copy is deleted when the task ends. Large results are cut by the gateway, and a NOTICE " +
  "in the result says so.";

export interface JsonSchema {
  type: "object";
  properties: { sql: { type: "string"; description: string } };
  required: ["sql"];
  additionalProperties: false;
}

function parameters(): JsonSchema {
  return {
    type: "object",
    properties: { sql: { type: "string", description: "The SQL to run" } },
    required: ["sql"],
    additionalProperties: false,
  };
}

export interface SqlTool {
  readonly name: typeof NAME;
  readonly parameters: JsonSchema;
  /** OpenAI Chat Completions function tool. */
  readonly openai: { type: "function"; function: { name: string; description: string; parameters: JsonSchema } };
  /** Anthropic Messages API tool definition. */
  readonly anthropic: { name: string; description: string; input_schema: JsonSchema };
  /** MCP tool description (an item of `tools/list`). */
  readonly mcp: { name: string; description: string; inputSchema: JsonSchema };
  /** Runs the model's tool input (`{sql}`, or a string); text back, errors included. */
  call(args: { sql: string } | string): Promise<string>;
  /** Ends the tool's database session. */
  close(): Promise<void>;
}

interface PgResult {
  command: string | null;
  rowCount: number | null;
  oid?: number;
  fields?: { name: string }[];
  rows: Record<string, unknown>[];
}
interface PgClient {
  connect(): Promise<void>;
  query(sql: string): Promise<PgResult | PgResult[]>;
  end(): Promise<void>;
  on(ev: "notice", f: (n: { severity?: string; code?: string; message?: string }) => void): void;
  on(ev: "error", f: (e: Error) => void): void;
  /** pg's protocol connection: its `commandComplete` events carry the whole command tag. */
  connection?: { on(ev: "commandComplete", f: (m: { text?: string }) => void): void };
}

/** The `run_sql` tool bound to `dsn`; one session, opened on first use, reopened if dropped. */
export function runSqlTool(dsn: string, opts: { maxRowsShown?: number } = {}): SqlTool {
  const maxRows = opts.maxRowsShown ?? 50;
  let client: PgClient | undefined;
  let notices: string[] = [];
  // Command tags as the server sent them (pg's results keep only the first word).
  let tags: string[] = [];
  let queue: Promise<unknown> = Promise.resolve();

  async function connect(): Promise<PgClient> {
    if (client) return client;
    const pg = (await import("pg")).default as { Client: new (c: object) => PgClient };
    const c = new pg.Client({ connectionString: dsn, connectionTimeoutMillis: 30000 });
    c.on("notice", (n) => notices.push(`${n.severity ?? "NOTICE"} ${n.code ?? ""}: ${n.message ?? ""}`));
    c.connection?.on("commandComplete", (m) => tags.push(m.text ?? ""));
    c.on("error", () => {
      client = undefined;
    });
    await c.connect();
    client = c;
    return c;
  }

  async function run(sql: string): Promise<string> {
    notices = [];
    tags = [];
    let text: string;
    try {
      const c = await connect();
      const res = await c.query(sql);
      text = (Array.isArray(res) ? res : [res]).map((r, i) => render(r, maxRows, tags[i])).join("\n");
    } catch (e) {
      const err = e as { code?: string; message?: string; detail?: string; hint?: string };
      text = `ERROR ${err.code ?? "?"}: ${err.message ?? String(e)}`;
      if (err.detail) text += `\nDETAIL: ${err.detail}`;
      if (err.hint) text += `\nHINT: ${err.hint}`;
      if (!err.code && client) {
        // Not a server error: the session may be gone; start a new one next time.
        const c = client;
        client = undefined;
        await c.end().catch(() => {});
      }
    }
    // The gateway's cap notice (01000) tells the model its result was cut.
    return [text, ...notices].join("\n");
  }

  const p = parameters();
  return {
    name: NAME,
    parameters: p,
    openai: { type: "function", function: { name: NAME, description: DESCRIPTION, parameters: parameters() } },
    anthropic: { name: NAME, description: DESCRIPTION, input_schema: parameters() },
    mcp: { name: NAME, description: DESCRIPTION, inputSchema: parameters() },
    call(args) {
      const sql = typeof args === "string" ? args : args?.sql;
      if (typeof sql !== "string" || !sql.trim()) return Promise.resolve("ERROR: run_sql needs a non-empty `sql` string");
      // One statement at a time on the one session, in call order.
      const next = queue.then(() => run(sql));
      queue = next.catch(() => {});
      return next;
    },
    async close() {
      const c = client;
      client = undefined;
      if (c) await c.end().catch(() => {});
    },
  };
}

function render(r: PgResult, maxRows: number, tag: string | undefined): string {
  if (!r.fields || r.fields.length === 0) {
    if (tag) return tag;
    if (r.command === "INSERT") return `INSERT ${r.oid ?? 0} ${r.rowCount}`;
    return r.rowCount === null ? String(r.command) : `${r.command} ${r.rowCount}`;
  }
  const names = r.fields.map((f) => f.name);
  const lines = [names.join(" | ")];
  for (const row of r.rows.slice(0, maxRows)) {
    lines.push(names.map((n) => (row[n] === null ? "NULL" : String(row[n]))).join(" | "));
  }
  const n = r.rows.length;
  lines.push(n > maxRows ? `(${n} rows; showing ${maxRows})` : `(${n} row${n === 1 ? "" : "s"})`);
  return lines.join("\n");
}
