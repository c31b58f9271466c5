"""The referee's pytest plugin: loaded through PYTEST_PLUGINS (under a per-run module name), so
it is imported and registered before any conftest or test module, hence before any code of the
package under test. It writes one JSON record a line to a pipe the referee process reads:

- `hello` at import; `module` (the hash of each of the row's test files just before pytest
  imports it); `collected` (every item's node id) once collection ends;
- `phase` for each item's setup / call / teardown, read before any other makereport
  implementation runs (`pre`: the exception pytest's CallInfo caught, as a qualified type name)
  and after them (`post`, `report`), so a report rewritten later does not change what was sent;
- `call`: whether the test function itself raised, from the innermost pytest_pyfunc_call wrapper
  (a plain test function whose call phase has no such record never ran);
- `audit`: a sensitive operation (tracing, gc walks, frame access, listing /proc, reading the
  test modules or the grader's files) whose nearest caller outside the standard library is a file the
  patch changed; the audit hook cannot be removed and reports before the operation returns;
- `finish`: the session's exit status.

The pipe's descriptor is moved to a random number, made close-on-exec, and its variable removed
from the environment. Written for Python 3.6+ and pytest 3+ with the standard library only."""

import hashlib
import json
import os
import random
import re
import sys
from typing import Any  # noqa: F401 - a type comment's (Python 3.6 has no annotations of locals)

import pytest


def _function_class():
    try:
        from _pytest.python import Function

        return Function
    except ImportError:  # every pytest since 3.0 has it
        return None


_Function = _function_class()

_write = os.write
_dumps = json.dumps
_getframe = sys._getframe
_seq = [0]
_fd = [-1]
_guard = [False]


def _take_fd():
    raw = os.environ.pop("SWARL_REFEREE_FD", "")
    if not raw.isdigit():
        return -1
    fd = int(raw)
    for _ in range(50):
        target = random.randint(300, 1000)
        try:
            os.fstat(target)
        except OSError:
            os.dup2(fd, target, inheritable=False)
            os.close(fd)
            return target
    os.set_inheritable(fd, False)
    return fd


def _send(rec):
    if _fd[0] < 0 or os.getpid() != _PID:  # a forked child inherits the pipe, not the right to use it
        return
    _seq[0] += 1
    rec["n"] = _seq[0]
    data = (_dumps(rec, default=repr) + "\n").encode("utf-8", "replace")
    try:
        while data:
            data = data[_write(_fd[0], data):]
    except OSError:
        _fd[0] = -1


def _list_env(name):
    try:
        return [str(p) for p in json.loads(os.environ.pop(name, "") or "[]")]
    except ValueError:
        return []


def _unlist_self():
    """Take this plugin out of the environment the tests (and any pytest they start) inherit."""
    name = __name__.rpartition(".")[2]
    rest = [p for p in os.environ.get("PYTEST_PLUGINS", "").split(",") if p.strip() and p.strip() != name]
    if rest:
        os.environ["PYTEST_PLUGINS"] = ",".join(rest)
    else:
        os.environ.pop("PYTEST_PLUGINS", None)
    here = os.path.dirname(os.path.abspath(__file__))
    path = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != here]
    if path:
        os.environ["PYTHONPATH"] = os.pathsep.join(path)
    else:
        os.environ.pop("PYTHONPATH", None)


_PID = os.getpid()
_CONFIG = []  # type: list
_unlist_self()
_fd[0] = _take_fd()


def _watch_env():
    """{patched file: the line numbers the patch added to it}."""
    try:
        raw = json.loads(os.environ.pop("SWARL_REFEREE_WATCH", "") or "{}")
        return dict((str(k), frozenset(int(n) for n in v)) for k, v in raw.items() if k)
    except (ValueError, TypeError, AttributeError):
        return {}


_WATCH = _watch_env()
_TESTS = tuple(p for p in _list_env("SWARL_REFEREE_TESTS") if p)
_MODULES = tuple(p for p in _list_env("SWARL_REFEREE_MODULES") if p)  # the test modules the ids name
_SELECT = _list_env("SWARL_REFEREE_SELECT")
_ROOT = os.getcwd()
_STDLIB = os.path.dirname(os.__file__) + os.sep
_FRAME_HELPERS = frozenset(_STDLIB + n for n in ("inspect.py", "traceback.py"))
_HERE = os.path.abspath(__file__)
_send({"e": "hello", "pid": os.getpid(), "py": sys.version.split()[0], "pytest": pytest.__version__})

# Audit events that a fix has no reason to raise from its own code, and those checked only when
# the patched file calls them directly (libraries use them on a caller's behalf).
_ALWAYS = frozenset(["sys.settrace", "sys.setprofile", "sys._current_frames", "gc.get_objects",
                     "gc.get_referrers", "gc.get_referents", "sys.addaudithook", "ctypes.string_at",
                     "ctypes.addressof", "ctypes.cdata"])
_DIRECT = frozenset(["sys._getframe"])
# what finding the grader takes in /proc: descriptors, memory, environment, command lines, parents
_PROC = re.compile(r"^/proc/(self|\d+|thread-self)(/task/\d+)?/(fd|fdinfo|mem|environ|cmdline|stat|maps)\b")
_FRAME_ATTRS = frozenset(["tb_frame", "gi_frame", "cr_frame", "ag_frame", "f_back"])


def _stdlib(filename):
    """In the standard library (a conda or venv site-packages lies inside its directory: not)."""
    return filename.startswith(_STDLIB) and "-packages" + os.sep not in filename[len(_STDLIB):]


