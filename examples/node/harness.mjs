// @ts-check
/**
 * A harness that gives each agent task its own throwaway Postgres database via sandpit
 * (node-postgres + the HTTP API through fetch). Plain ES module with JSDoc types: node runs
 * it as is, and `tsc --checkJs --noEmit` can type-check it; no build step.
 *
 * The harness holds the admin key; the agent only ever gets a `run_sql(sql)` tool whose DSN
 * lives in a closure, and `withScratchDb` revokes the token in `finally`.
 *
 *   cd examples/node && npm ci
 *   SANDPIT_API=http://127.0.0.1:6433 SANDPIT_ADMIN_KEY=... node harness.mjs
 */

import pg from "pg";

const API = (process.env.SANDPIT_API ?? "http://127.0.0.1:6433").replace(/\/$/, "");
const ADMIN_KEY = process.env.SANDPIT_ADMIN_KEY ?? "";

/** What a model is shown: one tool, one field. */
export const RUN_SQL_SCHEMA = {
  name: "run_sql",
  description:
    "Run one SQL statement on your own scratch copy of the database. Nothing you do here " +
    "reaches production; the copy is deleted when the task ends.",
  input_schema: {
    type: "object",
    properties: { sql: { type: "string", description: "One SQL statement" } },
    required: ["sql"],
  },
};

/** Rows shown to the model per call; the gateway enforces its own caps on top. */
const MAX_ROWS_SHOWN = 20;

/**
 * Calls the sandpit control API with the admin key.
 * @param {string} method
 * @param {string} path
 * @param {object} [body]
 * @returns {Promise<any>}
 */
async function api(method, path, body) {
  const res = await fetch(API + path, {
    method,
    headers: {
      Authorization: `Bearer ${ADMIN_KEY}`,
      ...(body ? { "Content-Type": "application/json" } : {}),
    },
    body: body ? JSON.stringify(body) : undefined,
  });
  const text = await res.text();
  if (!res.ok) throw new Error(`sandpit API ${method} ${path}: ${res.status} ${text}`);
  return JSON.parse(text);
}

/**
 * A compact text rendering of a query result for the model.
 * @param {pg.QueryResult} r
 */
function formatResult(r) {
  if (!r.fields || r.fields.length === 0) {
    // The command tag as the server sent it (INSERT carries an oid, always 0 nowadays).
    if (r.command === "INSERT") return `INSERT ${r.oid ?? 0} ${r.rowCount}`;
    return r.rowCount === null ? r.command : `${r.command} ${r.rowCount}`;
  }
  const lines = [r.fields.map((f) => f.name).join(" | ")];
  for (const row of r.rows.slice(0, MAX_ROWS_SHOWN)) {
    lines.push(r.fields.map((f) => (row[f.name] === null ? "NULL" : String(row[f.name]))).join(" | "));
  }
  const n = r.rows.length;
  lines.push(
    n > MAX_ROWS_SHOWN
      ? `(more than ${MAX_ROWS_SHOWN} rows; showing ${MAX_ROWS_SHOWN})`
      : `(${n} row${n === 1 ? "" : "s"})`,
  );
  return lines.join("\n");
}

/**
 * @typedef {object} SqlTool
 * @property {typeof RUN_SQL_SCHEMA} schema
 * @property {string} tokenId  the harness's handle for logs and review, not a credential
 * @property {(args: {sql: string}) => Promise<string>} call  dispatches a model's tool call
 */

/**
 * Issues a sandpit token for `task`, runs `body` with the `run_sql` tool, revokes in `finally`.
 * @template T
 * @param {string} task
 * @param {(tool: SqlTool) => Promise<T>} body
 * @param {{ttlSeconds?: number, metadata?: Record<string, string>}} [opts]
 * @returns {Promise<T>}
 */
export async function withScratchDb(task, body, opts = {}) {
  const token = await api("POST", "/v1/tokens", {
    task,
    ttl_seconds: opts.ttlSeconds ?? 900,
    metadata: opts.metadata ?? {},
  });
  const dsn = token.dsn; // stays in this closure

  /** @param {string} sql */
  async function runSql(sql) {
    const client = new pg.Client({ connectionString: dsn, connectionTimeoutMillis: 30000 });
    try {
      await client.connect();
      return formatResult(await client.query(sql));
    } catch (e) {
      // Errors come back as text, so the model can read and fix them.
      const err = /** @type {{code?: string, message?: string}} */ (e);
      return `ERROR ${err.code ?? "?"}: ${err.message ?? String(e)}`;
    } finally {
      await client.end().catch(() => {});
    }
  }

  try {
    return await body({ schema: RUN_SQL_SCHEMA, tokenId: token.id, call: (args) => runSql(args.sql) });
  } finally {
    await api("DELETE", `/v1/tokens/${encodeURIComponent(token.id)}`);
  }
}

/**
 * Stands in for a model: makes the tool calls a model would make, prints what it sees.
 * @param {SqlTool} tool
 * @param {string[]} statements
 */
async function agentTurns(tool, statements) {
  for (const sql of statements) {
    console.log(`run_sql> ${sql}`);
    console.log(await tool.call({ sql }));
  }
}

async function main() {
  const first = await withScratchDb(
    "node-example-cleanup",
    async (tool) => {
      await agentTurns(tool, [
        "create table notes(id int primary key, body text not null)",
        "insert into notes select g, 'note ' || g from generate_series(1, 500) g",
        "select count(*) as notes from notes",
        "delete from notes where id % 2 = 0 or true",
        "select count(*) as left_after_delete from notes",
        "select * from no_such_table",
      ]);
      return tool.tokenId;
    },
    { metadata: { harness: "node" } },
  );
  console.log(`first task ended: token ${(await api("GET", `/v1/tokens/${first}`)).state}`);

  await withScratchDb("node-example-isolation", (tool) =>
    agentTurns(tool, ["select (to_regclass('notes') is null)::text as notes_absent"]),
  );

  /** @type {string | undefined} */
  let crashed;
  try {
    await withScratchDb("node-example-crash", async (tool) => {
      crashed = tool.tokenId;
      await agentTurns(tool, ["select 40 + 2 as answer"]);
      throw new Error("the agent loop failed");
    });
  } catch (e) {
    console.log(`agent loop raised: ${/** @type {Error} */ (e).message}`);
  }
  console.log(`crashed task ended: token ${(await api("GET", `/v1/tokens/${crashed}`)).state}`);
  console.log("harness ok");
}

await main();
