"""The test process's first code: `python -S RUN_DIR/boot.py RUN_DIR RUNNER KIND TARGET [ARGS...]`.

The referee starts the graded test command through this file instead of the runner's own entry
point, so that the grader's observer and its channel to the referee are loaded, and every
standard-library module they use is bound, before any file of the repository under test can
run: `-S` skips site-packages' .pth files (an editable install writes them; a patched setup.py
decides what they run), the run directory and PYTHONPATH are off sys.path while the grader
imports, the repository root is not on it at all yet, and pytest's plugin is registered before
pytest loads entry-point plugins (`pytest11`) or reads any conftest. Only then is the
interpreter brought to the state the command would have had (site-packages and their .pth
files, PYTHONPATH, the root or the script's directory first on sys.path, sys.argv) and the
runner started. Without -E: PYTHONWARNINGS, PYTHONHASHSEED and the rest of the eval script's
environment apply as they would (the environment is the script's, set before the install step,
not the repository's).

RUNNER: pytest (plugin.py) | unittest | sympy (runners.py); every runner gets the audit hook
(audit.py). KIND: `module` (`python -m pytest`),
`script` (a console script or a runner script: TARGET is its path). The channel (`Channel`):
one JSON record a line on the pipe SWARL_REFEREE_FD, each line led by an HMAC whose key
advances with every record (the first, and the run's settings, read whole from the pipe
SWARL_REFEREE_KEYFD, which the referee filled and closed: on no disk, in no environment), sent
only by this process; the referee uses nothing that comes after the `finish` record.
Standard library only; Python 3.6+."""

import sys

RUN_DIR = sys.path.pop(0)  # `python -S boot.py`: the first entry is this file's directory

import os  # noqa: E402 - every import of the grader happens with sys.path as it is now

_ENV_PATHS = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
_SET_ASIDE = [p for p in sys.path if p in _ENV_PATHS or os.path.abspath(p) in _ENV_PATHS or p in ("", ".")]
sys.path[:] = [p for p in sys.path if p not in _SET_ASIDE]  # the standard library only

# What the observers use later, bound now (a module the repository shadows later is its own).
import functools  # noqa: E402,F401
import hashlib  # noqa: E402
import hmac  # noqa: E402
import importlib.util  # noqa: E402
import inspect  # noqa: E402,F401
import json  # noqa: E402
import random  # noqa: E402
import re  # noqa: E402,F401
import runpy  # noqa: E402
import site  # noqa: E402
import traceback  # noqa: E402,F401
import types  # noqa: E402,F401


def _take_fd(name):
    """The descriptor in env `name`, moved to a random high number, close-on-exec."""
    raw = os.environ.pop(name, "")
    if not raw.isdigit():
        return -1
    fd = int(raw)
    for _ in range(50):
        target = random.SystemRandom().randint(300, 1000)
        try:
            os.fstat(target)
        except OSError:
            os.dup2(fd, target, inheritable=False)
            os.close(fd)
            return target
    os.set_inheritable(fd, False)
    return fd


def _from_referee():
    """(key, settings): what the referee wrote on the pipe SWARL_REFEREE_KEYFD (32 bytes of key,
    then JSON) and closed; read whole, so that nothing of it is left for anyone else."""
    fd = _take_fd("SWARL_REFEREE_KEYFD")
    data = b""
    if fd >= 0:
        while True:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            data += chunk
        os.close(fd)
    try:
        cfg = json.loads(data[32:].decode("utf-8")) if len(data) > 32 else {}
    except ValueError:
        cfg = {}
    return data[:32], cfg if isinstance(cfg, dict) else {}


def _channel(key):
    """send(record): the record with its sequence number and a MAC under the current key,
    then the key advances (sha256 of itself). Closure state only: nothing to rebind."""
    fd = [_take_fd("SWARL_REFEREE_FD")]
    key = [key]
    seq = [0]
    pid = os.getpid()
    write, dumps, new, sha = os.write, json.dumps, hmac.new, hashlib.sha256

    def send(rec):
        if fd[0] < 0 or os.getpid() != pid:  # a fork inherits the pipe, not the right to use it
            return
        seq[0] += 1
        rec = dict(rec)
        rec["n"] = seq[0]
        body = dumps(rec, default=repr).encode("utf-8", "replace")
        line = new(key[0], body, "sha256").hexdigest().encode() + b" " + body + b"\n"
        key[0] = sha(key[0]).digest()
        try:  # after `finish` too: the referee counts what comes then (an attempt), and uses none of it
            while line:
                line = line[write(fd[0], line):]
        except OSError:
            fd[0] = -1

    return send


def _load(name, path):
    """A grader module by path, under a random name, never entered in sys.modules."""
    spec = importlib.util.spec_from_file_location("_sw" + hashlib.sha256(os.urandom(8)).hexdigest()[:10], path)
    assert spec is not None and spec.loader is not None, path
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _site_dirs():
    try:
        dirs = list(site.getsitepackages())
    except AttributeError:  # an old virtualenv's site.py
        dirs = [d for d in sys.path if d.endswith(("site-packages", "dist-packages"))]
    return [d for d in dirs if os.path.isdir(d)]


def _pth_paths(sitedir):
    """The directories site-packages' .pth files add, without running their `import` lines
    (an egg pytest may live only there)."""
    out = []  # type: list
    try:
        names = sorted(n for n in os.listdir(sitedir) if n.endswith(".pth"))
    except OSError:
        return out
    for n in names:
        try:
            with open(os.path.join(sitedir, n)) as f:
                for line in f:
                    line = line.rstrip()
                    if line and not line.startswith(("#", "import ", "import\t")):
                        p = os.path.join(sitedir, line)
                        if os.path.isdir(p):
                            out.append(p)
        except (OSError, UnicodeDecodeError):
            continue
    return out


def _finish_site(first):
    """sys.path as the command would have had it: `first` (the root for -m, the script's
    directory), PYTHONPATH, the standard library, site-packages with their .pth files run."""
    site.main()
    for p in reversed(_SET_ASIDE):
        if p not in ("", "."):
            sys.path.insert(0, p)
    sys.path.insert(0, first)


def main(argv):
    runner, kind, target, args = argv[1], argv[2], argv[3], argv[4:]
    key, cfg = _from_referee()
    send = _channel(key)
    for d in _site_dirs():
        for p in [d, *_pth_paths(d)]:
            if p not in sys.path:
                sys.path.append(p)
    if runner == "pytest":
        import pytest

        plugin = _load("plugin", os.path.join(RUN_DIR, "plugin.py")).setup(send, cfg)
        _load("audit", os.path.join(RUN_DIR, "audit.py")).install(send, cfg)  # the runner's packages known
    else:
        plugin = _load("runners", os.path.join(RUN_DIR, "runners.py")).setup(runner, send, cfg)
        _load("audit", os.path.join(RUN_DIR, "audit.py")).install(send, cfg)
    if kind == "module":
        _finish_site(os.getcwd())
        sys.argv = [os.path.join(os.path.dirname(pytest.__file__), "__main__.py"), *args]
    else:
        _finish_site(os.path.dirname(os.path.realpath(target)))
        sys.argv = [target, *args]
    if runner == "pytest":
        sys.exit(int(pytest.main(args, plugins=[plugin])))
    code = 0
    try:
        runpy.run_path(target, run_name="__main__")
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        raise
    finally:
        send({"e": "finish", "exitstatus": code})


if __name__ == "__main__":
    main(sys.argv)
