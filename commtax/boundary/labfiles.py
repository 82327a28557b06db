"""Find the labs and load a lab's ``starter.py`` or ``solution.py``.

``LAB_IMPL`` picks which file the tests (and the lessons' "run your code"
cells) use:

* ``LAB_IMPL=solution``: the reference implementation.
* ``LAB_IMPL=starter``: your implementation, in ``starter.py``.
* unset: ``solution`` where the lab has a ``solution.py``, else ``starter``
  (the student release ships no solutions, so it defaults to your code).

Any other value is a usage error. Lab files are loaded by path under a
stable module name (``lab_01_alpha_beta_solution``), which is also the name
ranks started by :mod:`commtax.ranks.launch` load them under.

Under the grader, a process the tests started (a lab's helper script run with
``subprocess``) is trusted like the tests: there :func:`load_lab` returns a
:class:`commtax.boundary.proxy.LabProxy`, so the learner's file still runs
only in the sandbox.

This sits at the boundary (below the ranks) because both the lab harness
(:mod:`commtax.harness.labs`, which re-exports these names as ``commtax.labs``) and the
lessons' demos that run a lab's code on real ranks (``commtax.ranks.*_demo``) load lab files.
"""

from __future__ import annotations

import os
import re
import types
from pathlib import Path

from commtax.boundary.byfile import load_module_from_file
from commtax.boundary.proxy import LabProxy
from commtax.learner_process import sandbox

IMPLS = ("starter", "solution")
ENV_VAR = "LAB_IMPL"
REPO_ROOT = Path(__file__).resolve().parents[2]
LABS_DIR = REPO_ROOT / "labs"
_LAB_DIR_RE = re.compile(r"^lab-(\d\d)-[a-z0-9-]+$")


def requested_impl(environ=None) -> str | None:
    """The value of ``LAB_IMPL`` (validated), or None when it is unset or empty."""
    value = (os.environ if environ is None else environ).get(ENV_VAR, "").strip()
    if not value:
        return None
    if value not in IMPLS:
        raise ValueError(
            f"{ENV_VAR} must be one of {', '.join(IMPLS)} (or unset, meaning solution "
            f"where there is one); got {value!r}"
        )
    return value


def lab_dirs(labs_dir: Path = LABS_DIR) -> list[Path]:
    """Every lab folder (``labs/lab-NN-name``), in course order."""
    return sorted(p for p in Path(labs_dir).iterdir() if p.is_dir() and _LAB_DIR_RE.match(p.name))


def find_lab(name: str, labs_dir: Path = LABS_DIR) -> Path:
    """The folder of a lab given its folder name or number (``"lab-01-alpha-beta"``, ``"01"``, ``1``)."""
    for path in lab_dirs(labs_dir):
        number = _LAB_DIR_RE.match(path.name).group(1)
        if str(name) in (path.name, number) or (str(name).isdigit() and int(name) == int(number)):
            return path
    known = ", ".join(p.name for p in lab_dirs(labs_dir))
    raise ValueError(f"no lab called {name!r}; the labs are: {known}")


def module_name(lab_dir: Path, impl: str) -> str:
    return f"{Path(lab_dir).name.replace('-', '_')}_{impl}"


def resolve_impl(lab_dir: Path, impl: str | None = None) -> str:
    """Which file to load for ``lab_dir``: ``impl``, else ``LAB_IMPL``, else the default."""
    if impl is None:
        impl = requested_impl()
    elif impl not in IMPLS:
        raise ValueError(f"impl must be one of {', '.join(IMPLS)}, got {impl!r}")
    if impl is None:
        impl = "solution" if (Path(lab_dir) / "solution.py").exists() else "starter"
    return impl


def lab_file(lab_dir, impl: str | None = None) -> tuple[Path, str]:
    """(path of ``starter.py`` or ``solution.py``, the module name to load it under), as LAB_IMPL says."""
    lab_dir = Path(lab_dir)
    if not lab_dir.is_dir():
        lab_dir = find_lab(str(lab_dir))
    impl = resolve_impl(lab_dir, impl)
    path = lab_dir / f"{impl}.py"
    if not path.exists():
        if impl == "solution":
            raise FileNotFoundError(
                f"{ENV_VAR}=solution, but {path} is not in this copy of the course (the student "
                f"release has no solutions). Use {ENV_VAR}=starter to test your own code."
            )
        raise FileNotFoundError(f"{path} is missing")
    return path, module_name(lab_dir, impl)


def load_lab(lab_dir, impl: str | None = None) -> types.ModuleType:
    """Import ``starter.py`` or ``solution.py`` of ``lab_dir`` (see the module docstring)."""
    path, name = lab_file(lab_dir, impl)
    if sandbox() is not None:  # a trusted process under the grader: never import learner code here
        return LabProxy(path, name)
    return load_module_from_file(name, str(path))
