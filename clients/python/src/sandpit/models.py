"""Typed objects of the sandpit control API (docs/api.yaml), as dataclasses.

Each class's fields are the JSON fields of its schema, by the same names; `from_json` keeps
unknown fields in `extra` (a newer gateway may send more) and leaves absent optional ones None.
The drift test (tests/operator/sdk.rs) compares these fields with docs/api.yaml.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar, Dict, List, Optional, Type, TypeVar

T = TypeVar("T", bound="Model")


@dataclass
class Model:
    """Base: JSON <-> dataclass by field name; nested models named in `NESTED`."""

    # Field name -> model class of that field (an object, or each item of a list).
    NESTED: ClassVar[Dict[str, Type["Model"]]] = {}

    @classmethod
    def json_fields(cls) -> List[str]:
        """The JSON field names (everything but `extra`)."""
        return [f.name for f in dataclasses.fields(cls) if f.name != "extra"]

    @classmethod
    def from_json(cls: Type[T], data: Any) -> T:
        if not isinstance(data, dict):
            raise TypeError(f"{cls.__name__}: expected an object, got {type(data).__name__}")
        known = set(cls.json_fields())
        kwargs: Dict[str, Any] = {}
        for name in known:
            value = data.get(name)
            sub = cls.NESTED.get(name)
            if sub is not None and isinstance(value, list):
                value = [sub.from_json(v) if isinstance(v, dict) else v for v in value]
            elif sub is not None and isinstance(value, dict):
                value = sub.from_json(value)
            kwargs[name] = value
        obj = cls(**kwargs)
        setattr(obj, "extra", {k: v for k, v in data.items() if k not in known})
        return obj

    def to_json(self) -> Dict[str, Any]:
        """The fields that are set (None left out), nested models as objects."""
        out: Dict[str, Any] = {}
        for name in self.json_fields():
            value = getattr(self, name)
            if value is None:
                continue
            if isinstance(value, Model):
                value = value.to_json()
            elif isinstance(value, list):
                value = [v.to_json() if isinstance(v, Model) else v for v in value]
            out[name] = value
        return out


# Every field defaults to None so that `from_json` tolerates an older gateway; `extra` holds
# what this SDK does not know yet.
def _opt() -> Any:
    return field(default=None)


@dataclass
class IssueRequest(Model):
    """Body of POST /v1/tokens."""

    task: str = ""
    ttl_seconds: Optional[int] = _opt()
    max_rows: Optional[int] = _opt()
    max_bytes: Optional[int] = _opt()
    max_connections: Optional[int] = _opt()
    cap_mode: Optional[str] = _opt()
    allow: Optional[List[str]] = _opt()
    statement_timeout_ms: Optional[int] = _opt()
    idle_in_transaction_timeout_ms: Optional[int] = _opt()
    metadata: Optional[Dict[str, str]] = _opt()
    superuser: Optional[bool] = _opt()
    extra: Dict[str, Any] = field(default_factory=dict, repr=False)


@dataclass
class Token(Model):
    """A token (its `dsn` only in the answer to an issue)."""

    id: str = ""
    dsn: Optional[str] = _opt()
    task: str = ""
    metadata: Optional[Dict[str, str]] = _opt()
    created_at: Optional[str] = _opt()
    expires_at: Optional[str] = _opt()
    state: str = ""
    max_rows: Optional[int] = _opt()
    max_bytes: Optional[int] = _opt()
    max_connections: Optional[int] = _opt()
    cap_mode: Optional[str] = _opt()
    allow: Optional[List[str]] = _opt()
    statement_timeout_ms: Optional[int] = _opt()
    idle_in_transaction_timeout_ms: Optional[int] = _opt()
    backend: Optional[bool] = _opt()
    fork_count: Optional[int] = _opt()
    golden: Optional[str] = _opt()
    superuser: Optional[bool] = _opt()
    sessions: Optional[int] = _opt()
    end: Optional[str] = _opt()
    review: Optional[str] = _opt()
    ended_why: Optional[str] = _opt()
    extra: Dict[str, Any] = field(default_factory=dict, repr=False)


@dataclass
class GoldenWorker(Model):
    """One worker's copy of a golden version (a front over sandpit workers)."""

    worker: Optional[int] = _opt()
    url: Optional[str] = _opt()
    active: Optional[bool] = _opt()
    forks: Optional[int] = _opt()
    extra: Dict[str, Any] = field(default_factory=dict, repr=False)


