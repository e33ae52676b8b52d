"""pytest plugin (entry point `pytest11`): a throwaway sandpit database per test.

    def test_refunds(sandpit_dsn):
        with psycopg.connect(sandpit_dsn) as conn: ...

Needs `SANDPIT_API` and `SANDPIT_ADMIN_KEY`. `@pytest.mark.sandpit(ttl=..., max_rows=...)`
passes token options (those of `Sandpit.task`). The token is revoked when the test ends.
"""

from __future__ import annotations

import os
import re
from typing import Any, Iterator

import pytest

from .client import Sandpit


def pytest_configure(config: Any) -> None:
    config.addinivalue_line("markers", "sandpit(**options): token options for the sandpit_dsn fixture")


@pytest.fixture(scope="session")
def sandpit_client() -> Sandpit:
    """A `Sandpit` client from the environment; a test asking for it without one fails."""
    if not os.environ.get("SANDPIT_ADMIN_KEY"):
        pytest.fail("sandpit_client: set SANDPIT_API and SANDPIT_ADMIN_KEY", pytrace=False)
    return Sandpit()


@pytest.fixture
def sandpit_task(request: Any, sandpit_client: Sandpit) -> Iterator[Any]:
    """The test's `Task` (id, dsn, token), revoked after the test."""
    marker = request.node.get_closest_marker("sandpit")
    options = dict(marker.kwargs) if marker else {}
    meta = dict(options.pop("meta", None) or {})
    meta.setdefault("pytest_nodeid", request.node.nodeid[:200])
    # Task names become log directory names: keep them short and plain.
    name = "pytest-" + re.sub(r"[^A-Za-z0-9_.-]+", "-", request.node.name)[:80]
    with sandpit_client.task(name, meta=meta, **options) as task:
        yield task


@pytest.fixture
def sandpit_dsn(sandpit_task: Any) -> str:
    """The DSN of a scratch database of its own for this test."""
    return str(sandpit_task.dsn)
