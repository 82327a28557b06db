"""The boundary between the tests and the learner's code (commtax/boundary/): what crosses it, and how.

Values cross in a safe form (plain data; arrays and tensors keep dtype and shape; records), exceptions come
back as builtin types with the learner's traceback, a hung call is killed at its deadline, and a stub is
found by reading the learner's file, running nothing.
"""

import os
import time

import pytest

from tests.grading_support import NEEDS_SOLUTIONS, ROOT

pytestmark = NEEDS_SOLUTIONS


LEARNER_MODULE = '''
import dataclasses, time

@dataclasses.dataclass
class Point:
    x: float
    y: float

class Mine(ValueError):
    pass

SCALE = 3

def echo(value):
    return value

def make_point(x, y):
    return Point(x, y)

def norm1(point):
    return abs(point.x) + abs(point.y)

def fail(kind):
    if kind == "value":
        raise ValueError("nbytes must be positive")
    if kind == "mine":
        raise Mine("a learner's subclass")
    if kind == "exit":
        raise SystemExit(3)
    raise KeyError(kind)

def sleep(seconds):
    time.sleep(seconds)
    return seconds

def stub(a, b):
    """Not written yet."""
    raise NotImplementedError("stub: not implemented yet. Hint: add")
'''


@pytest.fixture
def proxied(tmp_path, monkeypatch):
    from commtax.boundary import LabProxy

    path = tmp_path / "learner.py"
    path.write_text(LEARNER_MODULE)
    proxy = LabProxy(path, f"learner_{os.urandom(4).hex()}")
    yield proxy
    proxy.close()


def test_plain_data_arrays_tensors_and_records_cross_the_boundary_both_ways(proxied):
    import numpy as np
    import torch

    value = {
        "a": [1, 2.5, None, True],
        "b": (1, "x", b"\x00"),
        "c": {3, 4},
        5: np.arange(6.0).reshape(2, 3),
        "t": torch.arange(4, dtype=torch.bfloat16),
        "z": 1 + 2j,
        "n": np.float32(0.5),
    }
    back = proxied.echo(value)
    assert back["a"] == [1, 2.5, None, True] and back["b"] == (1, "x", b"\x00") and back["c"] == {3, 4}
    assert np.array_equal(back[5], value[5]) and torch.equal(back["t"], value["t"]) and back["z"] == 1 + 2j
    assert type(back["n"]) is float and back["n"] == 0.5
    point = proxied.make_point(3.0, -4.0)
    assert (point.x, point.y) == (3.0, -4.0) and proxied.norm1(point) == 7.0  # a record, rebuilt over there
    assert proxied.SCALE == 3 and proxied.__file__.endswith("learner.py")


def test_the_safe_form_refuses_every_global(tmp_path):
    import pickle

    from commtax.boundary import loads

    class Crafted(float):
        def __reduce__(self):
            return (os.system, (f"touch {tmp_path / 'ran'}",))

    for data in (pickle.dumps(Crafted(1.0)), pickle.dumps(pytest.approx(1.0)), pickle.dumps(os.system)):
        with pytest.raises(pickle.UnpicklingError, match="refused"):
            loads(data)
    assert not (tmp_path / "ran").exists()


def test_learner_exceptions_come_back_as_builtin_types_with_the_learners_traceback(proxied):
    from commtax.boundary import LearnerError

    with pytest.raises(ValueError, match="nbytes must be positive") as info:
        proxied.fail("value")
    assert "learner.py" in "".join(getattr(info.value, "__notes__", []))
    with pytest.raises(ValueError, match="subclass") as info:
        proxied.fail("mine")
    assert isinstance(info.value, LearnerError) and type(info.value).__name__ == "Mine"
    with pytest.raises(LearnerError, match="sys.exit"):
        proxied.fail("exit")  # never a SystemExit in the trusted process
    with pytest.raises(LearnerError):
        proxied.fail("other")


