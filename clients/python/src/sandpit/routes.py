"""The route table every client call goes through, and `surface()`, its machine-readable form.

A call names its route here; the table gives method, path, body model, query and header
parameters and response model. `surface()` reports that, with each model's fields read from
the dataclasses themselves, so tests/operator/sdk.rs can compare it with docs/api.yaml.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple, Type

from . import models as m


@dataclass(frozen=True)
class Route:
    method: str
    path: str
    # Request body model (JSON), if any.
    body: Optional[Type[m.Model]] = None
    query: Tuple[str, ...] = ()
    headers: Tuple[str, ...] = ()
    # Response model (a list of them when `many`); None: untyped JSON or text.
    response: Optional[Type[m.Model]] = None
    many: bool = False
    # "admin" (admin or reviewer key), "none", or "token" (the whole token, /mcp).
    auth: str = "admin"


ROUTES: Dict[str, Route] = {
    "issue_token": Route("POST", "/v1/tokens", body=m.IssueRequest, response=m.Token),
    "list_tokens": Route("GET", "/v1/tokens", response=m.Token, many=True),
    "show_token": Route("GET", "/v1/tokens/{id}", response=m.Token),
    "revoke_token": Route("DELETE", "/v1/tokens/{id}", response=m.Token),
    "discard_token": Route("POST", "/v1/tokens/{id}/discard", response=m.Token),
    "list_goldens": Route("GET", "/v1/goldens", response=m.Golden, many=True),
    "build_golden": Route("POST", "/v1/goldens", body=m.GoldenBuild, response=m.Golden),
    "use_golden": Route("POST", "/v1/goldens/{id}/use", response=m.Golden),
    "reap": Route("POST", "/v1/reap", query=("dry_run",), response=m.ReapReport),
    "statements": Route(
        "GET", "/v1/tokens/{id}/statements", query=("after", "limit"), response=m.Statement, many=True
    ),
    "diff": Route("GET", "/v1/tokens/{id}/diff", query=("format", "scan", "verify")),
    "reviews": Route("GET", "/v1/reviews", response=m.ReviewSummary, many=True),
    "review": Route("GET", "/v1/tokens/{id}/review", response=m.ReviewRecord),
    "approve": Route("POST", "/v1/tokens/{id}/approve", body=m.Decision, response=m.ReviewRecord),
    "reject": Route("POST", "/v1/tokens/{id}/reject", body=m.Decision, response=m.ReviewRecord),
    "promote": Route(
        "POST", "/v1/tokens/{id}/promote", body=m.PromoteRequest, response=m.PromoteReport
    ),
    "metrics": Route("GET", "/metrics", auth="none"),
    "healthz": Route("GET", "/healthz", auth="none"),
    "mcp": Route("POST", "/mcp", headers=("MCP-Protocol-Version",), auth="token"),
}


def model_fields(model: Type[m.Model], prefix: str = "") -> List[str]:
    """Field names of `model`, nested models' fields as `outer.inner` too."""
    out: List[str] = []
    for name in model.json_fields():
        out.append(prefix + name)
        sub = model.NESTED.get(name)
        if sub is not None:
            out.extend(model_fields(sub, prefix + name + "."))
    return out


def surface() -> List[Dict[str, Any]]:
    """Every route this SDK calls, with the request and response fields it knows."""
    return [
        {
            "name": name,
            "method": r.method,
            "path": r.path,
            "request": model_fields(r.body) if r.body else [],
            "query": list(r.query),
            "headers": list(r.headers),
            "response": model_fields(r.response) if r.response else [],
        }
        for name, r in ROUTES.items()
    ]
