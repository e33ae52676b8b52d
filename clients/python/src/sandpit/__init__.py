"""sandpit harness SDK: a throwaway Postgres database per agent task, through the gateway's
control API (docs/api.yaml). `Sandpit` / `AsyncSandpit`, `run_sql_tool`, typed models and
error classes; `surface()` lists every route and field this SDK implements."""

from .aio import AsyncSandpit, AsyncTask
from .client import Sandpit, Task, token_from_dsn
from .errors import (
    BadRequestError,
    ConflictError,
    ForbiddenError,
    NotFoundError,
    SandpitConnectionError,
    SandpitError,
    ServerError,
    UnauthorizedError,
)
from .models import (
    CaptureInfo,
    Counts,
    Decision,
    Event,
    Golden,
    GoldenBuild,
    GoldenWorker,
    IssueRequest,
    PromoteReport,
    PromoteRequest,
    ReapReport,
    ReviewRecord,
    ReviewSummary,
    Statement,
    StatementOutcome,
    Token,
    ValidatorResult,
)
from .routes import ROUTES, surface
from .tool import SqlTool, run_sql_tool

__version__ = "0.1.0"

__all__ = [
    "AsyncSandpit",
    "AsyncTask",
    "Sandpit",
    "Task",
    "token_from_dsn",
    "SandpitError",
    "BadRequestError",
    "UnauthorizedError",
    "ForbiddenError",
    "NotFoundError",
    "ConflictError",
    "ServerError",
    "SandpitConnectionError",
    "CaptureInfo",
    "Counts",
    "Decision",
    "Event",
    "Golden",
    "GoldenBuild",
    "GoldenWorker",
    "IssueRequest",
    "PromoteReport",
    "PromoteRequest",
    "ReapReport",
    "ReviewRecord",
    "ReviewSummary",
    "Statement",
    "StatementOutcome",
    "Token",
    "ValidatorResult",
    "ROUTES",
    "surface",
    "SqlTool",
    "run_sql_tool",
]
