"""The files envd copies into a grading container (not imported by envd itself): `referee.py`,
the process that runs the test command and writes the verdict; `boot.py`, the test process's
first code, which loads `audit.py` (the audit hook) and the observer of its runner (`plugin.py`
for pytest, `runners.py` for unittest and sympy's runner) before any file of the repository.
All run on the container's Python (3.6 and later, the oldest a SWE-bench environment has), with
the standard library only. envd.referee prepares a run, envd.verdict judges the referee's
answer; docs/security.md says what each part closes."""

from pathlib import Path

GRADER_DIR = Path(__file__).resolve().parent
GRADER_FILES = ("referee.py", "boot.py", "audit.py", "plugin.py", "runners.py")
REFEREE_FILE = GRADER_DIR / "referee.py"
PLUGIN_FILE = GRADER_DIR / "plugin.py"
