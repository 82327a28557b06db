"""The learner's own lab code, for the parts of ``commtax`` a lab grades (student release only).

In the full repository nothing calls this module: the reference formulas run.
The student release ships no implementation of a graded function (see
``grading/answers.py``): there, each such body in ``commtax`` is replaced by a
call into the learner's lab module, e.g.
``return learner.lab("01").allreduce_time(nbytes, world_size, alpha, bandwidth, algorithm)``,
so the lessons' calculators run on the learner's code. Until that function
works it raises :class:`Unlit`, which a calculator shows as "implement Lab
01's ``allreduce_time`` (labs/lab-01-alpha-beta/starter.py) to light this
calculator" instead of a traceback.
"""

from __future__ import annotations

import functools
import os
import sys

import numpy as np

from commtax import labs
from commtax.unlit import Unavailable, Unlit, _number  # noqa: F401  (learner.Unlit is their public name)


class _LabFunctions:
    """``lab("01").f(...)``: calls the learner's ``f``; a stub or a broken file raises :class:`Unlit`."""

    def __init__(self, number: str):
        self._number = number

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        number = self._number

        def call(*args, **kwargs):
            _skip_in_a_lab_test(number, name)
            module = _load(number, name)
            function = getattr(module, name, None)
            if function is None:
                raise Unlit(number, name, f"your starter.py has no `{name}`")
            try:
                try:
                    return function(*args, **kwargs)
                except (TypeError, ValueError):
                    if not _has_array(args, kwargs):
                        raise
                    # commtax's formulas take numpy arrays (a curve in one call); a lab's take numbers.
                    return _elementwise(function, args, kwargs)
            except Unlit:
                raise
            except NotImplementedError as exc:
                raise Unlit(number, name, str(exc).split(". Hint:")[0]) from None

        call.__name__ = name
        return call


def _has_array(args, kwargs) -> bool:
    return any(isinstance(a, np.ndarray) and a.ndim > 0 for a in (*args, *kwargs.values()))


def _elementwise(function, args, kwargs):
    """``function`` at every element of the (broadcast) array arguments, given as Python numbers."""
    keys = list(kwargs)
    arrays = [i for i, a in enumerate((*args, *kwargs.values())) if isinstance(a, np.ndarray) and a.ndim > 0]
    values = list((*args, *kwargs.values()))
    broadcast = np.broadcast_arrays(*(values[i] for i in arrays))
    results = []
    for index in np.ndindex(broadcast[0].shape):
        for i, array in zip(arrays, broadcast):
            values[i] = array[index].item()  # a Python float or int, as a learner's checks expect
        results.append(function(*values[: len(args)], **dict(zip(keys, values[len(args) :]))))
    return np.array(results).reshape(broadcast[0].shape)


_LOADED_AT: dict[str, float] = {}  # module name -> mtime of starter.py when it was loaded


def _load(number: str, name: str):
    """The learner's starter module, loaded again when the file changed (edit, save, move a slider)."""
    try:
        path, module_name = labs.lab_file(labs.find_lab(number), "starter")
        mtime = path.stat().st_mtime
        if _LOADED_AT.get(module_name) != mtime:
            sys.modules.pop(module_name, None)
            _LOADED_AT[module_name] = mtime
        return labs.load_lab(path.parent, "starter")
    except Exception as exc:  # a syntax error in the learner's file must not break the lesson
        raise Unlit(number, name, f"starter.py does not load: {type(exc).__name__}: {exc}") from None


@functools.cache
def lab(number) -> _LabFunctions:
    """The learner's functions of lab ``number`` ("01", "lab-01" or 1)."""
    _in_a_notebook()
    return _LabFunctions(_number(number))


def unlit(lab_number, name: str, why: str = "not implemented yet: this copy has no reference for it"):
    """Raise :class:`Unlit` (an expression form, for one-line release statements)."""
    _skip_in_a_lab_test(lab_number, name)
    raise Unlit(lab_number, name, why)


def unavailable(lab_number, name: str):
    """Raise :class:`Unavailable` (the release statement of a GRADED block that no lab call can replace)."""
    _skip_in_a_lab_test(lab_number, name)
    raise Unavailable(lab_number, name)


def _skip_in_a_lab_test(lab_number, name: str) -> None:
    """Inside a test (the release's pytest), a reference that is not here skips the test, honestly.

    A lab test that checks the learner against a ``commtax`` reference would,
    in the release, compare the learner with the learner (or fail for want of
    the reference): it is skipped there, and the teacher's grader, which has
    the reference, runs it. (The learner's own code runs in a worker process
    that has no pytest, so this never fires for it.)
    """
    if "_pytest" in sys.modules and os.environ.get("PYTEST_CURRENT_TEST"):
        import pytest

        pytest.skip(
            f"this test checks against the course's reference for Lab {_number(lab_number)}'s "
            f"`{name}`, which is not in the student release; your teacher's grader runs it"
        )


@functools.cache
def _in_a_notebook() -> None:
    """Show Unlit in any notebook cell as one line (the lessons' plain tables need lab code too)."""
    if "IPython" in sys.modules:
        from commtax.ui import powered

        powered.install_cell_handler()
