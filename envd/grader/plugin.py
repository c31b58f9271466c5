"""The referee's pytest plugin: `setup(send, cfg)` is called by boot.py before any file of the
repository is imported, and returns the plugin object boot registers through
`pytest.main(plugins=[...])`: registered before entry-point plugins, `-p` options and every
conftest, hence before any code of the package under test. It reports, through `send` (boot's
channel to the referee):

- `hello` at setup; `module` (the hash of each of the row's test files just before pytest
  imports it); `collected` (every item's node id) once collection ends;
- `phase` for each item's setup / call / teardown, read before any other makereport
  implementation runs (`pre`: the exception pytest's CallInfo caught, as a qualified type name)
  and after them (`post`, `report`), so a report rewritten later does not change what was sent;
- `call`: whether the test function itself raised, from the innermost pytest_pyfunc_call wrapper
  (a plain test function whose call phase has no such record never ran);
- `finish`: the session's exit status (nothing is sent after it).

Every function here closes over `send` and the run's settings: there is no module state to
rebind. pytest's debugger keeps the config in a class attribute (`pytestPDB._config`), a path
to the plugin manager without frames or gc: cleared once configured (the grader never runs
--pdb). Written for Python 3.6+ and pytest 3+ with the standard library only."""

import hashlib
import os
import sys
import types

import pytest


def _function_class():
    try:
        from _pytest.python import Function

        return Function
    except ImportError:  # every pytest since 3.0 has it
        return None


def setup(send, cfg):
    """The plugin object for this run (hooks closing over `send` and `cfg`)."""
    Function = _function_class()
    config_box = []  # type: list
    pid = os.getpid()
    root = os.getcwd()
    tests = tuple(str(p) for p in cfg.get("tests") or [] if p)
    select = [str(t) for t in cfg.get("select") or []]

    def ours(config):
        """Only the first session reports (pytester's in-process runs have sessions of their own)."""
        return bool(config_box) and config is config_box[0]

    def exc_name(excinfo):
        if excinfo is None:
            return None
        tp = excinfo.type if hasattr(excinfo, "type") else excinfo[0]
        return "{}.{}".format(getattr(tp, "__module__", "?"), getattr(tp, "__qualname__", getattr(tp, "__name__", "?")))

    def ids(item):
        out = [item.nodeid]
        try:
            rel = item.config.cwd_relative_nodeid(item.nodeid)
            if rel != item.nodeid:
                out.append(rel)
        except Exception:
            pass
        return out

    def sha(path):
        try:
            with open(str(path), "rb") as f:
                return hashlib.sha256(f.read()).hexdigest()
        except OSError:
            return None

    @pytest.hookimpl(trylast=True)
    def pytest_configure(config):
        if not config_box:
            config_box.append(config)
            dbg = sys.modules.get("_pytest.debugging")
            pdb_cls = getattr(dbg, "pytestPDB", None)
            for attr in ("_config", "_pluginmanager"):
                if pdb_cls is not None and hasattr(pdb_cls, attr):
                    setattr(pdb_cls, attr, None)

    @pytest.hookimpl(hookwrapper=True, tryfirst=True)
    def pytest_make_collect_report(collector):
        """A test module's file as it is just before pytest imports it (the code under test,
        imported by it, runs only after its source was read): the referee compares it with the
        file as it was before the run, so tests rewritten while others ran are seen."""
        if ours(collector.config) and isinstance(collector, pytest.Module):
            path = str(getattr(collector, "path", None) or getattr(collector, "fspath", ""))
            rel = os.path.relpath(path, root) if os.path.isabs(path) else path
            if rel in tests:
                send({"e": "module", "path": rel, "sha": sha(path)})
        yield

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(session, config, items):
        if not select or not ours(config):
            return
        wanted = set(select)
        keep = [i for i in items if wanted.intersection(ids(i)) or any(x.split("[")[0] in wanted for x in ids(i))]
        drop = [i for i in items if i not in keep]
        if drop:
            config.hook.pytest_deselected(items=drop)
        items[:] = keep

    @pytest.hookimpl(hookwrapper=True, trylast=True)
    def pytest_collection_finish(session):
        if ours(session.config):
            send({"e": "collected", "ids": [ids(i) for i in session.items]})
        yield

    @pytest.hookimpl(hookwrapper=True, trylast=True)
    def pytest_pyfunc_call(pyfuncitem):
        outcome = yield
        if ours(pyfuncitem.config):
            send({"e": "call", "id": pyfuncitem.nodeid, "exc": exc_name(outcome.excinfo)})

    @pytest.hookimpl(hookwrapper=True, trylast=True)
    def pytest_runtest_makereport(item, call):
        pre = exc_name(call.excinfo)
        outcome = yield
        if not ours(item.config):
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
        send({"e": "phase", "id": item.nodeid, "ids": ids(item), "when": call.when, "pre": pre,
              "post": exc_name(call.excinfo), "report": getattr(rep, "outcome", None), "xfail": xfail,
              "fn": Function is not None and type(item) is Function})

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(session, exitstatus):
        if ours(session.config):
            send({"e": "finish", "exitstatus": int(exitstatus)})

    plugin = types.ModuleType("_swarl_referee_plugin")
    for fn in (pytest_configure, pytest_make_collect_report, pytest_collection_modifyitems,
               pytest_collection_finish, pytest_pyfunc_call, pytest_runtest_makereport, pytest_sessionfinish):
        setattr(plugin, fn.__name__, fn)
    send({"e": "hello", "pid": pid, "py": sys.version.split()[0], "pytest": pytest.__version__})
    return plugin
