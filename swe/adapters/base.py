"""What a dataset adapter is, and the registry that picks one for a row.

An adapter is one dataset family: its row model (pydantic), how a raw row is normalised into the
row swarl queues (image_name and dataset_family set, derived fields filled), the Docker image, the
eval script (the test command framed by the harness's output markers), the log parser and how
resolution is decided. `register` adds one; the family of a row is picked by `adapter_for`:

1. an explicit family (`swarl data prepare --family`, or the dataset id `--source` names when
   that id is one an adapter lists exactly in `hub_datasets`);
2. else the row's own `dataset_family` field (every prepared row carries it), or its
   `data_source` field when that names a family or a listed dataset id exactly;
3. else the row's shape: each adapter's `matches` looks at which fields the row has; exactly one
   must match, and none or several is an error that says to pass the family.

A source name is never searched for substrings ("gym", "swe-bench"): `SWE-Gym/SWE-Gym` picks
SWE-Gym because the SWE-Gym adapter lists that id, not because it contains "Gym".
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import ValidationError

from swe.grading import EvalReport
from swe.schema import RowError, RowModel, jsonable, row_error, valid_instance_id

__all__ = ["Adapter", "adapter_for", "adapters", "family_of_source", "get_adapter", "register"]

FAMILY_FIELD = "dataset_family"


class Adapter:
    """One dataset family. Subclasses set the class attributes and override what differs."""

    family: ClassVar[str]                       # the name `--family` and `dataset_family` use
    aliases: ClassVar[tuple[str, ...]] = ()     # other names accepted for it
    hub_datasets: ClassVar[dict[str, str]] = {}  # Hugging Face dataset id -> its usual split
    model: ClassVar[type[RowModel]]             # the row's fields and their types
    description: ClassVar[str] = ""             # one line: the dataset and how swarl grades it

    # -- the row ---------------------------------------------------------------------------

    def matches(self, row: dict[str, Any]) -> bool:
        """Whether the row has this family's shape (fields present or absent). The adapters'
        shapes are disjoint for the documented formats; a row two of them claim is refused."""
        return False

    def fallback_for(self, row: dict[str, Any]) -> bool:
        """Whether this family reads a row no family's shape claims (one adapter at most says
        yes: SWE-Gym, for rows in SWE-bench's format that lack its telling fields)."""
        return False

    def normalise(self, row: dict[str, Any]) -> dict[str, Any]:
        """Fill fields swarl needs that the family derives (before the model checks the row)."""
        return row

    def check(self, row: dict[str, Any]) -> None:
        """Rules across fields, after the model's; raise RowError(field=...)."""

    def validate(self, row: dict[str, Any], *, where: str | None = None) -> dict[str, Any]:
        """A JSON-safe copy of the row, checked, with image_name and dataset_family set."""
        out = self.normalise({str(k): jsonable(v) for k, v in row.items()})
        iid = out.get("instance_id")
        valid_iid = iid if isinstance(iid, str) and valid_instance_id(iid) else None
        # a required field that is null is missing (parquet and pandas write absent values as null)
        given = {k: v for k, v in out.items()
                 if not (v is None and k in self.model.model_fields and self.model.model_fields[k].is_required())}
        try:
            self.model.model_validate(given)
        except ValidationError as e:
            raise row_error(e, where=where, instance_id=valid_iid) from None
        try:
            self.check(out)
            out["image_name"] = self.image_name(out)
        except RowError as e:
            raise RowError(e.msg, field=e.field, where=where, instance_id=valid_iid) from None
        out[FAMILY_FIELD] = self.family
        return out

    # -- running and grading it --------------------------------------------------------------

    def image_name(self, row: dict[str, Any]) -> str:
        """The Docker image the row runs in (the row's own `image_name` wins)."""
        if row.get("image_name"):
            return str(row["image_name"])
        raise RowError("missing: this family has no image naming rule", field="image_name")

    def setup_script(self, row: dict[str, Any]) -> str | None:
        """Bash that brings a fresh container of image_name to the row's starting state, when
        the image alone is not it (SWE-smith: the bug is applied on the repo's image)."""
        return None

    def eval_script(self, row: dict[str, Any]) -> str:
        """The script envd runs after the model's patch: it prints the test output between the
        harness's `>>>>> Start Test Output` / `>>>>> End Test Output` lines."""
        raise NotImplementedError

    def grade(self, row: dict[str, Any], log: str, nonce: str | None = None) -> EvalReport:
        """Grade the eval script's output; with `nonce`, only envd's own markers frame it."""
        raise NotImplementedError


_REGISTRY: dict[str, Adapter] = {}   # family -> adapter
_NAMES: dict[str, str] = {}          # family, alias or hub id (lower case) -> family


def register(cls: type[Adapter]) -> type[Adapter]:
    """Class decorator: add a dataset family. A name used twice is an error."""
    adapter = cls()
    names = [cls.family, *cls.aliases, *cls.hub_datasets]
    for name in names:
        taken = _NAMES.get(name.lower())
        if taken is not None and taken != cls.family:
            raise ValueError(f"dataset family {cls.family!r}: name {name!r} is already {taken!r}'s")
    _REGISTRY[cls.family] = adapter
    for name in names:
        _NAMES[name.lower()] = cls.family
    return cls


def adapters() -> dict[str, Adapter]:
    """Every registered family, by name."""
    return dict(_REGISTRY)


def family_of_source(name: str | None) -> str | None:
    """The family a name stands for exactly (a family, an alias or a listed dataset id), else None."""
    return _NAMES.get(name.lower()) if name else None


def get_adapter(name: str) -> Adapter:
    family = family_of_source(name)
    if family is None:
        raise RowError(f"unknown dataset family {name!r} (known: {', '.join(sorted(_REGISTRY))})",
                       field=FAMILY_FIELD)
    return _REGISTRY[family]


def adapter_for(row: dict[str, Any], family: str | None = None,
                data_source: str | None = None) -> Adapter:
    """The adapter of a row: the explicit `family` (an unknown name is an error), else the family
    `data_source` names exactly, else the row's `dataset_family`, else the family its own
    `data_source` field names exactly, else its shape."""
    own = row.get(FAMILY_FIELD)
    if own is not None and not isinstance(own, str):
        raise RowError(f"must be a string, got {type(own).__name__}", field=FAMILY_FIELD)
    chosen = get_adapter(family).family if family is not None else family_of_source(data_source)
    if chosen is not None:
        if own and family_of_source(own) != chosen:
            raise RowError(f"the row says {own!r}, but it is read as {chosen!r}", field=FAMILY_FIELD)
        return _REGISTRY[chosen]
    if own:
        return get_adapter(own)
    label = row.get("data_source")
    if isinstance(label, str) and family_of_source(label):
        return _REGISTRY[str(family_of_source(label))]
    found = [a for a in _REGISTRY.values() if a.matches(row)]
    if not found:
        found = [a for a in _REGISTRY.values() if a.fallback_for(row)]
    if len(found) == 1:
        return found[0]
    known = ", ".join(sorted(_REGISTRY))
    if not found:
        raise RowError(f"missing, and the row's fields fit no known dataset family; pass the "
                       f"family (swarl data prepare --family; one of {known})", field=FAMILY_FIELD)
    raise RowError(f"missing, and the row's fields fit several families "
                   f"({', '.join(a.family for a in found)}); pass the family "
                   f"(swarl data prepare --family)", field=FAMILY_FIELD)
