"""The pieces every SWE row model shares: the error a bad row raises, the test-list form, the
field types of pydantic row models, and how a pydantic error becomes a RowError naming the field.

Nothing here knows a dataset; the adapters (swe.adapters) build their row models from it."""

from __future__ import annotations

import datetime as dt
import json
import re
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, ValidationError

__all__ = ["InstanceId", "NonEmptyStr", "Repo", "RowError", "RowModel", "TestIds", "jsonable",
           "listed_tests", "row_error", "valid_instance_id"]

_INSTANCE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")
_REPO = re.compile(r"^[A-Za-z0-9_.\-]+/[A-Za-z0-9_.\-]+$")


class RowError(ValueError):
    """A row that cannot be used: where it is, its instance_id (when valid) and the field."""

    def __init__(self, msg: str, *, field: str | None = None, where: str | None = None,
                 instance_id: str | None = None) -> None:
        self.msg, self.field, self.where, self.instance_id = msg, field, where, instance_id
        head = " ".join(p for p in (where, f"(instance_id={instance_id})" if instance_id else None) if p)
        body = f"field {field!r}: {msg}" if field else msg
        super().__init__(f"{head}: {body}" if head else body)

    def brief(self) -> str:
        """`<where>: <field>: <msg>`, the one-line form `swarl enqueue` and `swarl eval` print."""
        return ": ".join(p for p in (self.where, self.field, self.msg) if p)

    def as_dict(self) -> dict[str, Any]:
        return {"where": self.where, "instance_id": self.instance_id, "field": self.field,
                "error": self.msg}


def check_tests_and_scripts(row: dict[str, Any], scripts: tuple[str, ...]) -> None:
    """What every graded family asks of a row beyond its model: a FAIL_TO_PASS that can show the
    issue resolved, and each of `scripts` (the row's own test command) non-empty when present."""
    if not listed_tests(row, "FAIL_TO_PASS"):
        raise RowError("empty: nothing would show the issue resolved", field="FAIL_TO_PASS")
    for fld in scripts:
        if row.get(fld) is not None and not row[fld].strip():
            raise RowError("must not be empty when present", field=fld)


def listed_tests(row: dict[str, Any], key: str) -> list[str]:
    """FAIL_TO_PASS / PASS_TO_PASS as a list: a JSON-encoded string (SWE-bench) or a list (SWE-Gym)."""
    value = row.get(key)
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise RowError(f"not a JSON list of test ids: {e.msg}", field=key) from None
    if not isinstance(value, list | tuple):
        raise RowError(f"expected a list of test ids, got {type(value).__name__}", field=key)
    bad = [t for t in value if not isinstance(t, str) or not t]
    if bad:
        raise RowError(f"test ids must be non-empty strings, got {bad[0]!r}", field=key)
    return list(value)


def jsonable(v: Any) -> Any:
    """Values from parquet / pandas (timestamps, numpy scalars and arrays) → JSON types."""
    if isinstance(v, dt.datetime | dt.date):
        return v.isoformat()
    if hasattr(v, "tolist") and not isinstance(v, str | bytes):
        return v.tolist()
    if isinstance(v, dict):
        return {str(k): jsonable(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [jsonable(x) for x in v]
    return v


# -- field types of the row models --------------------------------------------------------

def valid_instance_id(v: str) -> bool:
    return bool(_INSTANCE_ID.match(v))


def _instance_id(v: str) -> str:
    if not _INSTANCE_ID.match(v):
        raise ValueError(f"{v!r} is not a valid id (letters, digits, _ . -)")
    return v


def _not_blank(v: str) -> str:
    if not v.strip():
        raise ValueError("must not be empty")
    return v


def _repo(v: str) -> str:
    if not v.strip():
        raise ValueError("must not be empty")
    if not _REPO.match(v):
        raise ValueError(f"{v!r} is not owner/name")
    return v


def _tests(v: Any) -> Any:
    """Either form is kept as given (the row is returned as it came); only checked here."""
    try:
        listed_tests({"t": v}, "t")
    except RowError as e:
        raise ValueError(e.msg) from None
    return v


InstanceId = Annotated[str, AfterValidator(_instance_id)]
NonEmptyStr = Annotated[str, AfterValidator(_not_blank)]
Repo = Annotated[str, AfterValidator(_repo)]
# A list of test ids, or its JSON encoding (SWE-bench's form): both accepted and kept.
TestIds = Annotated[Any, BeforeValidator(_tests)]


class RowModel(BaseModel):
    """Base of the row models: strict types (a float `version` is refused: 3.10 and 3.1 would be
    the same number), other fields allowed and kept."""

    model_config = ConfigDict(strict=True, extra="allow")


def row_error(e: ValidationError, *, where: str | None, instance_id: str | None) -> RowError:
    """The first error of a row model's validation as a RowError naming the field."""
    err = e.errors(include_url=False)[0]
    field = ".".join(str(p) for p in err["loc"]) or None
    kind, value = err["type"], err.get("input")
    if kind == "missing":
        msg = "missing (a required field)"
    elif kind.endswith("_type") and kind != "model_type":
        msg = f"must be a {kind.removesuffix('_type').replace('_', ' ')}, got {type(value).__name__}"
    elif kind == "value_error":
        msg = str(err["msg"]).removeprefix("Value error, ")
    else:
        msg = str(err["msg"])
    return RowError(msg, field=field, where=where, instance_id=instance_id)
