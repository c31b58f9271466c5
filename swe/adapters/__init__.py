"""The dataset adapters: one module per dataset family, each registering its Adapter.

Adding a dataset is one file here: a module that defines an `Adapter` subclass (its row model,
`matches`, `image_name`, `eval_script`, `grade`, ...) decorated with `@register`. Every module of
this package is imported when the package is, so nothing else needs editing. docs/tasks.md
describes the families shipped and how swarl maps each.
"""

from __future__ import annotations

import importlib
import pkgutil

from swe.adapters.base import (
    Adapter,
    adapter_for,
    adapters,
    family_of_source,
    get_adapter,
    register,
)

__all__ = ["Adapter", "adapter_for", "adapters", "family_of_source", "get_adapter", "register"]

for _mod in sorted(m.name for m in pkgutil.iter_modules(__path__)):
    if _mod != "base" and not _mod.startswith("_"):
        importlib.import_module(f"{__name__}.{_mod}")
