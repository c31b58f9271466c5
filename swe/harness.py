"""What envd and the commands ask of a row, answered by the row's dataset adapter
(swe.adapters): its image, the script that brings a container to its start, the eval script, the
grade of a test log. The row's `dataset_family` (set by validate_row) names the adapter; a row
without one is read by its shape."""

from __future__ import annotations

from typing import Any

from swe.adapters import adapter_for
from swe.grading import EvalReport
from swe.schema import RowError

__all__ = ["eval_script_for", "grade", "image_for", "setup_script_for"]


def image_for(instance: dict[str, Any], data_source: str | None = None) -> str:
    """The Docker image a row runs in: its own `image_name`, else its family's naming.
    `data_source` picks the family when it names one exactly (a family or a listed dataset id)."""
    if instance.get("image_name"):
        return str(instance["image_name"])
    iid = instance.get("instance_id")
    if not iid or not isinstance(iid, str):
        raise RowError("required to name the image", field="instance_id")
    return adapter_for(instance, data_source=data_source).image_name(instance)


def setup_script_for(instance: dict[str, Any]) -> str | None:
    """Bash that brings a fresh container of the row's image to its start, or None."""
    return adapter_for(instance).setup_script(instance)


def eval_script_for(instance: dict[str, Any]) -> str:
    return adapter_for(instance).eval_script(instance)


def grade(instance: dict[str, Any], log: str, nonce: str | None = None) -> EvalReport:
    return adapter_for(instance).grade(instance, log, nonce)
