"""The referee's observers for runners other than pytest, set up by boot.py before the runner
script (or anything of the repository) is imported: `setup(runner, send, cfg)`.

- `unittest` (django's tests/runtests.py, any unittest-based runner run in one process):
  `unittest.TestCase.run` is wrapped. For each test it sends `case` (the test's names as the
  runner prints them: str(test), and the first docstring line when there is one; the outcome
  as TestCase.run reported it to the result, read on a proxy of the result before the runner's
  own result class sees it) and `call` (whether the test method itself raised: the method is
  wrapped for that one call). Subtest failures count as failures.
- `sympy` (sympy's bin/test, whose runner execs each test file and calls its `test_*`
  functions): `builtins.exec` is wrapped; when it runs a code object of one of the row's test
  files, each plain `test_*` function it defined is replaced by one that sends `call` (whether
  it raised, and what) and goes on as the function would. The wrapper keeps `__wrapped__`, so
  the runner still finds, sorts and names the test from its source.

With `select` (the referee's runs of tests alone), the other tests of the files are not run.
The runner's report (its log) is the cross-check, these records the verdict. Standard library
only; Python 3.6+."""

import builtins
import functools
import os
import re
import sys
import types
import unittest
from typing import Any  # noqa: F401 - a type comment's


def _name(tp):
    return "{}.{}".format(getattr(tp, "__module__", "?"), getattr(tp, "__qualname__", getattr(tp, "__name__", "?")))


def setup(runner, send, cfg):
    select = set(str(t) for t in cfg.get("select") or [])
    if runner == "unittest":
        _unittest(send, select)
    elif runner == "sympy":
        _sympy(send, select, [os.path.abspath(str(p)) for p in cfg.get("tests") or []])
    send({"e": "hello", "pid": os.getpid(), "py": sys.version.split()[0], "runner": runner})


def _unittest(send, select):
    TestCase = unittest.TestCase
    orig_run = TestCase.run
    skip_types = (unittest.SkipTest,)

    def names(test):
        out = [str(test)]
        short = re.sub(r"^(\w+) \(([\w.]+)\.\1\)$", r"\1 (\2)", out[0])  # as Python before 3.11 names it
        if short != out[0]:
            out.append(short)
        try:
            doc = test.shortDescription()
        except Exception:
            doc = None
        if doc:
            out.append(doc)
        return out

    class Watch:
        """The result as TestCase.run sees it: notes the outcome, then passes every call on."""

        def __init__(self, test, result):
            self._test, self._result, self.outcome, self.exc = test, result, None, None

        def _note(self, outcome, err):
            if self.outcome in (None, "success") or outcome in ("failure", "error", "subfail"):
                if self.outcome not in ("failure", "error", "subfail"):
                    self.outcome = outcome
                    self.exc = _name(err[0]) if err and err[0] is not None else self.exc

        def addSuccess(self, test):
            self._note("success", None)
            return self._result.addSuccess(test)

        def addFailure(self, test, err):
            self._note("failure", err)
            return self._result.addFailure(test, err)

        def addError(self, test, err):
            self._note("error", err)
            return self._result.addError(test, err)

        def addSkip(self, test, reason):
            self._note("skip", None)
            return self._result.addSkip(test, reason)

        def addExpectedFailure(self, test, err):
            self._note("xfail", err)
            return self._result.addExpectedFailure(test, err)

        def addUnexpectedSuccess(self, test):
            self._note("xpass", None)
            return self._result.addUnexpectedSuccess(test)

        def addSubTest(self, test, subtest, err):
            if err is not None:
                self._note("subfail", err)
            return self._result.addSubTest(test, subtest, err)

        def __getattr__(self, name):
            return getattr(self._result, name)

    def run(self, result=None):
        if select and not select.intersection(names(self)):
            return result
        if result is None:
            result = self.defaultTestResult()
        method_name = str(getattr(self, "_testMethodName", "") or "")
        method = getattr(self, method_name, None) if method_name else None
        called = []
        if method is not None and callable(method):
            @functools.wraps(method)
            def method_wrapper(*a, **k):
                try:
                    out = method(*a, **k)
                except BaseException as e:
                    called.append(_name(type(e)))
                    raise
                called.append(None)
                return out

            setattr(self, method_name, method_wrapper)
        watch = Watch(self, result)  # type: Any
        try:
            return orig_run(self, watch)
        finally:
            if method is not None:
                try:
                    delattr(self, method_name)
                except AttributeError:
                    pass
            ids = names(self)
            if called:
                exc = called[0]
                if exc is not None and any(exc.endswith("." + t.__name__) for t in skip_types):
                    exc = "skip:" + exc
                send({"e": "call", "id": ids[0], "exc": exc})
            send({"e": "case", "id": ids[0], "ids": ids, "outcome": watch.outcome or "none", "exc": watch.exc})

    TestCase.run = run  # type: ignore[method-assign]


def _sympy(send, select, tests):
    real_exec = builtins.exec
    getframe = sys._getframe

    def observed(name, f):
        @functools.wraps(f)
        def test(*a, **k):
            try:
                out = f(*a, **k)
            except BaseException as e:
                send({"e": "call", "id": name, "exc": _name(type(e))})
                raise
            send({"e": "call", "id": name, "exc": None})
            return out

        return test

    def exec_(source, globals=None, locals=None, *rest, **kw):
        if globals is None:  # exec's own default: the caller's namespace
            frame = getframe(1)
            globals, locals = frame.f_globals, frame.f_locals if locals is None else locals
        out = real_exec(source, globals, locals, *rest, **kw) if locals is not None else \
            real_exec(source, globals, *rest, **kw)
        if isinstance(source, types.CodeType) and isinstance(globals, dict) \
                and os.path.abspath(source.co_filename) in tests:
            for key in [k for k in list(globals) if k.startswith("test_")]:
                f = globals[key]
                if not isinstance(f, types.FunctionType) or f.__code__.co_flags & 0x20:  # generators: left as is
                    continue
                if select and key not in select:
                    del globals[key]
                    continue
                globals[key] = observed(key, f)
        return out

    builtins.exec = exec_
