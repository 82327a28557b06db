"""Find the labs and load a lab's ``starter.py`` or ``solution.py``: the lab tests' side.

Finding a lab and choosing its file (``LAB_IMPL``) live in :mod:`commtax.boundary.labfiles`
(the ranks' demos load lab files too, and may not import the harness); their names are
re-exported here, so ``commtax.labs.load_lab`` and the rest read as before. The tests' ``lab``
fixture is :func:`load_lab_proxy`.

``LAB_INPROCESS=1`` (outside the grader only) makes that fixture the lab's module itself, imported in
the test process, so that ``breakpoint()`` in the learner's code stops in the terminal that runs
``pytest`` (see :func:`load_lab_proxy`).
"""

from __future__ import annotations

import os
import types

from commtax.boundary.byfile import load_module_from_file
from commtax.boundary.labfiles import (
    ENV_VAR,
    IMPLS,
    LABS_DIR,
    REPO_ROOT,
    find_lab,
    lab_dirs,
    lab_file,
    load_lab,
    module_name,
    requested_impl,
    resolve_impl,
)
from commtax.boundary.proxy import LabProxy
from commtax.learner_process import sandbox

__all__ = [
    "ENV_VAR",
    "IMPLS",
    "INPROCESS_VAR",
    "LABS_DIR",
    "REPO_ROOT",
    "InProcessLab",
    "find_lab",
    "inprocess_requested",
    "lab_dirs",
    "lab_file",
    "load_lab",
    "load_lab_proxy",
    "module_name",
    "requested_impl",
    "resolve_impl",
]

INPROCESS_VAR = "LAB_INPROCESS"


class InProcessLab(types.ModuleType):
    """A lab module imported in the test process (``LAB_INPROCESS=1``): what the ``lab`` fixture gives
    there. It is the module itself, with the proxy's two lifecycle calls, which do nothing here."""

    def prestart(self) -> None:
        """Nothing to start: the module is already imported in this process."""

    def close(self) -> None:
        """Nothing to stop: no worker process."""


def inprocess_requested(environ=None) -> bool:
    """Whether ``LAB_INPROCESS`` asks for the lab in the test process ("1"; "0" or unset: no).

    Refused (ValueError) under the grader: there the learner's code runs only in the sandbox.
    """
    value = (os.environ if environ is None else environ).get(INPROCESS_VAR, "").strip()
    if value in ("", "0"):
        return False
    if value != "1":
        raise ValueError(f"{INPROCESS_VAR} must be 1 (the lab in the test process) or 0/unset, got {value!r}")
    if sandbox() is not None:
        raise ValueError(f"{INPROCESS_VAR}=1 is refused under the grader: graded code runs only in its sandbox")
    return True


def load_lab_proxy(lab_dir, impl: str | None = None) -> LabProxy | InProcessLab:
    """The proxy for ``lab_dir``'s ``starter.py``/``solution.py`` (chosen as :func:`load_lab` does):
    the learner's file runs in a worker process, never in the caller's.

    With ``LAB_INPROCESS=1`` (:func:`inprocess_requested`), the module itself instead, imported in the
    caller's process, so that a debugger (``breakpoint()``) stops in the learner's code. A distributed
    test still runs its ranks in processes of their own: debug a function called directly.
    """
    path, name = lab_file(lab_dir, impl)
    if inprocess_requested():
        module = load_module_from_file(name, str(path))
        module.__class__ = InProcessLab
        return module
    return LabProxy(path, name)
