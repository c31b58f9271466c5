"""Where a running demo's CPU goes: sampled over an interval while `swarl demo` trains.

    .venv/bin/python benchmarks/demo_cpu_split.py --seconds 300    # while a demo runs on this machine

CPU seconds per part over the interval: the Docker containers (the agent's commands and the
grading: the cgroup v1 cpuacct of dockerd's `docker/` parent, which keeps the time of processes
that exited in between), the long-lived swarl processes by role (from /proc, utime + stime), the
Docker engine (dockerd, containerd, the shims), and the rest of the machine's total (the root
cpuacct): short-lived host processes (runc for every exec and start) and anything else running.
Its table goes to benchmarks/RESULTS.md (section demo_cpu_split) with --record. Linux with cgroup
v1 cpuacct (what the private dockerd here uses); elsewhere it says so and exits 2.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from _record import markdown_table, record  # noqa: E402

CPUACCT = Path("/sys/fs/cgroup/cpuacct")
HZ = os.sysconf("SC_CLK_TCK")
ROLES = (("swarl learner", "learner"), ("swarl inference", "inference servers"), ("swarl actor", "actors"),
         ("swarl envd", "envd"), ("swarl pool", "pool"), ("swarl demo", "demo (supervisor)"),
         ("redis-server", "redis"))
ENGINE = ("dockerd", "containerd", "containerd-shim-runc-v2")
CONTAINERS = "containers (commands, grading)"
REST = "rest (short-lived host processes: runc, ...; anything else)"


def _cgroup_s(rel: str) -> float:
    return int((CPUACCT / rel / "cpuacct.usage").read_text()) / 1e9


def role(cmdline: str) -> str | None:
    if not cmdline:
        return None
    exe = os.path.basename(cmdline.split(" ", 1)[0])
    if exe in ENGINE:
        return "docker engine"
    for needle, name in ROLES:
        if needle in cmdline:
            return name
    return None


def processes() -> dict[int, tuple[float, str | None]]:
    out = {}
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            cmd = Path(f"/proc/{p}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:  # exited while read
            continue
        out[int(p)] = ((int(fields[11]) + int(fields[12])) / HZ, role(cmd))
    return out


def split(seconds: float) -> dict[str, float]:
    """CPU seconds per part over `seconds`; the parts sum to the machine's total."""
    r0, d0, p0 = _cgroup_s(""), _cgroup_s("docker"), processes()
    time.sleep(seconds)
    r1, d1, p1 = _cgroup_s(""), _cgroup_s("docker"), processes()
    parts: dict[str, float] = {CONTAINERS: d1 - d0}
    for pid, (cpu, name) in p1.items():
        if name is not None and pid in p0:  # a process born in between: its time goes to the rest
            parts[name] = parts.get(name, 0.0) + cpu - p0[pid][0]
    parts[REST] = max(0.0, (r1 - r0) - sum(parts.values()))
    return parts


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=300.0)
    ap.add_argument("--record", action="store_true", help="write the table to benchmarks/RESULTS.md")
    ap.add_argument("--note", default="", help="what ran meanwhile, for the record")
    a = ap.parse_args()
    if not (CPUACCT / "docker" / "cpuacct.usage").is_file():
        print(f"needs cgroup v1 cpuacct with dockerd's docker/ group: {CPUACCT / 'docker'} is missing", file=sys.stderr)
        return 2
    if not any(name == "learner" for _, name in processes().values()):
        print("no swarl learner is running: start `swarl demo` first", file=sys.stderr)
        return 2
    parts = split(a.seconds)
    total = sum(parts.values())
    rows = [[k, round(v), f"{v / total:.0%}", round(v / a.seconds, 2)]
            for k, v in sorted(parts.items(), key=lambda kv: -kv[1])]
    rows.append(["all", round(total), "100%", round(total / a.seconds, 2)])
    table = markdown_table(["part", "CPU s", "share", "cores"], rows)
    print(table)
    summary = {k: round(v / total, 3) for k, v in parts.items()} | {"seconds": a.seconds, "cores_busy": round(total / a.seconds, 2)}
    if a.record:
        record("demo_cpu_split", table, summary,
               notes=f"`benchmarks/demo_cpu_split.py --seconds {a.seconds:g}` during {a.note or 'a demo'}.")
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
