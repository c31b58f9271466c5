"""The referee's audit hook (PEP 578: it cannot be removed and reports before the audited call
returns), installed by boot.py in every test process, whatever its runner: an `audit` record
for a sensitive operation (tracing, gc walks, frame access, ctypes memory access, listing /proc
or reading a process's descriptors, memory or environment there, reading the test modules or
the grader's files) whose culprit is a line the patch added. The culprit is the nearest frame
outside the standard library, the runner's packages and the grader, reached through any of
their helpers, unless one of them only consumes the frame (logging finding its caller,
traceback formatting, typing or namedtuple reading a module name): what a patched file did
before is the package's own (matplotlib and xarray walk frames to place their warnings), and a
library outside the runner that walks frames stops the search. Python 3.8+ (no hook before);
standard library only."""

import os
import re
import sys
from typing import Any  # noqa: F401 - a type comment's

# Audit events that a fix has no reason to raise from its own code, and those checked only when
# the patched file calls them directly (libraries use them on a caller's behalf).
_ALWAYS = frozenset(["sys.settrace", "sys.setprofile", "sys._current_frames", "gc.get_objects",
                     "gc.get_referrers", "gc.get_referents", "sys.addaudithook", "ctypes.string_at",
                     "ctypes.addressof", "ctypes.cdata", "ctypes.PyObj_FromPtr"])
_DIRECT = frozenset(["sys._getframe"])
# what finding the grader takes in /proc: descriptors, memory, environment, command lines, parents
_PROC = re.compile(r"^/proc/(self|\d+|thread-self)(/task/\d+)?/(fd|fdinfo|mem|environ|cmdline|stat|status|maps)\b")
_FRAME_ATTRS = frozenset(["tb_frame", "gi_frame", "cr_frame", "ag_frame", "f_back"])
# The runner's own packages: helpers of the patched code like the standard library's.
_RUNNER = ("_pytest", "pytest", "pluggy", "py", "unittest")
# Standard-library functions that take a frame for their own use and never hand it back (a
# frame walk through them is the library's business: logging finds its caller, traceback
# formats, typing / enum / namedtuple / doctest read a module name).
_CONSUMERS = frozenset([
    ("logging", "findCaller"), ("logging", "_log"), ("warnings", "warn"), ("warnings", "_next_external_frame"),
    ("traceback", "extract_stack"), ("traceback", "format_stack"), ("traceback", "print_stack"),
    ("traceback", "extract"), ("traceback", "_extract_from_extended_frame_gen"), ("traceback", "__init__"),
    ("traceback", "extract_tb"), ("traceback", "format_tb"), ("traceback", "print_tb"),
    ("traceback", "format_exception"), ("traceback", "print_exception"), ("traceback", "format_exc"),
    ("traceback", "print_exc"), ("typing", "_caller"), ("typing", "__init__"), ("typing", "__new__"),
    ("enum", "_create_"), ("enum", "__call__"), ("collections", "namedtuple"), ("doctest", "_normalize_module"),
    ("dataclasses", "make_dataclass"), ("inspect", "getframeinfo"), ("inspect", "getlineno"),
])



def install(send, cfg):
    """Add the hook for this run (cfg: `watch`, {patched file: the line numbers it adds};
    `modules`, the test modules the row's ids name)."""
    if not hasattr(sys, "addaudithook"):
        return
    guard = [False]
    pid = os.getpid()
    getframe = sys._getframe
    root = os.getcwd()
    stdlib = os.path.dirname(os.__file__) + os.sep
    here = os.path.dirname(os.path.abspath(__file__)) + os.sep
    watch = dict((str(k), frozenset(int(n) for n in v)) for k, v in (cfg.get("watch") or {}).items() if k)
    modules = tuple(str(p) for p in cfg.get("modules") or [] if p)  # the test modules the ids name
    runner_dirs = tuple(os.path.dirname(os.path.abspath(str(getattr(m, "__file__", "")))) + os.sep for m in
                        (sys.modules.get(n) for n in _RUNNER)
                        if getattr(m, "__path__", None) and getattr(m, "__file__", None))  # packages only

    def stdlib_file(filename):
        """In the standard library (a conda or venv site-packages lies inside its directory: not)."""
        return filename.startswith(stdlib) and "-packages" + os.sep not in filename[len(stdlib):]

    def helper(filename):
        return stdlib_file(filename) or filename.startswith(runner_dirs) or filename.startswith(here) \
            or filename.startswith("<")

    def patched(filename, lineno):
        for rel, lines in watch.items():
            if (filename == rel or filename.endswith(os.sep + rel)) and lineno in lines:
                return rel
        return None

    def consumer(frame):
        name = frame.f_code.co_filename
        if not stdlib_file(name):
            return False
        mod = name[len(stdlib):].split(os.sep)[0].rsplit(".py", 1)[0]
        return (mod, frame.f_code.co_name) in _CONSUMERS

    def culprit():
        """The patched line behind the current audit event, if any: the nearest frame that is not
        the standard library's, the runner's or the grader's, reached through any of their
        helpers unless one of them only consumes the frame (None: not the patch's doing)."""
        frame = getframe(2)  # type: Any  # 0: this function, 1: the audit hook, 2: the code that raised the event
        while frame is not None:
            name = frame.f_code.co_filename
            if not helper(name):
                rel = patched(name, frame.f_lineno)
                return (rel, frame.f_lineno) if rel else None
            if consumer(frame):
                return None
            frame = frame.f_back
        return None

    def sensitive(path):
        if isinstance(path, bytes):
            path = path.decode("utf-8", "replace")
        if not isinstance(path, str):
            return False
        full = path if os.path.isabs(path) else os.path.join(root, path)
        if full.startswith(here) or path.rstrip("/") == "/proc" or _PROC.search(path):
            return True
        return any(full == os.path.join(root, t) for t in modules)

    def audit(event, args):
        if guard[0] or not watch or os.getpid() != pid:
            return
        if event in _ALWAYS or event in _DIRECT:
            pass
        elif event == "object.__getattr__":
            if len(args) < 2 or args[1] not in _FRAME_ATTRS:
                return
        elif event in ("open", "os.listdir", "os.scandir"):
            if not args or not sensitive(args[0]):
                return
        else:
            return
        guard[0] = True
        try:
            hit = culprit()
            if hit is not None:
                send({"e": "audit", "ev": event, "file": hit[0], "line": hit[1], "arg": repr(args)[:160]})
        finally:
            guard[0] = False

    sys.addaudithook(audit)
