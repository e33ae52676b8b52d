"""A harness that gives each agent task its own throwaway Postgres database via sandpit,
with the Python SDK (clients/python: `pip install './clients/python[sql]'`).

The harness holds the admin key; the agent only ever gets the `run_sql` tool. The DSN stays
inside the tool, and it stops working when the task ends: `task()` revokes the token when
the `with` block ends, whatever happened inside.

    SANDPIT_API=http://127.0.0.1:6433 SANDPIT_ADMIN_KEY=... python3 harness.py
"""

from sandpit import Sandpit, run_sql_tool

sp = Sandpit()  # SANDPIT_API, SANDPIT_ADMIN_KEY


def agent_turns(tool, statements):
    """Stands in for a model: makes the tool calls a model would make, prints what it sees."""
    for sql in statements:
        print(f"run_sql> {sql}")
        print(tool({"sql": sql}))


def main():
    with sp.task("py-example-cleanup", meta={"harness": "python"}) as task:
        tool = run_sql_tool(task.dsn)  # hand `tool.anthropic` (or .openai, .mcp) to the model
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
        tool.close()
    print(f"first task ended: token {sp.token(task.id).state}")

    with sp.task("py-example-isolation") as task, run_sql_tool(task.dsn) as tool:
        agent_turns(tool, ["select (to_regclass('notes') is null)::text as notes_absent"])

    try:
        with sp.task("py-example-crash") as crashed, run_sql_tool(crashed.dsn) as tool:
            agent_turns(tool, ["select 40 + 2 as answer"])
            raise RuntimeError("the agent loop failed")
    except RuntimeError as e:
        print(f"agent loop raised: {e}")
    print(f"crashed task ended: token {sp.token(crashed.id).state}")
    print("harness ok")


if __name__ == "__main__":
    main()
