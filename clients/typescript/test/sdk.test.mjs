// sandpit-client against a real gateway (tests/operator/sdk.rs starts it and runs this file from a
// clean folder where the packed tarball and pg are installed): task lifecycle (a throw inside
// the task leaves no live token), tool schema shapes, the cap notice, review -> approve ->
// promote dry run, the statement log and error classes.
import assert from "node:assert/strict";
import { test } from "node:test";
import { fileURLToPath } from "node:url";
import { createRequire } from "node:module";
import pg from "pg";
import {
  BadRequestError,
  ConflictError,
  NotFoundError,
  Sandpit,
  SandpitError,
  UnauthorizedError,
  runSqlTool,
  tokenFromDsn,
  withTask,
} from "sandpit-client";

if (!process.env.SANDPIT_API || !process.env.SANDPIT_ADMIN_KEY) {
  throw new Error("set SANDPIT_API and SANDPIT_ADMIN_KEY (tests/operator/sdk.rs does)");
}
const sp = new Sandpit();

async function ended(id) {
  const t = await sp.token(id);
  return t.state === "revoked" && t.backend === false;
}

test("installed from the tarball, not the source tree", () => {
  const where = createRequire(fileURLToPath(import.meta.url)).resolve("sandpit-client");
  assert.match(where, /node_modules\/sandpit-client\/dist\/index\.js$/);
});

