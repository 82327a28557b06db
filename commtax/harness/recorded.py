"""Expected values a lab test takes from the course's reference, recorded for the student release.

Some lab tests compare the learner with a reference that lives in ``commtax``
(Lab 11's predictor, the course's byte bill, Lesson 07's ZeRO formulas). The
student release ships none of those (``grading/answers.py``), so such a test
asks for its expected value by name and input instead::

    EXPECTED = Expected(HERE)                         # in test_lab.py
    expect_close(lab.tp_time(run), EXPECTED("tp_time", run), rel=1e-6, what=...)

* In the course repository, ``labs/LAB/expected.py`` (never shipped) holds the
  recipes: ``RECIPES`` ({name: function of the inputs, on commtax's
  reference}) and ``cases()`` (every (name, inputs) the visible tests ask for,
  and nothing else). ``EXPECTED(name, *inputs)`` runs the recipe, after
  checking that the input is one ``cases()`` lists: a test asking for an input
  the release would not hold fails here, loudly, in the course repository.
* ``python -m grading release`` runs every recipe on every listed case
  (:func:`record`) and writes ``labs/LAB/expected.json`` into the release:
  plain numbers (and the odd string, such as a binding axis), keyed by name and
  inputs; no code, no formula. Hidden tests never ask through this, so their
  inputs are never recorded.
* In the release ``EXPECTED(name, *inputs)`` reads that file. A missing file or
  entry fails the test (never a skip: a learner must get the grader's feedback).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

RECIPES_FILE = "expected.py"  # the course repository's recipes (not in the student release)
RECORD_FILE = "expected.json"  # the release's recorded values


class MissingRecord(AssertionError):
    """The release's record lacks an expected value a test asks for (or the file is missing)."""


def key(name: str, args) -> str:
    """The record's key for ``name`` at ``args``: the name and the inputs as canonical JSON."""
    return f"{name}{json.dumps(plain(list(args)), sort_keys=True, separators=(',', ':'))}"


def plain(value):
    """``value`` as JSON data (numbers, strings, lists, dicts with string keys); anything else raises."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float) or hasattr(value, "__float__") and not hasattr(value, "__len__"):
        number = float(value)
        if not math.isfinite(number):
            raise ValueError(f"value {number!r} cannot be recorded (not finite)")
        return int(value) if type(value).__name__.startswith(("int", "uint")) else number
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if hasattr(value, "tolist"):  # a numpy array
        return plain(value.tolist())
    if isinstance(value, dict):
        if not all(isinstance(k, str) for k in value):
            raise ValueError(f"value {value!r} cannot be recorded: dict keys must be strings")
        return {k: plain(v) for k, v in value.items()}
    raise ValueError(f"value of type {type(value).__name__} cannot be recorded")


def _load_recipes(lab_dir: Path):
    from commtax.boundary.byfile import load_module_from_file

    return load_module_from_file(f"{lab_dir.name.replace('-', '_')}_expected", str(lab_dir / RECIPES_FILE))


def lab_test_data(lab_dir):
    """A lab's ``test_lab.py`` loaded as data, for its recipes' ``cases()`` (its inputs stay in one place).

    Loaded under its own name, apart from pytest's copy. It costs milliseconds, plus torch's import for a
    lab whose tests import torch (Labs 09 and 13; Lab 12's bill imports it anyway): the release build
    takes ~3 s instead of ~0.5 s. Labs 05, 08, 10 and 12 list their few inputs in expected.py itself; Lab 11's read its _plans.py.
    """
    from commtax.boundary.byfile import load_module_from_file

    lab_dir = Path(lab_dir)
    return load_module_from_file(f"{lab_dir.name.replace('-', '_')}_test_data", str(lab_dir / "test_lab.py"))


def record(lab_dir) -> dict:
    """{key: value} for every case the lab's recipes list (course repository only: it runs the reference)."""
    recipes = _load_recipes(Path(lab_dir))
    values = {}
    for name, args in recipes.cases():
        values[key(name, args)] = plain(recipes.RECIPES[name](*_copy(args)))
    return values


def _copy(args):
    """A deep copy of plain inputs, so a recipe that changes its run dict changes no other case."""
    return json.loads(json.dumps(list(args)))


class Expected:
    """``EXPECTED(name, *inputs)``: the expected value of a lab test (see the module docstring)."""

    def __init__(self, lab_dir):
        self.lab_dir = Path(lab_dir)
        self._recipes = None
        self._listed = None
        self._recorded = None

    @property
    def reference_here(self) -> bool:
        """True in the course repository (and the teacher's grader): the recipes and commtax's reference ship."""
        return (self.lab_dir / RECIPES_FILE).exists()

    def __call__(self, name: str, *args):
        wanted = key(name, args)
        if self.reference_here:
            if self._recipes is None:
                self._recipes = _load_recipes(self.lab_dir)
                self._listed = {key(n, a) for n, a in self._recipes.cases()}
            if wanted not in self._listed:
                raise MissingRecord(
                    f"{self.lab_dir.name}/{RECIPES_FILE} does not list the case {wanted}: the student release "
                    f"would have no expected value for it. Add it to cases() there."
                )
            return self._recipes.RECIPES[name](*_copy(args))
        if self._recorded is None:
            path = self.lab_dir / RECORD_FILE
            if not path.exists():
                raise MissingRecord(
                    f"{path} is missing: this copy of the course was built without the expected "
                    f"values its tests compare with (python -m grading release writes them)"
                )
            self._recorded = json.loads(path.read_text())
        if wanted not in self._recorded:
            raise MissingRecord(
                f"{self.lab_dir.name}/{RECORD_FILE} has no expected value for {wanted}: the record "
                f"does not match the tests (rebuild the release)"
            )
        return self._recorded[wanted]
