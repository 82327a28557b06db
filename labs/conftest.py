"""The one fixture every lab test uses: ``lab``, the module under test, behind a process boundary.

``lab`` stands for the ``starter.py`` or ``solution.py`` of the lab folder the
test file sits in (or under: the grader puts hidden tests in
``labs/LAB/hidden/``), as ``LAB_IMPL`` says (see ``commtax/labs.py``). Tests
never import either file directly, so the same test checks the reference and
the learner's code.

It is a :class:`commtax.boundary.proxy.LabProxy`: the learner's file is imported in a
separate worker process, and ``lab.f(...)`` sends the call there. Pass and
expect plain data only (numbers, strings, lists, tuples, dicts, numpy arrays,
tensors; dataclass instances come back as read-only records). See
``commtax/boundary/``. Once the tests are collected, every lab's worker is
started at once, so that their imports (torch) overlap the tests that run
before them.
"""

from pathlib import Path

import pytest

from commtax.labs import load_lab_proxy

_proxies = {}


def _lab_folder(path) -> Path | None:
    """The lab folder a test file lies in (None for a test outside labs/, e.g. tests/ parametrized by a `lab`)."""
    return next((p for p in Path(path).parents if p.name.startswith("lab-")), None)


def _proxy(folder: Path):
    if folder not in _proxies:
        _proxies[folder] = load_lab_proxy(folder)
    return _proxies[folder]


def pytest_collection_finish(session):
    if session.config.option.collectonly:
        return
    folders = (_lab_folder(item.path) for item in session.items if "lab" in getattr(item, "fixturenames", ()))
    for folder in dict.fromkeys(f for f in folders if f is not None):
        try:
            _proxy(folder).prestart()
        except (OSError, ValueError):
            pass  # the test that needs it reports the problem


def pytest_sessionfinish(session):
    for proxy in _proxies.values():
        proxy.close()


@pytest.fixture(scope="module")
def lab(request):
    proxy = _proxy(_lab_folder(request.path))
    yield proxy
    proxy.close()