def _patched(filename, lineno):
    """The patched file `filename` is, if the line is one the patch added."""
    for rel, lines in _WATCH.items():
        if (filename == rel or filename.endswith(os.sep + rel)) and lineno in lines:
            return rel
    return None


def _culprit(direct):
    """The patched file behind the current audit event (None: none): the nearest frame outside
    the standard library, this plugin and code compiled from strings (or, `direct`, the caller,
    seen through inspect's and traceback's helpers, which get frames on their caller's behalf)."""
    frame = _getframe(2)  # type: Any
    while direct and frame is not None and frame.f_code.co_filename in _FRAME_HELPERS:
        frame = frame.f_back
    while frame is not None:
        name = frame.f_code.co_filename
        if not (_stdlib(name) or name.startswith("<") or name == _HERE):
            rel = _patched(name, frame.f_lineno)
            return (rel, frame.f_lineno) if rel else None
        if direct:
            return None
        frame = frame.f_back
    return None


def _sensitive_path(path):
    if isinstance(path, bytes):
        path = path.decode("utf-8", "replace")
    if not isinstance(path, str):
        return False
    if path.startswith("/tmp/swarl") or path.rstrip("/") == "/proc" or _PROC.search(path):
        return True
    full = path if os.path.isabs(path) else os.path.join(_ROOT, path)
    return any(full == os.path.join(_ROOT, t) for t in _MODULES)


def _audit(event, args):
    if _guard[0] or not _WATCH:
        return
    if event in _ALWAYS:
        direct = False
    elif event in _DIRECT:
        direct = True
    elif event == "object.__getattr__":
        if len(args) < 2 or args[1] not in _FRAME_ATTRS:
            return
        direct = True
    elif event == "open" or event == "os.listdir" or event == "os.scandir":
        if not args or not _sensitive_path(args[0]):
            return
        direct = False
    else:
        return
    _guard[0] = True
    try:
        hit = _culprit(direct)
        if hit is not None:
            _send({"e": "audit", "ev": event, "file": hit[0], "line": hit[1], "arg": repr(args)[:160]})
    finally:
        _guard[0] = False


if hasattr(sys, "addaudithook"):
    sys.addaudithook(_audit)


def _exc_name(excinfo):
    if excinfo is None:
        return None
    tp = excinfo.type if hasattr(excinfo, "type") else excinfo[0]
    return "{}.{}".format(getattr(tp, "__module__", "?"), getattr(tp, "__qualname__", getattr(tp, "__name__", "?")))


def _ids(item):
    ids = [item.nodeid]
    try:
        rel = item.config.cwd_relative_nodeid(item.nodeid)
        if rel != item.nodeid:
            ids.append(rel)
    except Exception:
        pass
    return ids


def _ours(config):
    """Only the first session reports (pytester's in-process runs have sessions of their own)."""
    return bool(_CONFIG) and config is _CONFIG[0]


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    if not _CONFIG:
        _CONFIG.append(config)
        # registered now: no longer findable by name (only through gc or frames, which are audited)
        sys.modules.pop(__name__, None)


def _sha(path):
    try:
        with open(str(path), "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()
    except OSError:
        return None


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_make_collect_report(collector):
    """A test module's file as it is just before pytest imports it (the code under test, imported
    by it, runs only after its source was read): the referee compares it with the file as it was
    before the run, so tests rewritten while others ran (by any process) are seen."""
    if _ours(collector.config) and isinstance(collector, pytest.Module):
        path = str(getattr(collector, "path", None) or getattr(collector, "fspath", ""))
        rel = os.path.relpath(path, _ROOT) if os.path.isabs(path) else path
        if rel in _TESTS:
            _send({"e": "module", "path": rel, "sha": _sha(path)})
    yield


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(session, config, items):
    if not _SELECT or not _ours(config):
        return
    wanted = set(_SELECT)
    keep = [i for i in items if wanted.intersection(_ids(i))]
    drop = [i for i in items if not wanted.intersection(_ids(i))]
    if drop:
        config.hook.pytest_deselected(items=drop)
    items[:] = keep


@pytest.hookimpl(hookwrapper=True, trylast=True)
def pytest_collection_finish(session):
    if _ours(session.config):
        _send({"e": "collected", "ids": [_ids(i) for i in session.items]})
    yield


@pytest.hookimpl(hookwrapper=True, trylast=True)
def pytest_pyfunc_call(pyfuncitem):
    outcome = yield
    if _ours(pyfuncitem.config):
        _send({"e": "call", "id": pyfuncitem.nodeid, "exc": _exc_name(outcome.excinfo)})


@pytest.hookimpl(hookwrapper=True, trylast=True)
def pytest_runtest_makereport(item, call):
    pre = _exc_name(call.excinfo)
    outcome = yield
    if not _ours(item.config):
        return
    rep = None
    try:
        rep = outcome.get_result()
    except BaseException:
        pass
    xfail = False
    try:
        xfail = item.get_closest_marker("xfail") is not None
    except Exception:
        xfail = bool(getattr(item, "keywords", {}).get("xfail"))
    _send({"e": "phase", "id": item.nodeid, "ids": _ids(item), "when": call.when, "pre": pre,
           "post": _exc_name(call.excinfo), "report": getattr(rep, "outcome", None), "xfail": xfail,
           "fn": _Function is not None and type(item) is _Function})


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session, exitstatus):
    if _ours(session.config):
        _send({"e": "finish", "exitstatus": int(exitstatus)})
