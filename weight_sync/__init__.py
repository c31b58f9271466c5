"""swarl weight_sync: publish policy versions and roll them out to inference servers.

The learner's process makes a publisher with `make_publisher(...)`; its rolling-update
coordinator runs on its own thread in that process. Imports are lazy so `import weight_sync`
stays light (no torch at import time).
"""

from __future__ import annotations

from typing import Any

__all__ = ["make_publisher"]


def make_publisher(*args: Any, **kw: Any) -> Any:
    from weight_sync.publisher import make_publisher as _make

    return _make(*args, **kw)
