"""The asyncio client: `AsyncSandpit` has `Sandpit`'s methods as coroutines (each call runs
the blocking urllib request in a worker thread) and `AsyncTask`, an async context manager."""

from __future__ import annotations

import asyncio
import functools
from typing import Any, Callable, Optional, TypeVar

from . import models as m
from .client import Sandpit, Task

R = TypeVar("R")


class AsyncSandpit:
    """`Sandpit` for asyncio: `await client.review(id)`, `async with client.task(...)`."""

    def __init__(self, api: Optional[str] = None, admin_key: Optional[str] = None, **kw: Any) -> None:
        self.sync = Sandpit(api, admin_key, **kw)

    @property
    def api(self) -> str:
        return self.sync.api

    def task(self, name: str, **kw: Any) -> "AsyncTask":
        """Like `Sandpit.task`; use as `async with`."""
        return AsyncTask(self.sync.task(name, **kw))

    def __getattr__(self, name: str) -> Callable[..., Any]:
        # Every other public method of Sandpit, as a coroutine function.
        fn = getattr(self.sync, name)
        if name.startswith("_") or not callable(fn):
            raise AttributeError(name)

        @functools.wraps(fn)
        async def run(*args: Any, **kwargs: Any) -> Any:
            return await asyncio.to_thread(fn, *args, **kwargs)

        return run


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
