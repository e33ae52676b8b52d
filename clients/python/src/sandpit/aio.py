"""The asyncio client: `AsyncSandpit` has `Sandpit`'s methods as coroutines (each call runs
the blocking urllib request in a worker thread) and `AsyncTask`, an async context manager."""

from __future__ import annotations

import asyncio
from typing import Any, Callable, Dict, List, Optional, Tuple, TypeVar, Union

from . import models as m
from .client import DEFAULT_TIMEOUT, Sandpit, Task

R = TypeVar("R")


class AsyncSandpit:
    """`Sandpit` for asyncio: `await client.review(id)`, `async with client.task(...)`."""

    def __init__(self, api: Optional[str] = None, admin_key: Optional[str] = None, timeout: float = DEFAULT_TIMEOUT) -> None:
        self.sync = Sandpit(api, admin_key, timeout)

    @property
    def api(self) -> str:
        return self.sync.api

    def task(self, name: str, **options: Any) -> "AsyncTask":
        """Like `Sandpit.task` (same options); use as `async with`."""
        return AsyncTask(self.sync.task(name, **options))

    async def _run(self, fn: Callable[..., R], *args: Any, **kw: Any) -> R:
        return await asyncio.to_thread(fn, *args, **kw)

    async def issue(self, request: m.IssueRequest) -> m.Token:
        return await self._run(self.sync.issue, request)

    async def tokens(self) -> List[m.Token]:
        return await self._run(self.sync.tokens)

    async def token(self, id: str) -> m.Token:
        return await self._run(self.sync.token, id)

    async def revoke(self, id: str) -> m.Token:
        return await self._run(self.sync.revoke, id)

    async def discard(self, id: str) -> m.Token:
        return await self._run(self.sync.discard, id)

    async def goldens(self) -> List[m.Golden]:
        return await self._run(self.sync.goldens)

    async def build_golden(self, request: m.GoldenBuild) -> m.Golden:
        return await self._run(self.sync.build_golden, request)

    async def use_golden(self, id: str) -> m.Golden:
        return await self._run(self.sync.use_golden, id)

    async def reap(self, dry_run: bool = False) -> m.ReapReport:
        return await self._run(self.sync.reap, dry_run)

    async def statements_page(
        self, id: str, after: int = 0, limit: Optional[int] = None
    ) -> Tuple[List[m.Statement], Optional[int]]:
        return await self._run(self.sync.statements_page, id, after, limit)

    async def statements(self, id: str) -> List[m.Statement]:
        return await self._run(self.sync.statements, id)

    async def diff(
        self, id: str, format: str = "json", scan: Optional[str] = None, verify: Optional[bool] = None
    ) -> Union[Dict[str, Any], str]:
        return await self._run(self.sync.diff, id, format, scan, verify)

    async def reviews(self) -> List[m.ReviewSummary]:
        return await self._run(self.sync.reviews)

    async def review(self, id: str) -> m.ReviewRecord:
        return await self._run(self.sync.review, id)

    async def approve(self, id: str, comment: Optional[str] = None) -> m.ReviewRecord:
        return await self._run(self.sync.approve, id, comment)

    async def reject(self, id: str, comment: str) -> m.ReviewRecord:
        return await self._run(self.sync.reject, id, comment)

    async def promote(
        self,
        id: str,
        target: Optional[str] = None,
        dsn: Optional[str] = None,
        role: Optional[str] = None,
        dry_run: bool = False,
    ) -> m.PromoteReport:
        return await self._run(self.sync.promote, id, target, dsn, role, dry_run)

    async def healthz(self) -> str:
        return await self._run(self.sync.healthz)

    async def metrics(self) -> str:
        return await self._run(self.sync.metrics)

    async def mcp(self, token: str, message: Any, protocol_version: str = "2025-06-18") -> Optional[Any]:
        return await self._run(self.sync.mcp, token, message, protocol_version)


class AsyncTask:
    """`Task` as an async context manager; revokes on exit, cancellation included."""

    def __init__(self, task: Task) -> None:
        self.inner = task

    @property
    def id(self) -> str:
        return self.inner.id

    @property
    def dsn(self) -> str:
        return self.inner.dsn

    @property
    def token(self) -> Optional[m.Token]:
        return self.inner.token

    async def __aenter__(self) -> "AsyncTask":
        await asyncio.to_thread(self.inner.__enter__)
        return self

    async def __aexit__(self, *exc: Any) -> None:
        # Shielded: a cancelled task still gets its token revoked.
        await asyncio.shield(asyncio.to_thread(self.inner.close, exc[0] is not None))
