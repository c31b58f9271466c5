"""The files envd copies into a grading container (not imported by envd itself): `referee.py`,
the process that runs the test command and writes the verdict, and `plugin.py`, the pytest
plugin it loads into the test process. Both run on the container's Python (3.6 and later, the
oldest a SWE-bench environment has), with the standard library only. envd.referee prepares a run
and checks the referee's answer; docs/security.md says what each part closes."""

from pathlib import Path

GRADER_DIR = Path(__file__).resolve().parent
REFEREE_FILE = GRADER_DIR / "referee.py"
PLUGIN_FILE = GRADER_DIR / "plugin.py"
