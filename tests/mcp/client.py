"""Drive sandpit's MCP server with the official MCP Python SDK (mcp 2.x) and print what
was seen as one JSON object; tests/agent/mcp.rs asserts on it.

    client.py stdio <sandpit binary>      (token DSN in SANDPIT_DSN, API URL in SANDPIT_API)
    client.py http <url of /mcp>          (token <id>.<secret> in SANDPIT_TOKEN)
"""

import asyncio
import json
import os
import sys

import httpx2
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client


def text_of(result):
    return "\n".join(c.text for c in result.content if getattr(c, "type", None) == "text")


async def scenario(read, write):
    out = {}
    async with ClientSession(read, write) as session:
        init = await session.initialize()
        out["protocol_version"] = init.protocol_version
        out["server_name"] = init.server_info.name
        await session.send_ping()
        tools = await session.list_tools()
        out["tools"] = {t.name: t.input_schema for t in tools.tools}

        async def call(name, args):
            r = await session.call_tool(name, args)
            return {"text": text_of(r), "is_error": bool(r.is_error)}

        out["count_before"] = await call("run_sql", {"sql": "select count(*) as n from refunds"})
        out["delete"] = await call("run_sql", {"sql": "delete from refunds where id <= 10"})
        out["count_after"] = await call("run_sql", {"sql": "select count(*) as n from refunds"})
        out["capped"] = await call("run_sql", {"sql": "select * from orders"})
        out["error"] = await call("run_sql", {"sql": "select * from no_such_table"})
        out["after_error"] = await call("run_sql", {"sql": "select 1 as one"})
        out["describe"] = await call("describe_schema", {})
        if "review_changes" in out["tools"]:
            out["review"] = await call("review_changes", {})
        try:
            r = await session.call_tool("run_sql", {"sql": "select 1", "dsn": "postgresql://elsewhere"})
            out["extra_field"] = {"text": text_of(r), "is_error": bool(r.is_error)}
        except Exception as e:  # the server refuses with a JSON-RPC error: invalid params
            out["extra_field"] = {"exception": str(e)}
    return out


async def main():
    mode = sys.argv[1]
    if mode == "stdio":
        params = StdioServerParameters(
            command=sys.argv[2],
            args=["mcp"],
            env={"SANDPIT_DSN": os.environ["SANDPIT_DSN"], "SANDPIT_API": os.environ["SANDPIT_API"]},
        )
        async with stdio_client(params) as (read, write):
            out = await scenario(read, write)
    elif mode == "http":
        headers = {"Authorization": "Bearer " + os.environ["SANDPIT_TOKEN"]}
        async with httpx2.AsyncClient(headers=headers, timeout=120) as http:
            async with streamable_http_client(sys.argv[2], http_client=http) as streams:
                out = await scenario(streams[0], streams[1])
    else:
        raise SystemExit(f"unknown mode {mode}")
    print(json.dumps(out))


asyncio.run(main())
