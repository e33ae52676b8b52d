"""Errors of the sandpit control API as exception classes, one per status the API answers."""

from __future__ import annotations

from typing import Dict, Type


class SandpitError(Exception):
    """An API call failed: `status` is the HTTP status (0: no answer), `message` the API's."""

    def __init__(self, status: int, message: str, method: str = "", path: str = "") -> None:
        self.status = status
        self.message = message
        self.method = method
        self.path = path
        where = f"{method} {path}: " if method else ""
        super().__init__(f"sandpit API {where}{status} {message}")


class BadRequestError(SandpitError):
    """400: a bad body, query or value over its ceiling."""


class UnauthorizedError(SandpitError):
    """401: missing or wrong key (or token, for /mcp)."""


class ForbiddenError(SandpitError):
    """403: the key lacks the right (a reviewer key asking for a DSN, say)."""


class NotFoundError(SandpitError):
    """404: unknown token, golden or review."""


class ConflictError(SandpitError):
    """409: the decision or promotion is not allowed now."""


class ServerError(SandpitError):
    """5xx: the gateway failed (501: not offered by its provider)."""


class SandpitConnectionError(SandpitError):
    """The gateway did not answer (status 0)."""


_BY_STATUS: Dict[int, Type[SandpitError]] = {
    400: BadRequestError,
    401: UnauthorizedError,
    403: ForbiddenError,
    404: NotFoundError,
    409: ConflictError,
}


def error_for(status: int, message: str, method: str, path: str) -> SandpitError:
    """The exception class for `status`, built."""
    if status == 0:
        return SandpitConnectionError(status, message, method, path)
    cls = _BY_STATUS.get(status, ServerError if status >= 500 else SandpitError)
    return cls(status, message, method, path)