@dataclass
class Golden(Model):
    """A golden version."""

    NESTED: ClassVar[Dict[str, Type[Model]]] = {"workers": GoldenWorker}

    id: str = ""
    kind: Optional[str] = _opt()
    created_at: Optional[str] = _opt()
    source: Optional[str] = _opt()
    active: Optional[bool] = _opt()
    forks: Optional[int] = _opt()
    schemas: Optional[List[str]] = _opt()
    exclude_tables: Optional[List[str]] = _opt()
    report: Optional[Dict[str, Any]] = _opt()
    workers: Optional[List[GoldenWorker]] = _opt()
    extra: Dict[str, Any] = field(default_factory=dict, repr=False)


@dataclass
class GoldenBuild(Model):
    """Body of POST /v1/goldens."""

    from_dsn: str = ""
    schemas: Optional[List[str]] = _opt()
    exclude_tables: Optional[List[str]] = _opt()
    mask: Optional[str] = _opt()
    activate: Optional[bool] = _opt()
    extra: Dict[str, Any] = field(default_factory=dict, repr=False)


@dataclass
class StatementOutcome(Model):
    """How a logged statement ended."""

    seq: Optional[int] = _opt()
    ts: Optional[str] = _opt()
    rows: Optional[int] = _opt()
    capped: Optional[bool] = _opt()
    duration_ms: Optional[float] = _opt()
    sqlstate: Optional[str] = _opt()
    tag: Optional[str] = _opt()
    skipped: Optional[bool] = _opt()
    denied: Optional[bool] = _opt()
    kind: Optional[str] = _opt()
    extra: Dict[str, Any] = field(default_factory=dict, repr=False)


@dataclass
class Statement(Model):
    """One record of a token's statement log, with its outcome."""

    NESTED: ClassVar[Dict[str, Type[Model]]] = {"outcome": StatementOutcome}

    seq: Optional[int] = _opt()
    ts: Optional[str] = _opt()
    token: Optional[str] = _opt()
    task: Optional[str] = _opt()
    session: Optional[int] = _opt()
    protocol: Optional[str] = _opt()
    text: Optional[str] = _opt()
    text_len: Optional[int] = _opt()
    text_sha256: Optional[str] = _opt()
    params: Optional[List[Optional[str]]] = _opt()
    kind: Optional[str] = _opt()
    kind_source: Optional[str] = _opt()
    front: Optional[str] = _opt()
    front_seq: Optional[int] = _opt()
    outcome: Optional[StatementOutcome] = _opt()
    extra: Dict[str, Any] = field(default_factory=dict, repr=False)


@dataclass
class Reaped(Model):
    """A backend a janitor pass destroyed (or would)."""

    handle: Optional[str] = _opt()
    token: Optional[str] = _opt()
    task: Optional[str] = _opt()
    reason: Optional[str] = _opt()
    extra: Dict[str, Any] = field(default_factory=dict, repr=False)


@dataclass
class Skipped(Model):
    """A backend a janitor pass left alone, and why."""

    handle: Optional[str] = _opt()
    why: Optional[str] = _opt()
    extra: Dict[str, Any] = field(default_factory=dict, repr=False)


@dataclass
class ReapReport(Model):
    """Answer of POST /v1/reap."""

    NESTED: ClassVar[Dict[str, Type[Model]]] = {"reaped": Reaped, "skipped": Skipped}

    dry_run: Optional[bool] = _opt()
    backends: Optional[int] = _opt()
    kept: Optional[int] = _opt()
    reaped: Optional[List[Reaped]] = _opt()
    vanished: Optional[List[str]] = _opt()
    dead: Optional[List[str]] = _opt()
    reviewed: Optional[List[str]] = _opt()
    review_failed: Optional[List[str]] = _opt()
    skipped: Optional[List[Skipped]] = _opt()
    errors: Optional[List[str]] = _opt()
    extra: Dict[str, Any] = field(default_factory=dict, repr=False)


