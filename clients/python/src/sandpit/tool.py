"""`run_sql_tool(dsn)`: the one-field `run_sql` tool an agent gets, with its JSON schema in
the shapes agent frameworks take, and the gateway's cap notice passed back in the result.

Needs psycopg 3 (`pip install 'sandpit-client[sql]'`); imported only when the tool runs.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any, Dict, List, Mapping, Union

NAME = "run_sql"
DESCRIPTION = (
    "Run SQL on your own scratch copy of the database. Nothing you do here reaches "
    "production; the copy is deleted when the task ends. Large results are cut by the "
    "gateway, and a NOTICE in the result says so."
)
PARAMETERS: Dict[str, Any] = {
    "type": "object",
    "properties": {"sql": {"type": "string", "description": "The SQL to run"}},
    "required": ["sql"],
    "additionalProperties": False,
}


class SqlTool:
    """Call it with the model's tool input (`{"sql": ...}`) or a string; get text back.

    One database session, opened on first use and reopened if it dropped, so session state
    (temp tables, SET) lasts across calls; `close()` (or `with`) ends it.
    """

    def __init__(self, dsn: str, max_rows_shown: int = 50, connect_timeout: int = 30) -> None:
        self._dsn = dsn  # kept out of repr and of anything the model sees
        self.max_rows_shown = max_rows_shown
        self.connect_timeout = connect_timeout
        self._conn: Any = None
        self._notices: List[str] = []
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return "SqlTool(run_sql)"

    # --- schemas -----------------------------------------------------------------------

    @property
    def name(self) -> str:
        return NAME

    @property
    def parameters(self) -> Dict[str, Any]:
        """The JSON schema of the tool's input."""
        out: Dict[str, Any] = _copy(PARAMETERS)
        return out

    @property
    def openai(self) -> Dict[str, Any]:
        """OpenAI Chat Completions function tool."""
        return {
            "type": "function",
            "function": {"name": NAME, "description": DESCRIPTION, "parameters": self.parameters},
        }

    @property
    def anthropic(self) -> Dict[str, Any]:
        """Anthropic Messages API tool definition."""
        return {"name": NAME, "description": DESCRIPTION, "input_schema": self.parameters}

    @property
    def mcp(self) -> Dict[str, Any]:
        """MCP tool description (an item of `tools/list`)."""
        return {"name": NAME, "description": DESCRIPTION, "inputSchema": self.parameters}

    # --- running -------------------------------------------------------------------------

    def __call__(self, args: Union[Mapping[str, Any], str, None] = None, **kw: Any) -> str:
        sql = args if isinstance(args, str) else dict(args or {}, **kw).get("sql")
        if not isinstance(sql, str) or not sql.strip():
            return "ERROR: run_sql needs a non-empty `sql` string"
        with self._lock:
            return self._run(sql)

    async def acall(self, args: Union[Mapping[str, Any], str, None] = None, **kw: Any) -> str:
        """`__call__` in a worker thread, for asyncio agent loops."""
        return await asyncio.to_thread(self.__call__, args, **kw)

    def _connect(self) -> Any:
        import psycopg  # optional dependency

        if self._conn is None or self._conn.closed:
            self._conn = psycopg.connect(self._dsn, autocommit=True, connect_timeout=self.connect_timeout)
            self._conn.add_notice_handler(self._on_notice)
        return self._conn

    def _on_notice(self, diag: Any) -> None:
        self._notices.append(f"{diag.severity or 'NOTICE'} {diag.sqlstate or ''}: {diag.message_primary}")

    def _run(self, sql: str) -> str:
        import psycopg

        self._notices.clear()
        try:
            conn = self._connect()
            with conn.cursor() as cur:
                cur.execute(sql)  # no parameters: sent as is, several statements allowed
                text = self._render(cur)
        except psycopg.Error as e:
            diag = getattr(e, "diag", None)
            code = getattr(e, "sqlstate", None) or "?"
            msg = (diag.message_primary if diag is not None else None) or str(e).strip()
            text = f"ERROR {code}: {msg}"
            if diag is not None and diag.message_detail:
                text += f"\nDETAIL: {diag.message_detail}"
            if diag is not None and diag.message_hint:
                text += f"\nHINT: {diag.message_hint}"
            if self._conn is not None and self._conn.closed:
                self._conn = None
        # The gateway's cap notice (01000) tells the model its result was cut.
        return "\n".join([text, *self._notices])

    def _render(self, cur: Any) -> str:
        parts: List[str] = []
        while True:
            if cur.description is None:
                parts.append(cur.statusmessage or "OK")
            else:
                parts.append(self._table(cur))
            if not cur.nextset():
                break
        return "\n".join(parts)

    def _table(self, cur: Any) -> str:
        names = [d.name for d in cur.description]
        rows = cur.fetchall()
        lines = [" | ".join(names)]
        for row in rows[: self.max_rows_shown]:
            lines.append(" | ".join("NULL" if v is None else str(v) for v in row))
        n = len(rows)
        if n > self.max_rows_shown:
            lines.append(f"({n} rows; showing {self.max_rows_shown})")
        else:
            lines.append(f"({n} row{'' if n == 1 else 's'})")
        return "\n".join(lines)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def __enter__(self) -> "SqlTool":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def run_sql_tool(dsn: str, max_rows_shown: int = 50) -> SqlTool:
    """The `run_sql` tool bound to `dsn`: `tool({"sql": ...})`, `tool.openai`, `tool.anthropic`,
    `tool.mcp`. The DSN stays inside; the model only ever sees the tool."""
    return SqlTool(dsn, max_rows_shown=max_rows_shown)


def _copy(v: Any) -> Any:
    if isinstance(v, dict):
        return {k: _copy(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_copy(x) for x in v]
    return v


__all__ = ["SqlTool", "run_sql_tool", "NAME", "DESCRIPTION", "PARAMETERS"]
