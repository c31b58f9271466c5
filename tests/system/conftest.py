"""The whole system: the actors' service helpers (tests/actors) and system_helpers (the learner's
records, the stream watcher, `swarl` subprocesses) are shared here."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "actors"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
