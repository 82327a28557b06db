"""The pytest plugin the grader loads into each lab's test process (``-p grading.collector``).

It reports every test's outcome to the grading process through a pipe, one
JSON line per test, signed with an HMAC whose key the grader hands over
through a second pipe that is read and closed before any lab code is
imported. What the submission prints, writes to files, or fakes on stdout
is never read; a line the submission forges into the pipe without the key is
ignored; a test that never reports (the process exited, crashed or timed
out) counts as failed. Hidden tests report no message, so their source
cannot leak.

In collect-only mode (the grader's own trusted pass) it reports each test's
id, its points and its markers instead.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os

import pytest

OUTCOME_FD = "COMMTAX_GRADING_OUT_FD"
KEY_FD = "COMMTAX_GRADING_KEY_FD"
MESSAGE_LIMIT = 2000


def sign(key: bytes, payload: str) -> str:
    return hmac.new(key, payload.encode(), hashlib.sha256).hexdigest()


class _Channel:
    def __init__(self, key: bytes, fd: int):
        self._key, self._fd = key, fd

    def send(self, record: dict) -> None:
        payload = json.dumps(record, sort_keys=True)
        line = json.dumps({"payload": payload, "mac": sign(self._key, payload)}) + "\n"
        data = line.encode()
        while data:
            written = os.write(self._fd, data)
            data = data[written:]


_channel: _Channel | None = None
_results: dict = {}


def _is_hidden(item) -> bool:
    return item.get_closest_marker("hidden") is not None or "/hidden/" in str(item.path).replace("\\", "/")


def pytest_configure(config):
    global _channel
    config.addinivalue_line(
        "markers", "hidden: a hidden test (grading/hidden); its source and messages are never shown"
    )
    out_fd, key_fd = os.environ.pop(OUTCOME_FD, None), os.environ.pop(KEY_FD, None)
    if out_fd is None or key_fd is None:
        return
    with os.fdopen(int(key_fd), "rb") as f:  # read once, then closed
        key = f.read()
    from grading.process import make_undumpable

    make_undumpable()  # no process of the same user may read the key from our memory or /proc
    _channel = _Channel(key, int(out_fd))
    if _learner_shares_our_files():
        _import_commtax()


def _learner_shares_our_files() -> bool:
    """The fallback's same-user mode: learner code runs as us and could rewrite this trusted tree."""
    settings = json.loads(os.environ.get("COMMTAX_SANDBOX") or "null")
    return isinstance(settings, dict) and not settings.get("relay") and settings.get("uid") is None


def _import_commtax() -> None:
    """Import every commtax module now, before any learner code runs, so that none is read from disk
    later, when learner code (as our user) could have changed it. (The widgets are left out: no test
    uses them, and they are slow to import.)"""
    import importlib
    import pkgutil

    import commtax

    for module in pkgutil.walk_packages(commtax.__path__, "commtax."):
        if not module.name.startswith("commtax.ui"):
            try:
                importlib.import_module(module.name)
            except Exception:  # noqa: BLE001 - a module that cannot be imported here is not used here
                pass


def pytest_collection_modifyitems(session, config, items):
    for item in items:
        if "/hidden/" in str(item.path).replace("\\", "/"):
            item.add_marker("hidden")
    if _channel is not None and config.option.collectonly:
        for item in items:
            points = item.get_closest_marker("points")
            _channel.send(
                {
                    "kind": "collected",
                    "nodeid": item.nodeid,
                    "points": float(points.args[0]) if points and points.args else 1.0,
                    "hidden": _is_hidden(item),
                    "nccl": item.get_closest_marker("nccl") is not None,
                }
            )


@pytest.hookimpl(tryfirst=True)
def pytest_collection_finish(session):
    """Under the grader, once the hidden tests are imported, take their files off the disk.

    No learner code has run yet (this runs before labs/conftest.py starts the
    ``lab`` proxies' workers), so no learner process can ever find them on disk,
    whatever its user.
    """
    if _channel is None or session.config.option.collectonly:
        return
    import shutil
    from pathlib import Path

    for item in session.items:
        if _is_hidden(item):
            folder = Path(str(item.path)).parent
            if folder.name == "hidden":
                shutil.rmtree(folder, ignore_errors=True)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if _channel is None:
        return
    state = _results.setdefault(item.nodeid, {"outcome": "passed", "message": "", "duration": 0.0})
    state["duration"] += report.duration
    if report.skipped and state["outcome"] == "passed":
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        state.update(outcome="skipped", message=str(reason)[:MESSAGE_LIMIT])
    elif report.failed and state["outcome"] != "failed":
        if call.excinfo is not None:
            message = f"{call.excinfo.typename}: {call.excinfo.value}"
            # Our conftest shortens "not implemented yet" failures; keep that one line.
            if isinstance(report.longrepr, str):
                message = report.longrepr
        else:
            message = str(report.longrepr)
        state.update(outcome="failed", message=message.strip()[:MESSAGE_LIMIT])
    if report.when == "teardown":
        record = {"kind": "result", "nodeid": item.nodeid, **state}
        if _is_hidden(item):
            record["message"] = ""  # never send a hidden test's assertion text or source
        _channel.send(record)
