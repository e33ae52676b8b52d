"""A harness that gives each agent task its own throwaway Postgres database via sandpit.

The harness holds the admin key; the agent only ever gets a `run_sql(sql)` tool. The DSN
lives in the tool's closure: the agent never sees it, and it stops working when the task
ends, because `scratch_db` revokes the token in `finally`, whatever happened inside.

Run against a gateway (`sandpit serve`):

    SANDPIT_API=http://127.0.0.1:6433 SANDPIT_ADMIN_KEY=... python3 harness.py

Needs psycopg 3 (`pip install 'psycopg[binary]'`); the HTTP API is called with urllib.
"""

import contextlib
import json
import os
import urllib.error
import urllib.request

import psycopg

API = os.environ.get("SANDPIT_API", "http://127.0.0.1:6433").rstrip("/")
ADMIN_KEY = os.environ.get("SANDPIT_ADMIN_KEY", "")

# What a model is shown: one tool, one field.
RUN_SQL_SCHEMA = {
    "name": "run_sql",
    "description": "Run one SQL statement on your own scratch copy of the database. "
    "Nothing you do here reaches production; the copy is deleted when the task ends.",
    "input_schema": {
        "type": "object",
        "properties": {"sql": {"type": "string", "description": "One SQL statement"}},
        "required": ["sql"],
    },
}

# Rows shown to the model per call; the gateway enforces its own caps on top.
MAX_ROWS_SHOWN = 20


def api(method, path, body=None):
    """Calls the sandpit control API with the admin key; returns the decoded JSON."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(API + path, data=data, method=method)
    req.add_header("Authorization", "Bearer " + ADMIN_KEY)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return json.load(resp)
    except urllib.error.HTTPError as e:
        detail = e.read().decode(errors="replace")
        raise RuntimeError(f"sandpit API {method} {path}: {e.code} {detail}") from None


def format_result(cur):
    """A compact text rendering of a cursor's result for the model."""
    if cur.description is None:
        return cur.statusmessage or "OK"
    names = [d.name for d in cur.description]
    rows = cur.fetchmany(MAX_ROWS_SHOWN + 1)
    lines = [" | ".join(names)]
    for row in rows[:MAX_ROWS_SHOWN]:
        lines.append(" | ".join("NULL" if v is None else str(v) for v in row))
    if len(rows) > MAX_ROWS_SHOWN:
        lines.append(f"(more than {MAX_ROWS_SHOWN} rows; showing {MAX_ROWS_SHOWN})")
    else:
        lines.append(f"({len(rows)} row{'' if len(rows) == 1 else 's'})")
    return "\n".join(lines)


class SqlTool:
    """The `run_sql` tool bound to one task's scratch database."""

    schema = RUN_SQL_SCHEMA

    def __init__(self, token_id, run_sql):
        # The token id is the harness's handle (for logs and review), not a credential.
        self.token_id = token_id
        self.run_sql = run_sql

    def __call__(self, args):
        """Dispatches a model's tool call: `args` is the tool input, `{"sql": "..."}`."""
        return self.run_sql(args["sql"])


@contextlib.contextmanager
def scratch_db(task, ttl_seconds=900, metadata=None):
    """Issues a sandpit token for `task`, yields the `run_sql` tool, revokes in `finally`."""
    token = api(
        "POST",
        "/v1/tokens",
        {"task": task, "ttl_seconds": ttl_seconds, "metadata": metadata or {}},
    )
    dsn = token["dsn"]  # stays in this closure

    def run_sql(sql):
        """Runs `sql`; errors come back as text, so the model can read and fix them."""
        try:
            with psycopg.connect(dsn, autocommit=True, connect_timeout=30) as conn:
                with conn.cursor() as cur:
                    cur.execute(sql)
                    return format_result(cur)
        except psycopg.Error as e:
            code = getattr(e, "sqlstate", None) or "?"
            message = e.diag.message_primary if e.diag else str(e)
            return f"ERROR {code}: {message}"

    try:
        yield SqlTool(token["id"], run_sql)
    finally:
        api("DELETE", f"/v1/tokens/{token['id']}")


def agent_turns(tool, statements):
    """Stands in for a model: makes the tool calls a model would make, prints what it sees."""
    for sql in statements:
        print(f"run_sql> {sql}")
        print(tool({"sql": sql}))


def main():
    with scratch_db("py-example-cleanup", metadata={"harness": "python"}) as tool:
        first = tool.token_id
        agent_turns(
            tool,
            [
                "create table notes(id int primary key, body text not null)",
                "insert into notes select g, 'note ' || g from generate_series(1, 500) g",
                "select count(*) as notes from notes",
                "delete from notes where id % 2 = 0 or true",
                "select count(*) as left_after_delete from notes",
                "select * from no_such_table",
            ],
        )
    state = api("GET", f"/v1/tokens/{first}")["state"]
    print(f"first task ended: token {state}")

    with scratch_db("py-example-isolation") as tool:
        agent_turns(tool, ["select (to_regclass('notes') is null)::text as notes_absent"])

    crashed = None
    try:
        with scratch_db("py-example-crash") as tool:
            crashed = tool.token_id
            agent_turns(tool, ["select 40 + 2 as answer"])
            raise RuntimeError("the agent loop failed")
    except RuntimeError as e:
        print(f"agent loop raised: {e}")
    state = api("GET", f"/v1/tokens/{crashed}")["state"]
    print(f"crashed task ended: token {state}")
    print("harness ok")


if __name__ == "__main__":
    main()