test("task lifecycle", async () => {
  const id = await withTask(
    "sdk-ts-life",
    async (t) => {
      assert.match(t.dsn, /^postgresql:\/\//);
      assert.deepEqual(t.token.metadata, { harness: "node:test" });
      const c = new pg.Client({ connectionString: t.dsn });
      await c.connect();
      assert.equal((await c.query("select count(*)::int as n from items")).rows[0].n, 1000);
      await c.end();
      assert.ok(["issued", "live"].includes((await sp.token(t.id)).state));
      return t.id;
    },
    { ttl: 300, meta: { harness: "node:test" } },
  );
  assert.ok(await ended(id));
});

test("a throw inside the task leaves no live token", async () => {
  let id;
  await assert.rejects(
    sp.task("sdk-ts-crash", (t) => {
      id = t.id;
      throw new RangeError("the agent loop failed");
    }),
    RangeError,
  );
  assert.ok(await ended(id));
});

test("tool schema shapes, and the gateway's own MCP tool", async () => {
  await sp.task("sdk-ts-schema", async (t) => {
    const tool = runSqlTool(t.dsn);
    const p = tool.parameters;
    assert.equal(p.type, "object");
    assert.deepEqual(p.required, ["sql"]);
    assert.equal(p.properties.sql.type, "string");
    assert.deepEqual(tool.openai, { type: "function", function: { name: "run_sql", description: tool.openai.function.description, parameters: p } });
    assert.deepEqual(Object.keys(tool.anthropic).sort(), ["description", "input_schema", "name"]);
    assert.deepEqual(tool.anthropic.input_schema, p);
    assert.deepEqual(Object.keys(tool.mcp).sort(), ["description", "inputSchema", "name"]);
    const bearer = tokenFromDsn(t.dsn);
    const init = await sp.mcp(bearer, { jsonrpc: "2.0", id: 1, method: "initialize", params: {
      protocolVersion: "2025-06-18", capabilities: {}, clientInfo: { name: "sdk", version: "0" } } });
    assert.equal(init.result.protocolVersion, "2025-06-18");
    const listed = await sp.mcp(bearer, { jsonrpc: "2.0", id: 2, method: "tools/list" });
    const theirs = listed.result.tools.find((x) => x.name === "run_sql");
    assert.deepEqual(theirs.inputSchema.required, tool.mcp.inputSchema.required);
    assert.ok(!JSON.stringify(tool.anthropic).includes(t.dsn));
    assert.match(await tool.call({ sql: "select * from no_such_table" }), /^ERROR 42P01: /);
    assert.equal(await tool.call("create temp table n(x int)"), "CREATE TABLE");
    assert.equal(await tool.call({ sql: "insert into n values (1), (2)" }), "INSERT 0 2");
    assert.equal(await tool.call({ sql: "select count(*) as c from n" }), "c\n2\n(1 row)");
    await tool.close();
  });
});

test("the cap notice reaches the model", async () => {
  await sp.task("sdk-ts-caps", async (t) => {
    const tool = runSqlTool(t.dsn);
    const out = await tool.call({ sql: "select g from generate_series(1, 50) g" });
    await tool.close();
    const lines = out.split("\n");
    assert.deepEqual(lines.slice(0, 7), ["g", "1", "2", "3", "4", "5", "(5 rows)"], out);
    const notice = lines.filter((l) => l.includes("01000"));
    assert.equal(notice.length, 1, out);
    assert.match(notice[0], /5 rows/);
  }, { maxRows: 5 });
});

test("review, approve, promote dry run, statements", async () => {
  const id = await sp.task("sdk-ts-review", async (t) => {
    const tool = runSqlTool(t.dsn);
    assert.equal(await tool.call("insert into items values (5002, 'from the ts sdk')"), "INSERT 0 1");
    await tool.close();
    const e = await sp.approve(t.id, "too early").catch((x) => x);
    assert.ok(e instanceof ConflictError && e.status === 409 && e.apiMessage, String(e));
    return t.id;
  });
  let rec = await sp.review(id);
  assert.equal(rec.state, "needs_review");
  assert.equal(rec.capture?.rows, 1);
  await assert.rejects(sp.reject(id, ""), (e) => e instanceof BadRequestError && e.status === 400);
  rec = await sp.approve(id, "fine");
  assert.equal(rec.state, "approved");
  assert.deepEqual(rec.trail.map((e) => e.action), ["approved"]);
  // Decisions are final: no second decision.
  const again = await sp.reject(id, "check first").catch((x) => x);
  assert.ok(again instanceof ConflictError && again.status === 409, String(again));
  const rep = await sp.promote(id, { target: process.env.SANDPIT_TEST_TARGET ?? "default", dryRun: true });
  assert.equal(rep.outcome, "dry_run", JSON.stringify(rep));
  assert.equal(rep.dry_run, true);
  assert.equal(rep.counts.inserted, 1);
  assert.equal((await sp.review(id)).state, "approved");
  assert.ok((await sp.reviews()).some((r) => r.token === id));
  const log = await sp.statements(id);
  const mine = log.filter((s) => s.text?.includes("from the ts sdk"));
  assert.equal(mine.length, 1);
  assert.equal(mine[0].outcome?.tag, "INSERT 0 1");
  const page = await sp.statementsPage(id, 0, 1);
  assert.equal(page.statements.length, 1);
  assert.equal(page.next, page.statements[0].seq);
  assert.equal(typeof (await sp.diff(id)), "object");
  assert.match(String(await sp.diff(id, { format: "sql" })), /5002/);
});

test("error classes", async () => {
  const bad = new Sandpit({ adminKey: "not-the-key-" + "x".repeat(30) });
  await assert.rejects(bad.tokens(), (e) => e instanceof UnauthorizedError && e.status === 401 && !!e.apiMessage);
  await assert.rejects(sp.token("sp_nosuchtoken"), (e) => e instanceof NotFoundError && e instanceof SandpitError && e.status === 404);
  await assert.rejects(sp.issue({ task: "sdk-ts-bad", max_rows: 0 }), BadRequestError);
});

test("operator calls", async () => {
  assert.equal((await sp.healthz()).trim(), "ok");
  assert.match(await sp.metrics(), /sandpit_/);
  const goldens = await sp.goldens();
  assert.ok(goldens.some((g) => g.active));
  const rep = await sp.reap({ dryRun: true });
  assert.equal(rep.dry_run, true);
  assert.equal(typeof rep.backends, "number");
});
