// @ts-check
/**
 * A harness that gives each agent task its own throwaway Postgres database via sandpit, with
 * the TypeScript SDK (clients/typescript, package `sandpit-client`; node-postgres as its peer).
 *
 * The harness holds the admin key; the agent only ever gets the `run_sql` tool, whose DSN
 * stays inside it, and `sp.task` revokes the token in `finally`, however the task ends.
 *
 *   (cd clients/typescript && npm ci && npm run build) && (cd examples/node && npm ci)
 *   SANDPIT_API=http://127.0.0.1:6433 SANDPIT_ADMIN_KEY=... node harness.mjs
 */

import { Sandpit, runSqlTool } from "sandpit-client";

const sp = new Sandpit(); // SANDPIT_API, SANDPIT_ADMIN_KEY

/**
 * Stands in for a model: makes the tool calls a model would make, prints what it sees.
 * @param {import("sandpit-client").SqlTool} tool
 * @param {string[]} statements
 */
async function agentTurns(tool, statements) {
  for (const sql of statements) {
    console.log(`run_sql> ${sql}`);
    console.log(await tool.call({ sql }));
  }
}

const first = await sp.task(
  "node-example-cleanup",
  async (task) => {
    const tool = runSqlTool(task.dsn); // hand `tool.anthropic` (or .openai, .mcp) to the model
    await agentTurns(tool, [
      "create table notes(id int primary key, body text not null)",
      "insert into notes select g, 'note ' || g from generate_series(1, 500) g",
      "select count(*) as notes from notes",
      "delete from notes where id % 2 = 0 or true",
      "select count(*) as left_after_delete from notes",
      "select * from no_such_table",
    ]);
    await tool.close();
    return task.id;
  },
  { meta: { harness: "node" } },
);
console.log(`first task ended: token ${(await sp.token(first)).state}`);

await sp.task("node-example-isolation", async (task) => {
  const tool = runSqlTool(task.dsn);
  await agentTurns(tool, ["select (to_regclass('notes') is null)::text as notes_absent"]);
  await tool.close();
});

/** @type {string | undefined} */
let crashed;
try {
  await sp.task("node-example-crash", async (task) => {
    crashed = task.id;
    const tool = runSqlTool(task.dsn);
    try {
      await agentTurns(tool, ["select 40 + 2 as answer"]);
      throw new Error("the agent loop failed");
    } finally {
      await tool.close();
    }
  });
} catch (e) {
  console.log(`agent loop raised: ${/** @type {Error} */ (e).message}`);
}
console.log(`crashed task ended: token ${(await sp.token(String(crashed))).state}`);
console.log("harness ok");
