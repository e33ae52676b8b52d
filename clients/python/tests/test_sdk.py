"""sandpit-client against a real gateway: task lifecycle (a crash or Ctrl-C inside the block
leaves no live token), tool schema shapes, the cap notice, review -> approve -> promote dry
run, the statement log and error classes. Run from an installed wheel (tests/operator/sdk.rs)."""

import asyncio
import os

import psycopg
import pytest

import sandpit
from sandpit import (
    AsyncSandpit,
    BadRequestError,
    ConflictError,
    NotFoundError,
    Sandpit,
    UnauthorizedError,
    run_sql_tool,
    token_from_dsn,
)


@pytest.fixture(scope="module")
def sp():
    return Sandpit()


def ended(sp, id):
    t = sp.token(id)
    return t.state == "revoked" and t.backend is False


def test_installed_not_from_the_source_tree():
    assert "site-packages" in sandpit.__file__, sandpit.__file__


def test_task_lifecycle(sp):
    with sp.task("sdk-py-life", ttl=300, meta={"harness": "pytest"}) as t:
        assert t.token.dsn and t.dsn.startswith("postgresql://")
        assert t.token.metadata == {"harness": "pytest"}
        with psycopg.connect(t.dsn, autocommit=True) as c:
            assert c.execute("select count(*) from items").fetchone()[0] == 1000
        assert sp.token(t.id).state in ("issued", "live")
        assert t.id in [x.id for x in sp.tokens()]
    assert ended(sp, t.id)


def test_crash_inside_the_block_leaves_no_live_token(sp):
    holder = {}
    with pytest.raises(ZeroDivisionError):
        with sp.task("sdk-py-crash") as t:
            holder["id"] = t.id
            1 / 0
    assert ended(sp, holder["id"])


def test_keyboard_interrupt_inside_the_block_revokes(sp):
    holder = {}
    with pytest.raises(KeyboardInterrupt):
        with sp.task("sdk-py-interrupt") as t:
            holder["id"] = t.id
            raise KeyboardInterrupt
    assert ended(sp, holder["id"])


def test_async_task_revokes_on_cancellation():
    asp = AsyncSandpit()
    holder = {}

    async def agent():
        async with asp.task("sdk-py-async", ttl=300) as t:
            holder["id"] = t.id
            tool = run_sql_tool(t.dsn)
            assert "42" in await tool.acall({"sql": "select 40 + 2 as answer"})
            tool.close()
            await asyncio.sleep(3600)

    async def main():
        job = asyncio.ensure_future(agent())
        while "id" not in holder:
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.2)
        job.cancel()
        with pytest.raises(asyncio.CancelledError):
            await job
        return await asp.token(holder["id"])

    tok = asyncio.run(main())
    assert tok.state == "revoked" and tok.backend is False


def test_tool_schema_shapes_and_the_gateways_own_mcp_tool(sp):
    with sp.task("sdk-py-schema") as t:
        tool = run_sql_tool(t.dsn)
        params = tool.parameters
        assert params["type"] == "object" and params["required"] == ["sql"]
        assert params["properties"]["sql"]["type"] == "string"
        assert tool.openai == {
            "type": "function",
            "function": {"name": "run_sql", "description": tool.openai["function"]["description"], "parameters": params},
        }
        assert set(tool.anthropic) == {"name", "description", "input_schema"}
        assert tool.anthropic["input_schema"] == params
        assert set(tool.mcp) == {"name", "description", "inputSchema"}
        # The gateway's MCP endpoint offers a run_sql with the same one field.
        bearer = token_from_dsn(t.dsn)
        init = sp.mcp(bearer, {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "sdk", "version": "0"}}})
        assert init["result"]["protocolVersion"] == "2025-06-18"
        listed = sp.mcp(bearer, {"jsonrpc": "2.0", "id": 2, "method": "tools/list"})
        theirs = {x["name"]: x for x in listed["result"]["tools"]}["run_sql"]
        assert theirs["inputSchema"]["required"] == tool.mcp["inputSchema"]["required"]
        assert set(theirs) >= set(tool.mcp)
        assert "DSN" not in repr(tool) and t.dsn not in repr(tool)
        # Errors come back as text the model can read; the session survives them.
        assert tool({"sql": "select * from no_such_table"}).startswith("ERROR 42P01: ")
        assert tool(sql="create temp table n(x int)") == "CREATE TABLE"
        assert tool("insert into n values (1), (2)") == "INSERT 0 2"
        assert tool({"sql": "select count(*) as c from n"}) == "c\n2\n(1 row)"
        tool.close()


