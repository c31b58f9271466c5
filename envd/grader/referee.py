"""The referee: runs a graded test command in a child process and writes the verdict itself.

`python3 referee.py RUN_DIR -- TEST_COMMAND` (envd.referee.wrap_command writes that line into
the framed eval script). It reads RUN_DIR/run.json (written by envd: a per-run key, the canary
tests, the files the patch changed, the FAIL_TO_PASS tests to re-run alone) and deletes it before
anything else runs, makes itself non-dumpable (so a process without CAP_SYS_PTRACE, which task
containers never have, cannot read its memory), appends the canaries to the test files, and
runs the command with RUN_DIR's plugin loaded (PYTEST_PLUGINS) and a pipe the plugin reports on.
After the command (and, when every FAIL_TO_PASS test passed, one fresh process per such test,
with a canary of each kind beside it), it prints one line: `@@swarl-referee <hmac> <base64 zlib json>`,
signed with the key the test process never saw. envd checks the signature and reads the
records (envd.referee.judge). Standard library only; Python 3.6+."""

import base64
import hashlib
import hmac
import json
import os
import random
import re
import select
import shutil
import signal
import subprocess
import sys
import time
import zlib

DRAIN_S = 2.0
MAX_RECORDS = 200000
MAX_LINE = 1 << 20
STARTED = b"@@swarl-referee-started"


def _no_dump():
    """PR_SET_DUMPABLE 0: /proc/<pid>/mem, environ and ptrace need CAP_SYS_PTRACE from now on."""
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0) == 0
    except Exception:
        return False


def _package_names(text):
    """Names the test file imports from the code under test (a package or module in the
    repository): each canary mentions one, so that 'tests that use the package' does not tell
    the canaries from the row's tests."""
    names = []
    for mod, group in re.findall(r"^from[ \t]+([\w.]+)[ \t]+import[ \t]+\(?([\w, \t]+)", text, re.M):
        top = mod.split(".")[0]
        if top and (os.path.isdir(top) or os.path.isdir(os.path.join("src", top)) or os.path.isfile(top + ".py")):
            names += [w.split()[-1] for w in group.split(",") if w.strip() and w.split()[-1].isidentifier()]
    for top in re.findall(r"^import[ \t]+(\w+)[ \t]*$", text, re.M):
        if os.path.isdir(top) or os.path.isdir(os.path.join("src", top)) or os.path.isfile(top + ".py"):
            names.append(top)
    return names


def _mention(text, names, rng):
    """`text` (a canary) with a first line that uses one of `names` and cannot fail."""
    if not names:
        return text
    head, _, body = text.partition("\n")
    name = rng.choice(names)
    return f"{head}\n    assert {name} is {name}\n{body}"


def _insert_canaries(canaries):
    """Each canary before a random top-level test (after a blank line) or at the end, so that
    neither their names nor their place tells them from the tests the test patch added; one
    whose name the file already uses is left out. Returns {path: [names left out]}."""
    rng = random.SystemRandom()
    skipped = {}  # type: dict
    for path, texts in canaries.items():
        with open(path) as f:
            lines = f.read().split("\n")
        names = _package_names("\n".join(lines))
        for text in texts:
            m = re.match(r"def (\w+)", text)
            name = m.group(1) if m else ""
            if not name or re.search(r"\b" + name + r"\b", "\n".join(lines)):
                skipped.setdefault(path, []).append(name)
                continue
            spots = [i for i, line in enumerate(lines)
                     if i and not lines[i - 1].strip() and re.match(r"(def test|class Test)\w*", line)]
            at = rng.choice([*spots, len(lines)])
            lines[at:at] = ["", "", *_mention(text, names, rng).strip("\n").split("\n"), "", ""]
        with open(path, "w") as f:
            f.write("\n".join(lines).rstrip("\n") + "\n")
    return skipped


def _pids():
    return set(int(p) for p in os.listdir("/proc") if p.isdigit())


def _reap(keep):
    """Kill every process that was not there when the referee started (what a test run left
    behind, even outside its session, must not reach the next run)."""
    for pid in _pids() - keep:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def _hashes(paths):
    """sha256 of the row's Python test files (data files beside them are the tests' to change)."""
    out = {}  # type: dict
    for p in (p for p in paths if p.endswith(".py")):
        try:
            with open(p, "rb") as f:
                out[p] = hashlib.sha256(f.read()).hexdigest()
        except OSError:
            out[p] = None
    return out


def _restore_plugin(run_dir, name, source, tests):
    """The plugin as envd wrote it, before every run, and no bytecode cache beside it or beside
    the row's test files (a cached module another run wrote is not the file the hashes cover)."""
    for d in {run_dir, *(os.path.dirname(t) or "." for t in tests)}:
        shutil.rmtree(os.path.join(d, "__pycache__"), ignore_errors=True)
    with open(os.path.join(run_dir, name + ".py"), "wb") as f:
        f.write(source)


