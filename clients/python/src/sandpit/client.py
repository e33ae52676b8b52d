"""The synchronous client: `Sandpit` (the control API over urllib) and `Task`, the context
manager that issues a token and revokes it however the block ends."""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Type, TypeVar, Union

from . import models as m
from .errors import NotFoundError, SandpitError, error_for
from .routes import ROUTES

DEFAULT_API = "http://127.0.0.1:6433"
M = TypeVar("M", bound=m.Model)
# Long enough for a golden build or a promotion, which answer when done.
DEFAULT_TIMEOUT = 600.0


def token_from_dsn(dsn: str) -> str:
    """The whole token `<id>.<secret>` of a DSN (its user and password joined by a dot)."""
    u = urllib.parse.urlsplit(dsn)
    if not u.username or not u.password:
        raise ValueError("not a sandpit DSN: no user and password")
    return f"{urllib.parse.unquote(u.username)}.{urllib.parse.unquote(u.password)}"


class Response:
    """A decoded answer: status, headers, body (JSON value or text)."""

    def __init__(self, status: int, headers: Mapping[str, str], body: Any) -> None:
        self.status = status
        self.headers = headers
        self.body = body


class Sandpit:
    """Client of the sandpit control API. `api` and `admin_key` default to the environment
    (`SANDPIT_API`, `SANDPIT_ADMIN_KEY`); a reviewer key works for the review calls."""

    def __init__(
        self,
        api: Optional[str] = None,
        admin_key: Optional[str] = None,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> None:
        self.api = (api or os.environ.get("SANDPIT_API") or DEFAULT_API).rstrip("/")
        self.admin_key = admin_key if admin_key is not None else os.environ.get("SANDPIT_ADMIN_KEY", "")
        self.timeout = timeout

    # --- transport -------------------------------------------------------------------------

    def call(
        self,
        route: str,
        id: Optional[str] = None,
        body: Optional[Any] = None,
        query: Optional[Mapping[str, Any]] = None,
        headers: Optional[Mapping[str, str]] = None,
        bearer: Optional[str] = None,
    ) -> Response:
        """One request along `ROUTES[route]`; raises a `SandpitError` subclass on 4xx/5xx."""
        r = ROUTES[route]
        path = r.path
        if "{id}" in path:
            if not id:
                raise ValueError(f"{route} needs an id")
            path = path.replace("{id}", urllib.parse.quote(id, safe=""))
        url = self.api + path
        q = {k: _query_value(v) for k, v in (query or {}).items() if v is not None}
        unknown = set(q) - set(r.query)
        if unknown:
            raise ValueError(f"{route}: unknown query parameters {sorted(unknown)}")
        if q:
            url += "?" + urllib.parse.urlencode(q)
        data = None
        if body is not None:
            data = json.dumps(body.to_json() if isinstance(body, m.Model) else body).encode()
        req = urllib.request.Request(url, data=data, method=r.method)
        if r.auth == "admin":
            req.add_header("Authorization", "Bearer " + self.admin_key)
        elif r.auth == "token" and bearer:
            req.add_header("Authorization", "Bearer " + bearer)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        for k, v in (headers or {}).items():
            req.add_header(k, v)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                return Response(resp.status, dict(resp.headers), _decode(resp.read(), resp.headers))
        except urllib.error.HTTPError as e:
            raw = e.read()
            payload = _decode(raw, e.headers)
            msg = payload.get("error") if isinstance(payload, dict) else None
            if not isinstance(msg, str):
                msg = raw.decode("utf-8", "replace").strip() or (e.reason or "")
            raise error_for(e.code, str(msg), r.method, path) from None
        except (urllib.error.URLError, OSError) as e:
            reason = getattr(e, "reason", e)
            raise error_for(0, str(reason), r.method, path) from None

    def _one(self, route: str, cls: Type[M], **kw: Any) -> M:
        """A call whose answer is one `cls` (the route table's response model)."""
        _check_model(route, cls, many=False)
        return cls.from_json(self.call(route, **kw).body)

    def _many(self, route: str, cls: Type[M], **kw: Any) -> List[M]:
        """A call whose answer is a list of `cls`."""
        _check_model(route, cls, many=True)
        body = self.call(route, **kw).body
        if not isinstance(body, list):
            raise SandpitError(0, f"{route}: expected a list, got {type(body).__name__}")
        return [cls.from_json(x) for x in body]

    # --- tokens ----------------------------------------------------------------------------

    def issue(self, request: m.IssueRequest) -> m.Token:
        """POST /v1/tokens: a new token, with its DSN (the only time it is shown)."""
        return self._one("issue_token", m.Token, body=request)

    def tokens(self) -> List[m.Token]:
        return self._many("list_tokens", m.Token)

    def token(self, id: str) -> m.Token:
        return self._one("show_token", m.Token, id=id)

    def revoke(self, id: str) -> m.Token:
        """Ends the token's sessions and destroys its scratch database; the log is kept."""
        return self._one("revoke_token", m.Token, id=id)

    def discard(self, id: str) -> m.Token:
        """Destroys an ended token's scratch data whose review keeps failing (no review)."""
        return self._one("discard_token", m.Token, id=id)

    def task(
        self,
        name: str,
        ttl: Optional[int] = 900,
        max_rows: Optional[int] = None,
        max_bytes: Optional[int] = None,
        max_connections: Optional[int] = None,
        cap_mode: Optional[str] = None,
        allow: Optional[Sequence[str]] = None,
        statement_timeout_ms: Optional[int] = None,
        idle_in_transaction_timeout_ms: Optional[int] = None,
        superuser: Optional[bool] = None,
        meta: Optional[Mapping[str, str]] = None,
    ) -> "Task":
        """A context manager: issues a token on entry, revokes it on exit (however it exits)."""
        req = m.IssueRequest(
            task=name,
            ttl_seconds=ttl,
            max_rows=max_rows,
            max_bytes=max_bytes,
            max_connections=max_connections,
            cap_mode=cap_mode,
            allow=list(allow) if allow is not None else None,
            statement_timeout_ms=statement_timeout_ms,
            idle_in_transaction_timeout_ms=idle_in_transaction_timeout_ms,
            metadata=dict(meta) if meta is not None else None,
            superuser=superuser,
        )
        return Task(self, req)

    # --- goldens and the janitor ---------------------------------------------------------

    def goldens(self) -> List[m.Golden]:
        return self._many("list_goldens", m.Golden)

    def build_golden(self, request: m.GoldenBuild) -> m.Golden:
        return self._one("build_golden", m.Golden, body=request)

    def use_golden(self, id: str) -> m.Golden:
        return self._one("use_golden", m.Golden, id=id)

    def reap(self, dry_run: bool = False) -> m.ReapReport:
        return self._one("reap", m.ReapReport, query={"dry_run": dry_run})

    # --- statement log and review ----------------------------------------------------------

    def statements_page(
        self, id: str, after: int = 0, limit: Optional[int] = None
    ) -> Tuple[List[m.Statement], Optional[int]]:
        """One page of the log and the `after` of the next page (None: this was the last)."""
        r = self.call("statements", id=id, query={"after": after, "limit": limit})
        nxt = _header(r.headers, "Sandpit-Next-After")
        if not isinstance(r.body, list):
            raise SandpitError(0, f"statements: expected a list, got {type(r.body).__name__}")
        return [m.Statement.from_json(x) for x in r.body], int(nxt) if nxt else None

    def statements(self, id: str) -> List[m.Statement]:
        """The whole statement log of a token, page by page."""
        out: List[m.Statement] = []
        after: Optional[int] = 0
        while after is not None:
            page, after = self.statements_page(id, after)
            out.extend(page)
        return out

    def diff(
        self, id: str, format: str = "json", scan: Optional[str] = None, verify: Optional[bool] = None
    ) -> Union[Dict[str, Any], str]:
        """The token's review (diff against the golden): a dict for json, else text."""
        body = self.call("diff", id=id, query={"format": format, "scan": scan, "verify": verify}).body
        if isinstance(body, (dict, str)):
            return body
        raise SandpitError(0, f"diff: unexpected answer {type(body).__name__}")

    def reviews(self) -> List[m.ReviewSummary]:
        return self._many("reviews", m.ReviewSummary)

    def review(self, id: str) -> m.ReviewRecord:
        return self._one("review", m.ReviewRecord, id=id)

    def approve(self, id: str, comment: Optional[str] = None) -> m.ReviewRecord:
        return self._one("approve", m.ReviewRecord, id=id, body=m.Decision(comment=comment))

    def reject(self, id: str, comment: str) -> m.ReviewRecord:
        return self._one("reject", m.ReviewRecord, id=id, body=m.Decision(comment=comment))

    def promote(
        self,
        id: str,
        target: Optional[str] = None,
        dsn: Optional[str] = None,
        role: Optional[str] = None,
        dry_run: bool = False,
    ) -> m.PromoteReport:
        """Applies the approved change to a target (a name of [promote.targets], or a DSN
        with the admin key); `dry_run` commits nothing."""
        req = m.PromoteRequest(dsn=dsn, target=target, role=role, dry_run=dry_run)
        return self._one("promote", m.PromoteReport, id=id, body=req)

    # --- unauthenticated and agent-facing --------------------------------------------------

    def healthz(self) -> str:
        return str(self.call("healthz").body)

    def metrics(self) -> str:
        return str(self.call("metrics").body)

    def mcp(
        self, token: str, message: Any, protocol_version: str = "2025-06-18"
    ) -> Optional[Any]:
        """One JSON-RPC message (or batch) to POST /mcp as `token` (`<id>.<secret>`, see
        `token_from_dsn`); the decoded answer, None for 202 (notifications only)."""
        r = self.call("mcp", body=message, bearer=token, headers={"MCP-Protocol-Version": protocol_version})
        return None if r.status == 202 else r.body


class Task:
    """A token for one agent task: `dsn`, `id`, `token`; revoked when the block ends."""

    def __init__(self, client: Sandpit, request: m.IssueRequest) -> None:
        self.client = client
        self.request = request
        self.token: Optional[m.Token] = None

    @property
    def id(self) -> str:
        return self._issued().id

    @property
    def dsn(self) -> str:
        dsn = self._issued().dsn
        if not dsn:
            raise SandpitError(0, "the gateway returned no DSN")
        return dsn

    def _issued(self) -> m.Token:
        if self.token is None:
            raise RuntimeError("the task's token is not issued (use it in a with block)")
        return self.token

    def __enter__(self) -> "Task":
        self.token = self.client.issue(self.request)
        return self

    def __exit__(self, *exc: Any) -> None:
        # Runs for every exception, KeyboardInterrupt included; never hides the original.
        self.close(quiet=exc[0] is not None)

    def close(self, quiet: bool = False) -> None:
        """Revokes the token (idempotent: an already ended or unknown token is fine)."""
        if self.token is None:
            return
        try:
            self.client.revoke(self.token.id)
        except NotFoundError:
            pass
        except SandpitError:
            if not quiet:
                raise


def _check_model(route: str, cls: type, many: bool) -> None:
    """Keeps each call's model the one the route table (and so the drift test) names."""
    r = ROUTES[route]
    if r.response is not cls or r.many != many:
        raise TypeError(f"{route}: the route table says {r.response} (many={r.many}), the call {cls}")


def _query_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def _header(headers: Mapping[str, str], name: str) -> Optional[str]:
    for k, v in headers.items():
        if k.lower() == name.lower():
            return v
    return None


def _decode(raw: bytes, headers: Any) -> Any:
    ctype = (headers.get("Content-Type") if headers is not None else "") or ""
    text = raw.decode("utf-8", "replace")
    if "json" in ctype and text:
        try:
            return json.loads(text)
        except ValueError:
            return text
    return text

