"""The SDK's suite runs against a real gateway: tests/operator/sdk.rs starts one and sets
SANDPIT_API and SANDPIT_ADMIN_KEY; without them the suite fails rather than skips."""

import os

import pytest


def pytest_sessionstart(session):
    if not os.environ.get("SANDPIT_API") or not os.environ.get("SANDPIT_ADMIN_KEY"):
        raise pytest.UsageError("set SANDPIT_API and SANDPIT_ADMIN_KEY (tests/operator/sdk.rs does)")