@dataclass
class Decision(Model):
    """Body of POST /v1/tokens/{id}/approve and /reject."""

    comment: Optional[str] = _opt()
    extra: Dict[str, Any] = field(default_factory=dict, repr=False)


@dataclass
class PromoteRequest(Model):
    """Body of POST /v1/tokens/{id}/promote: a DSN (admin key only) or a named target."""

    dsn: Optional[str] = _opt()
    target: Optional[str] = _opt()
    role: Optional[str] = _opt()
    dry_run: Optional[bool] = _opt()
    extra: Dict[str, Any] = field(default_factory=dict, repr=False)


@dataclass
class Counts(Model):
    """What a promotion applied (or would)."""

    schema: Optional[int] = _opt()
    inserted: Optional[int] = _opt()
    updated: Optional[int] = _opt()
    deleted: Optional[int] = _opt()
    sequences: Optional[int] = _opt()
    extra: Dict[str, Any] = field(default_factory=dict, repr=False)


@dataclass
class PromoteReport(Model):
    """A promotion's report: outcome applied, dry_run, conflicts, refused or failed."""

    NESTED: ClassVar[Dict[str, Type[Model]]] = {"counts": Counts}

    outcome: str = ""
    target: Optional[str] = _opt()
    role: Optional[str] = _opt()
    dry_run: Optional[bool] = _opt()
    at: Optional[str] = _opt()
    by: Optional[str] = _opt()
    counts: Optional[Counts] = _opt()
    conflicts: Optional[List[str]] = _opt()
    conflicts_total: Optional[int] = _opt()
    refusals: Optional[List[str]] = _opt()
    error: Optional[str] = _opt()
    extra: Dict[str, Any] = field(default_factory=dict, repr=False)


@dataclass
class Event(Model):
    """One entry of a review's audit trail."""

    at: Optional[str] = _opt()
    by: Optional[str] = _opt()
    action: Optional[str] = _opt()
    comment: Optional[str] = _opt()
    extra: Dict[str, Any] = field(default_factory=dict, repr=False)


@dataclass
class ValidatorResult(Model):
    """A validator's verdict on a change."""

    name: Optional[str] = _opt()
    kind: Optional[str] = _opt()
    passed: Optional[bool] = _opt()
    detail: Optional[str] = _opt()
    extra: Dict[str, Any] = field(default_factory=dict, repr=False)


@dataclass
class CaptureInfo(Model):
    """How completely the change was captured at the token's end."""

    complete: Optional[bool] = _opt()
    reason: Optional[str] = _opt()
    rows: Optional[int] = _opt()
    schema_changes: Optional[int] = _opt()
    masked: Optional[List[str]] = _opt()
    extra: Dict[str, Any] = field(default_factory=dict, repr=False)


@dataclass
class ReviewRecord(Model):
    """A token's review record: state, audit trail, validators, capture, promotions."""

    NESTED: ClassVar[Dict[str, Type[Model]]] = {
        "trail": Event,
        "validators": ValidatorResult,
        "capture": CaptureInfo,
        "promotions": PromoteReport,
    }

    token: str = ""
    task: Optional[str] = _opt()
    golden: Optional[str] = _opt()
    state: str = ""
    trail: Optional[List[Event]] = _opt()
    validators: Optional[List[ValidatorResult]] = _opt()
    validated_at: Optional[str] = _opt()
    capture: Optional[CaptureInfo] = _opt()
    promotions: Optional[List[PromoteReport]] = _opt()
    extra: Dict[str, Any] = field(default_factory=dict, repr=False)


@dataclass
class ReviewSummary(Model):
    """One row of GET /v1/reviews (fields beyond these land in `extra`)."""

    NESTED: ClassVar[Dict[str, Type[Model]]] = {"last": Event}

    token: str = ""
    task: Optional[str] = _opt()
    token_state: Optional[str] = _opt()
    golden: Optional[str] = _opt()
    state: Optional[str] = _opt()
    schema_changes: Optional[int] = _opt()
    rows_changed: Optional[int] = _opt()
    validators_failed: Optional[int] = _opt()
    last: Optional[Event] = _opt()
    extra: Dict[str, Any] = field(default_factory=dict, repr=False)