def _run(command, run_dir, cfg, select_ids):
    """One test process: its records, exit code and seconds."""
    _restore_plugin(run_dir, cfg["plugin"], cfg["plugin_source"], cfg.get("tests", []))
    rfd, wfd = os.pipe()
    env = dict(os.environ)
    env["SWARL_REFEREE_FD"] = str(wfd)
    env["SWARL_REFEREE_WATCH"] = json.dumps(cfg.get("watch", []))
    env["SWARL_REFEREE_TESTS"] = json.dumps(cfg.get("tests", []))
    env["SWARL_REFEREE_MODULES"] = json.dumps(cfg.get("modules", []))
    if select_ids:
        env["SWARL_REFEREE_SELECT"] = json.dumps(select_ids)
    plugins = [p for p in env.get("PYTEST_PLUGINS", "").split(",") if p.strip()]
    env["PYTEST_PLUGINS"] = ",".join([cfg["plugin"], *plugins])
    env["PYTHONPATH"] = run_dir + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    t0 = time.time()
    child = subprocess.Popen(["bash", "-c", command], env=env, pass_fds=(wfd,), start_new_session=True)
    os.close(wfd)
    records = []  # type: list
    buf, bad, late = b"", 0, 0
    finished_at = None
    while True:
        if finished_at is None and child.poll() is not None:
            finished_at = time.time()
        if finished_at is not None and time.time() - finished_at > DRAIN_S:
            break
        ready, _, _ = select.select([rfd], [], [], 0.2)
        if not ready:
            continue
        chunk = os.read(rfd, 65536)
        if not chunk:
            break
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            try:
                rec = json.loads(line.decode("utf-8"))
                if not isinstance(rec, dict):
                    raise ValueError("not an object")
            except ValueError:
                bad += 1
                continue
            if finished_at is not None:
                late += 1
            if len(records) < MAX_RECORDS:
                records.append(rec)
        if len(buf) > MAX_LINE:
            bad, buf = bad + 1, b""
    code = child.wait()
    try:  # whatever the test command left behind in its session
        os.killpg(child.pid, signal.SIGKILL)
    except OSError:
        pass
    os.close(rfd)
    return {"records": records, "exit": code, "bad": bad + (1 if buf.strip() else 0), "late": late,
            "seconds": round(time.time() - t0, 3), "select": select_ids}


def main(argv):
    run_dir = os.path.abspath(argv[1])
    command = " ".join(argv[3:]) if len(argv) > 3 and argv[2] == "--" else ""
    cfg_path = os.path.join(run_dir, "run.json")
    with open(cfg_path) as f:
        cfg = json.load(f)
    os.unlink(cfg_path)
    key = bytes.fromhex(cfg.pop("key"))
    guarded = _no_dump()
    os.write(1, b"\n" + STARTED + b"\n")  # before the test process exists: it cannot print this first
    report = {"runs": [], "guarded": guarded}
    try:
        _referee(command, run_dir, cfg, report)
    except Exception as e:  # a verdict still (an error: unresolved), never silence
        report["error"] = f"{type(e).__name__}: {e}"
    body = json.dumps(report).encode("utf-8")
    payload = base64.b64encode(zlib.compress(body, 6))
    sig = hmac.new(key, payload, hashlib.sha256).hexdigest()  # checked before anything is decoded
    sys.stdout.flush()
    os.write(1, b"\n@@swarl-referee " + sig.encode() + b" " + payload + b"\n")
    return report["runs"][0]["exit"] if report["runs"] else 1


def _referee(command, run_dir, cfg, report):
    keep = _pids()
    with open(os.path.join(run_dir, cfg["plugin"] + ".py"), "rb") as f:
        cfg["plugin_source"] = f.read()
    report["skipped_canaries"] = _insert_canaries({p: t for p, t in cfg.get("canaries", {}).items()
                                                    if os.path.isfile(p)})
    report["hashes"] = _hashes(cfg.get("tests", []))
    runs = report["runs"]
    runs.append(_run(command, run_dir, cfg, None))
    _reap(keep)
    isolate = cfg.get("isolate", {})
    if isolate and _all_passed(runs[0]["records"], list(isolate)):
        for test_id, extra in isolate.items():
            runs.append(_run(command, run_dir, cfg, [test_id, *list(extra)]))
            _reap(keep)
    report["hashes_after"] = _hashes(cfg.get("tests", []))


def _all_passed(records, test_ids):
    """A cheap first look (envd judges for real): every id has a call record without an exception."""
    passed = set()  # type: set
    for rec in records:
        if rec.get("e") == "phase" and rec.get("when") == "call" and not rec.get("pre") and not rec.get("post") \
                and rec.get("report") == "passed":
            passed.update(rec.get("ids") or [])
    return all(t in passed or any(p.split(" ")[0] == t for p in passed) for t in test_ids)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