def test_cap_notice_reaches_the_model(sp):
    with sp.task("sdk-py-caps", max_rows=5) as t, run_sql_tool(t.dsn) as tool:
        out = tool({"sql": "select g from generate_series(1, 50) g"})
        lines = out.splitlines()
        assert lines[:7] == ["g", "1", "2", "3", "4", "5", "(5 rows)"], out
        notice = [x for x in lines if "01000" in x]
        assert len(notice) == 1 and "5 rows" in notice[0], out


def test_review_approve_promote_dry_run_and_statements(sp):
    with sp.task("sdk-py-review") as t, run_sql_tool(t.dsn) as tool:
        assert tool("insert into items values (5001, 'from the sdk')") == "INSERT 0 1"
        with pytest.raises(ConflictError) as live:
            sp.approve(t.id, "too early")
        assert live.value.status == 409 and live.value.message
    rec = sp.review(t.id)
    assert rec.state == "needs_review" and rec.token == t.id
    assert rec.capture is not None and rec.capture.complete is True and rec.capture.rows == 1
    with pytest.raises(BadRequestError) as no_comment:
        sp.reject(t.id, "")
    assert no_comment.value.status == 400
    rec = sp.approve(t.id, "fine")
    assert rec.state == "approved"
    assert [e.action for e in rec.trail] == ["approved"]
    # Decisions are final: no second decision.
    with pytest.raises(ConflictError) as again:
        sp.reject(t.id, "check first")
    assert again.value.status == 409
    rep = sp.promote(t.id, target=os.environ.get("SANDPIT_TEST_TARGET", "default"), dry_run=True)
    assert rep.outcome == "dry_run" and rep.dry_run is True, rep
    assert rep.counts.inserted == 1 and rep.counts.deleted == 0, rep
    assert sp.review(t.id).state == "approved"
    assert t.id in [r.token for r in sp.reviews()]
    log = sp.statements(t.id)
    mine = [s for s in log if s.text and "from the sdk" in s.text]
    assert len(mine) == 1 and mine[0].outcome.tag == "INSERT 0 1" and mine[0].kind == "write"
    page, nxt = sp.statements_page(t.id, after=0, limit=1)
    assert len(page) == 1 and nxt == page[0].seq
    diff = sp.diff(t.id)
    assert isinstance(diff, dict)
    assert "5001" in sp.diff(t.id, format="sql")


def test_error_classes(sp):
    bad = Sandpit(admin_key="not-the-key-" + "x" * 30)
    with pytest.raises(UnauthorizedError) as e:
        bad.tokens()
    assert e.value.status == 401 and e.value.message
    with pytest.raises(NotFoundError) as e:
        sp.token("sp_nosuchtoken")
    assert e.value.status == 404 and e.value.message
    assert isinstance(e.value, sandpit.SandpitError)
    with pytest.raises(BadRequestError):
        sp.issue(sandpit.IssueRequest(task="sdk-py-bad", max_rows=0))


def test_operator_calls(sp):
    assert sp.healthz().strip() == "ok"
    assert "sandpit_" in sp.metrics()
    goldens = sp.goldens()
    assert any(g.active for g in goldens) and goldens[0].kind == "sql"
    rep = sp.reap(dry_run=True)
    assert rep.dry_run is True and isinstance(rep.backends, int)


def test_the_fixture_gives_a_database(sandpit_dsn):
    with psycopg.connect(sandpit_dsn, autocommit=True) as c:
        c.execute("create table fixture_mark(x int)")


@pytest.mark.sandpit(max_rows=3)
def test_the_fixture_gives_each_test_its_own(sandpit_dsn, sandpit_task, sp):
    with psycopg.connect(sandpit_dsn, autocommit=True) as c:
        assert c.execute("select to_regclass('fixture_mark') is null").fetchone()[0] is True
    assert sp.token(sandpit_task.id).max_rows == 3