def test_a_hung_call_is_killed_at_its_deadline_and_the_next_call_gets_a_fresh_worker(proxied, monkeypatch):
    from commtax.boundary import LearnerProcessError

    assert proxied.sleep(0) == 0  # the worker is up
    monkeypatch.setenv("COMMTAX_LAB_CALL_TIMEOUT", "3")
    start = time.monotonic()
    with pytest.raises(LearnerProcessError, match="did not return within 3 s"):
        proxied.sleep(60)
    assert time.monotonic() - start < 20
    assert proxied.sleep(0) == 0


def test_stubs_are_found_by_reading_the_file_and_callables_do_not_cross(proxied):
    from commtax.boundary import BoundaryError
    from commtax.testing import require_implemented

    with pytest.raises(NotImplementedError, match="stub: not implemented yet"):
        require_implemented(proxied.norm1, proxied.stub)
    require_implemented(proxied.norm1)
    with pytest.raises(BoundaryError):
        proxied.echo(lambda: 1)


def test_the_codec_refuses_shapes_that_do_not_match_their_bytes_and_keeps_kinds():
    import pickle

    import numpy as np

    from commtax.boundary import BoundaryError, LabRecord, dumps, loads

    tag = "\x00commtax-boundary"
    for forged in (
        (tag, "tensor", "float64", (10**6, 10**6), b""),  # 8 TB asked for, nothing sent
        (tag, "ndarray", "<f8", (-1,), b"\x00" * 8),  # a shape that hides the size
        (tag, "ndarray", "<f8", (3,), b"\x00" * 8),  # bytes for one element, not three
        (tag, "nonsense", 1),
    ):
        with pytest.raises(BoundaryError, match="refused"):
            loads(pickle.dumps(forged))
    looks_tagged = (tag, "ndarray", "<f8", (1,), b"\x00" * 8)
    assert loads(dumps(looks_tagged)) == looks_tagged  # a plain tuple stays a plain tuple
    assert loads(dumps(np.empty(0))).shape == (0,) and loads(dumps(True)) is True
    same = LabRecord("Op", {"t": np.zeros(2), "n": 1})
    assert same == LabRecord("Op", {"t": np.zeros(2), "n": 1})
    assert same != LabRecord("Op", {"t": np.zeros(3), "n": 1}) and same != LabRecord("Op", {"t": np.empty(0), "n": 1})
    assert same != LabRecord("Op", {"t": np.zeros(2), "n": True}) and same != LabRecord(
        "Op", {"t": np.zeros(2), "n": 1.0}
    )
    assert LabRecord("Op", {"x": float("nan")}) != LabRecord("Op", {"x": float("nan")})


def test_learner_text_is_cleaned_of_what_breaks_or_fools_a_report():
    from grading.sanitize import clean

    shown = clean("a\ud800b \x1b[31mred\x1b[0m \x00 \r\n\u202edone" + "x" * 5000)
    shown.encode("utf-8")
    assert "\x1b" not in shown and "\x00" not in shown and "\u202e" not in shown and "\r" not in shown
    assert shown.startswith("a\ufffd") and "red" in shown and len(shown) < 1600 and "more characters not shown" in shown


def test_the_boundary_the_lab_loader_and_the_pickler_import_each_other_in_one_direction_only():
    import ast

    modules = {
        "commtax.harness.labs": ROOT / "commtax" / "harness" / "labs.py",
        "commtax.learner_process": ROOT / "commtax" / "learner_process.py",
        **{
            f"commtax.boundary.{p.stem}" if p.stem != "__init__" else "commtax.boundary": p
            for p in (ROOT / "commtax" / "boundary").glob("*.py")
        },
    }
    graph = {}
    for name, path in modules.items():  # every import, at the top or inside a function
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            targets = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else (
                    [node.module] + [f"{node.module}.{a.name}" for a in node.names]
                    if isinstance(node, ast.ImportFrom) and node.module
                    else []
                )
            )
            found.update(t for t in targets if t in modules and t != name)
        graph[name] = found

    def reaches(start, goal, seen=()):
        return any(n == goal or (n not in seen and reaches(n, goal, (*seen, n))) for n in graph[start])

    assert not [m for m in graph if reaches(m, m)], graph
