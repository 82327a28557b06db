"""Pytest helpers for the labs: run ranks or skip, and the backends to parametrize over.

Also the checks a lab test makes on what a learner returned: :func:`expect_close`
(kind, shape and value), :func:`number`, and :func:`expect_value_error` (bad input
raises a ValueError naming THE bad argument as a word, not every argument).
"""

from __future__ import annotations

import ast
import inspect
import math
import os
import re
import sys
import textwrap
import types

import pytest

from commtax.ranks._report import RAISED_EARLIER
from commtax.ranks.launch import BackendUnavailable, DistributedRunError, backend_unavailable_reason, run_ranks

#: Parametrize a distributed test over these: gloo always runs; NCCL runs only
#: where there is a GPU per rank and is skipped (with the reason) elsewhere.
BACKENDS = ("gloo", pytest.param("nccl", marks=pytest.mark.nccl))


class RememberedHang(DistributedRunError):
    """Not run: the same worker on the same lab code hung earlier in this session."""


class SharedRunFailed(DistributedRunError):
    """The run a test shares with an earlier test (:class:`SharedRuns`) failed there."""


def _headline(error: DistributedRunError) -> str:
    """The diagnosis part of a run's error: up to the first blank line (the details follow it)."""
    return str(error).split("\n\n", 1)[0]


#: Hangs seen in this pytest session: (worker, lab files among its arguments) -> (the error, the test).
#: A job that deadlocked (or hit its deadline) would hang the same way in the next test
#: that runs it with other sizes: that test fails at once, saying so, instead.
_HANGS: dict = {}


def _lab_file(value) -> str | None:
    """The file of a lab module (or of the lab fixture's proxy of one) passed to a job."""
    if isinstance(value, types.ModuleType) or type(value).__name__ == "LabProxy":
        path = getattr(value, "__file__", None)
        return path if isinstance(path, str) else repr(value)
    return None


def _hang_key(fn, args, kwargs) -> tuple:
    labs = tuple(sorted(filter(None, map(_lab_file, (*args, *(kwargs or {}).values())))))
    return (getattr(fn, "__module__", None), getattr(fn, "__qualname__", repr(fn)), labs)


def _current_test() -> str:
    return os.environ.get("PYTEST_CURRENT_TEST", "an earlier test").rsplit(" (", 1)[0].split("::")[-1]


def run_or_skip(fn, world_size: int, args: tuple = (), kwargs: dict | None = None, *,
                backend: str = "gloo", timeout: float = 60.0, **options):
    """:func:`commtax.ranks.launch.run_ranks`, turning "this backend cannot run here" into a skip.

    A job that hung (deadlock or deadline), or dropped the request of an
    isend, is remembered: running the same worker on the same lab code again
    fails at once with a short message that points at the first failure.
    """
    __tracebackhide__ = True  # pytest: the learner's line, not the runner's
    key = _hang_key(fn, args, kwargs)
    if key in _HANGS:
        error, test, size = _HANGS[key]
        what = "dropped a request" if error.first.dropped else "hung"
        raise RememberedHang(
            f"not run: {key[1]}() {what} on {size} ranks in {test}, and would do the same "
            f"here. Fix that first:\n{_headline(error)}", error.failures)
    try:
        return run_ranks(fn, world_size, args, kwargs, backend=backend, timeout=timeout, **options)
    except BackendUnavailable as exc:
        pytest.skip(f"{backend} skipped: {exc}")
    except DistributedRunError as exc:
        if exc.failures and (exc.first.how == "stuck" or exc.first.dropped):  # it would happen again
            _HANGS[key] = (exc, _current_test(), world_size)
        raise


def stub_message(func) -> str | None:
    """The NotImplementedError message if ``func`` is an untouched starter stub, else None.

    A stub's body is its docstring plus one ``raise NotImplementedError("...")``.
    Spotting it statically lets a test fail at once instead of starting ranks
    only to watch every one of them raise.
    """
    static = getattr(type(func), "_commtax_stub_message", None)
    if static is not None:  # a commtax.boundary.LabFunction: read the learner's file, run nothing
        return static(func)
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(func)))
    except (OSError, TypeError, SyntaxError):
        return None
    if not tree.body:
        return None
    from commtax.boundary import _stub_message_of  # one parser for proxies and plain modules
    return _stub_message_of(tree.body[0], func.__name__)


def fail(message: str) -> None:
    """Fail the test with ``message`` alone: it says what is wrong, with numbers; no traceback needed."""
    __tracebackhide__ = True
    pytest.fail(message, pytrace=False)


def check(condition, message: str) -> None:
    """:func:`fail` with ``message`` unless ``condition`` holds."""
    __tracebackhide__ = True
    if not condition:
        fail(message)


def require_implemented(*funcs) -> None:
    """Raise the stub's NotImplementedError if any of ``funcs`` is still a starter stub."""
    __tracebackhide__ = True
    for func in funcs:
        message = stub_message(func)
        if message:
            raise NotImplementedError(message)


# -- inputs the ranks cannot predict, and bytes counted outside them ------------------------------
#
# A test's worker function runs inside the learner's rank processes, next to the learner's module:
# whatever it measures there (result tensors, byte counters, the collectives called) the learner's
# code can forge. So the inputs of a distributed test are drawn here, in the trusted test process,
# from a seed the learner cannot know when the grader runs, and each rank is handed only its own
# (``rank_args``): no rank can rebuild the others' inputs, so a right sum needs the data to move.
# The bytes that moved are counted by the kernel, outside the ranks (:mod:`commtax.ranks.wire`).

#: Set to an integer to fix the seed of every test's inputs (outside the grader only).
SEED_ENV = "COMMTAX_INPUT_SEED"


def input_seed(default: int) -> int:
    """The seed of a test module's inputs: secret under the grader, else ``default`` (reproducible).

    Under the grader (its sandbox settings are in the environment) the seed is
    drawn from :mod:`secrets` in the trusted test process, afresh for each lab
    run, and never leaves it: ranks get the inputs made from it, each only its
    own. A learner running ``pytest`` sees ``default`` (or ``$COMMTAX_INPUT_SEED``),
    so that a failure repeats.
    """
    from commtax.learner_process import sandbox
    if sandbox() is not None:
        import secrets
        return secrets.randbits(62)
    text = os.environ.get(SEED_ENV, "")
    return int(text) if text.strip().lstrip("-").isdigit() else default


def stream_seed(seed: int, *labels) -> int:
    """The seed of one independent random stream: a keyed hash (BLAKE2b) of ``seed`` and ``labels``.

    Every stream a test draws from its secret :func:`input_seed` (one rank's input,
    one shard, one decoy) gets its own seed from here, never ``seed + rank``: with
    consecutive seeds, a rank that recovered its own stream's seed from the values it
    was handed (a Mersenne Twister's state can be rebuilt from its outputs) would know
    every other rank's. Hashed seeds share no relation a rank could use: knowing one
    says nothing of the secret or of another label's. ``labels``: ints, strings, or
    tuples of them, naming the stream (say ``"x", rank``). Returns an int in
    [0, 2**63), which ``torch.Generator().manual_seed`` accepts; note that torch's CPU
    generator keys its stream on the low 32 bits of a seed only (seeds ``s`` and
    ``s + 2**32`` give the same numbers), so each stream is one of 2**32, chosen here
    by a hash of the whole 62-bit secret.
    """
    import hashlib
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"seed must be an int, got {seed!r:.60}")
    _check_labels(labels)
    digest = hashlib.blake2b(repr((seed, labels)).encode(), digest_size=8, person=b"commtax-stream").digest()
    return int.from_bytes(digest, "little") >> 1


def _check_labels(labels) -> None:
    for label in labels:
        if isinstance(label, tuple):
            _check_labels(label)
        elif isinstance(label, bool) or not isinstance(label, (int, str)):
            raise ValueError(f"labels must be ints, strings or tuples of them, got {label!r:.60}")


def expect_wire_bytes(results, payload: int, messages: int, what: str) -> None:
    """Fail unless the job behind ``results`` really moved ``payload`` bytes between its ranks.

    ``results``: what :func:`commtax.ranks.launch.run_ranks` (or :class:`SharedRuns`) returned; its
    ``wire_bytes`` are counted by the kernel outside the ranks, all ranks together, headers
    included (None outside the grader's OS sandbox: then nothing is checked, and the
    per-rank counts the ranks report are the only evidence). ``payload``: the bytes a correct
    implementation sends in the whole job, all ranks together; ``messages``: how many
    messages it sends (overhead allowance, :func:`commtax.ranks.wire.wire_problem`).
    """
    __tracebackhide__ = True
    from commtax.ranks.wire import wire_problem
    problem = wire_problem(getattr(results, "wire_bytes", None), payload, messages, what)
    if problem:
        fail(problem)


class SharedRuns:
    """Run a distributed job once and let several tests read its result.

    Each run costs a couple of seconds of process start-up, so a lab runs one
    job per function under test and several tests assert on what it returned.
    A failed run is remembered too: every test that needs it fails (and a skip
    stays a skip). The test that ran it shows the whole error; the others a
    short one that names that test.
    """

    def __init__(self):
        self._runs = {}

    def get(self, key, fn, world_size: int, args: tuple = (), *, needs=(), **options):
        """The result of ``run_or_skip(fn, world_size, args, **options)``, run once per ``key``.

        ``needs``: the lab functions the job calls; if one is still a starter
        stub, fail at once with its "not implemented yet" message.
        """
        __tracebackhide__ = True
        backend = options.get("backend", "gloo")
        reason = backend_unavailable_reason(backend, world_size)
        if reason:
            pytest.skip(f"{backend} skipped: {reason}")  # a missing GPU is not the learner's fault
        require_implemented(*needs)
        if key not in self._runs:
            try:
                self._runs[key] = ("ok", run_or_skip(fn, world_size, args, **options), None)
            except KeyboardInterrupt:
                raise
            except BaseException as exc:  # noqa: B036 - pytest's skip is a BaseException
                self._runs[key] = ("raise", exc, _current_test())
        status, value, test = self._runs[key]
        if status == "raise":
            if isinstance(value, DistributedRunError) and test != _current_test() and value.failures:
                raise SharedRunFailed(f"the run this test shares with {test} failed (the whole "
                                      f"error is there):\n{_headline(value)}", value.failures)
            raise value
        return value


# -- one job, several parts: a learner's exception in one part fails that part's tests, once --------
#
# A lab's worker often checks several functions in one start-up of its ranks. If the
# learner's code raises in one of them, only the tests that read that part should fail,
# and the traceback should be shown once: the first test that reads it shows it, the
# later ones name that test in one line.

SECTION_FAILED = "_commtax_section_failed"
_SECTION_FAILURES: dict = {}   # (job key, part) -> the first test that reported it


def run_section(fn):
    """Inside a rank: ``fn()``, or {SECTION_FAILED: the exception's summary and traceback} if it raised.

    If the other ranks then wait forever for this one, the launcher's deadlock
    detection fails the whole job instead, naming each rank's line.
    """
    import traceback
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 - reported by the tests that read this part
        summary = "".join(traceback.format_exception_only(exc)).strip()
        frames = exc.__traceback__.tb_next or exc.__traceback__   # from the part's own code on
        # Said now too: a peer may wait forever for this rank in the part's collectives, and then the
        # launcher's deadlock report (which quotes each rank's last output) is all the learner sees.
        stack = traceback.extract_tb(frames)
        # The innermost frame that is neither torch's nor the runner's wrappers (commtax/ranks): the learner's line.
        ours = os.sep + os.path.join("commtax", "ranks") + os.sep
        where = next((f for f in reversed(stack) if "site-packages" not in f.filename and ours not in f.filename),
                     stack[-1])
        print(f"{RAISED_EARLIER}{os.path.basename(where.filename)}:"
              f"{where.lineno}: {summary.splitlines()[-1][:300]} (a peer left waiting for this rank is waiting "
              "because of it)", file=sys.stderr, flush=True)
        return {SECTION_FAILED: (summary, "".join(traceback.format_exception(type(exc), exc, frames))[-4000:])}


def section(result: dict, part: str, *, rank: int, job=None):
    """``result[part]`` from a job's rank; fail (once with the traceback, then briefly) if that part raised.

    ``job``: what identifies the job (e.g. its world size), so that the same
    failure in another job is shown in full again.
    """
    __tracebackhide__ = True
    value = result[part]
    if not (isinstance(value, dict) and SECTION_FAILED in value):
        return value
    summary, trace = value[SECTION_FAILED]
    key, test = (job, part), _current_test()
    first = _SECTION_FAILURES.setdefault(key, test)
    if first != test:
        fail(f"rank {rank}: your code raised in the {part} part ({summary.splitlines()[-1][:200]}); "
             f"same failure as {first}, whose report shows the traceback")
    fail(f"rank {rank}: your code raised in the {part} part: {summary}\n\n{trace}")


# -- a learner's exception on a subgroup, in the learner's terms ------------------------------------

_GROUP_OBJECT = re.compile(r"<torch\.distributed\.distributed_c10d\.ProcessGroup object at 0x[0-9a-fA-F]+>")


def subgroup_failure(error: str, group, *, world: int) -> str:
    """``error`` (what the learner's code raised on the ranks ``group`` of ``world``) with what it suggests.

    The same code passed on the whole world, where a rank's group rank and its
    global rank are the same number; on a subgroup they differ, and torch's
    message says which way: a global rank that is not in the group means a group
    rank was passed as ``src=``/``dst=`` (global ranks); a count of entries per
    rank that is the world's means a call ran on the default group. Anything else
    (an index out of range, a wrong slice) is a global rank used where the group
    rank belongs, or a call without the group. The process group's address
    (``<...ProcessGroup object at 0x7f...>``) is replaced by its ranks.
    """
    group = list(group)
    text = _GROUP_OBJECT.sub(str(group), str(error))
    wrong = re.search(r"Global rank (\d+) is not part of group", text)
    if wrong:
        n = int(wrong.group(1))
        which = f" (its rank {n} is global rank {group[n]})" if n < len(group) else ""
        return (f"{text} - src=, dst= and a peer's rank are GLOBAL ranks, and {n} is not in the group {group}{which}: "
                "pass a group rank as group_src=/group_dst= (or map it with dist.get_global_rank(group, r))")
    if world != len(group) and re.search(rf"\b{world}\b", text) and "rank" in text:   # "one entry per rank (4)"
        return (f"{text} - {world} is the whole world's size: a call without group=self.group (or "
                "dist.get_world_size()/dist.get_rank() without the group) sees every rank; pass the group")
    return (f"{text} - the same code passes on the whole world, where a rank's group rank equals its global rank: "
            "a global rank (dist.get_rank()) used where the group rank (dist.get_rank(group)) belongs (an index, a "
            "slice, a peer), or a call without group=self.group (it runs on every rank)?")


# -- comparing a learner's value with the expected one ------------------------------------
#
# ``x == pytest.approx(y)`` is the wrong tool at a trust boundary: for arrays it is
# ``all()`` over the elements, so an empty array equals anything, and it says nothing
# of type or shape. Every lab test compares through :func:`close` or :func:`expect_close`,
# which check kind, shape and values, in that order.


def _kind(value) -> str:
    """'number', 'array', 'tensor', 'sequence', 'mapping' or the type's name."""
    import numbers

    import numpy as np
    if isinstance(value, bool) or isinstance(value, np.bool_):
        return "bool"
    if isinstance(value, numbers.Real):
        return "number"
    if isinstance(value, np.ndarray):
        return "array"
    if type(value).__module__.startswith("torch") and type(value).__name__ == "Tensor":
        return "tensor"
    if isinstance(value, (list, tuple)):
        return "sequence"
    if isinstance(value, dict):
        return "mapping"
    return type(value).__name__


def mismatch(actual, expected, *, rel: float = 1e-9, abs: float = 0.0) -> str | None:  # noqa: A002
    """Why ``actual`` is not ``expected`` (kind, shape or value), or None when it is.

    Numbers match a number (int or float; never a bool, an array or a tensor) within
    ``rel`` or ``abs``; NaN matches nothing. Arrays and tensors match one of the same
    kind and shape, element by element. Lists and tuples match a list or tuple of the
    same length, item by item; dicts the same keys, value by value. Anything else must
    compare equal with ``==`` and be of the same type.
    """
    return _difference(actual, expected, rel, abs)[0]


def _difference(actual, expected, rel, abs) -> tuple:  # noqa: A002
    """(why ``actual`` is not ``expected`` or None, actual/expected of the first number that differs or None)."""
    import math

    import numpy as np
    want, got = _kind(expected), _kind(actual)
    if want == "number":
        if got != "number":
            return f"expected a number, got {_describe(actual)}", None
        a, e = float(actual), float(expected)
        if math.isnan(a) or math.isnan(e):
            return f"got {a!r}, expected {e!r}", None
        if a == e or (math.isfinite(a) and math.isfinite(e) and math.fabs(a - e) <= max(rel * math.fabs(e), abs)):
            return None, None
        return f"got {_number(a, e)}, expected {_number(e, a)}{_ratio(a, e)}", _quotient(a, e)
    if want in ("array", "tensor"):
        if got != want:
            return f"expected a {'numpy array' if want == 'array' else 'torch tensor'}, got {_describe(actual)}", None
        masks = [str(x.dtype) in ("torch.bool", "bool") for x in (actual, expected)]
        if masks[0] != masks[1]:   # a mask of 0/1 numbers compares equal to a bool one, value by value
            return (f"expected a {'numpy array' if want == 'array' else 'torch tensor'} of dtype {expected.dtype}"
                    f"{' (a mask)' if masks[1] else ''}, got dtype {actual.dtype}"), None
        a = actual.detach().cpu().double().numpy() if want == "tensor" else np.asarray(actual, dtype=float)
        e = expected.detach().cpu().double().numpy() if want == "tensor" else np.asarray(expected, dtype=float)
        if a.shape != e.shape:
            return f"expected shape {tuple(e.shape)}, got shape {tuple(a.shape)}", None
        if math.isinf(abs):   # "any value": the kind and shape only (isclose would warn on inf * 0)
            return None, None
        bad = ~(np.isclose(a, e, rtol=rel, atol=abs, equal_nan=False) | (a == e))
        if bad.any():
            index = tuple(int(i) for i in np.argwhere(bad)[0])
            first, want_first = float(a[index]), float(e[index])
            return (f"{int(bad.sum())} of {bad.size} elements differ; first at {index}: "
                    f"got {first!r}, expected {want_first!r}{_ratio(first, want_first)}"), _quotient(first, want_first)
        return None, None
    if want == "sequence":
        if got != "sequence":
            return f"expected a list or tuple of {len(expected)}, got {_describe(actual)}", None
        if len(actual) != len(expected):
            return f"expected {len(expected)} items, got {len(actual)}", None
        for i, (a, e) in enumerate(zip(actual, expected)):
            why, ratio = _difference(a, e, rel, abs)
            if why:
                return f"item {i}: {why}", ratio
        return None, None
    if want == "mapping":
        if got != "mapping":
            return f"expected a dict, got {_describe(actual)}", None
        if set(actual) != set(expected):
            return f"expected keys {sorted(map(str, expected))}, got {sorted(map(str, actual))}", None
        for key in expected:
            why, ratio = _difference(actual[key], expected[key], rel, abs)
            if why:
                return f"[{key!r}]: {why}", ratio
        return None, None
    if type(actual) is not type(expected) or actual != expected:
        return f"got {_describe(actual)}, expected {expected!r}", None
    return None, None


def _number(value: float, other: float) -> str:
    """A float that holds a whole number as one ("273", not "273.0") when both sides are whole and small."""
    if value.is_integer() and other.is_integer() and max(math.fabs(value), math.fabs(other)) < 1e15:
        return str(int(value))
    return repr(value)


def _describe(value) -> str:
    kind = _kind(value)
    if kind in ("array", "tensor"):
        return f"{'a numpy array' if kind == 'array' else 'a torch tensor'} of shape {tuple(value.shape)}"
    text = repr(value)
    return f"{type(value).__name__} {text[:80] + '...' if len(text) > 80 else text}"


def _quotient(actual: float, expected: float) -> float | None:
    if expected and math.isfinite(actual) and math.isfinite(expected) and math.isfinite(actual / expected):
        return actual / expected
    return None


#: Relative differences that look like float32 rounding (its epsilon is 1.2e-7) on float64 data.
FLOAT32_LIKE = (1e-10, 2e-5)


def fraction(ratio: float, *, largest: int = 16) -> str:
    """``ratio`` as "4", "0.125 = 1/8" or "1.143 = 8/7" when it is a simple fraction (denominator up to
    ``largest``: the fraction is where a cause shows, 8/7 a ring of 8), else "1.143"."""
    from fractions import Fraction
    near = Fraction(ratio).limit_denominator(largest)
    if near and math.isclose(float(near), ratio, rel_tol=1e-9) and near.numerator <= 64 * largest:
        return str(near) if near.denominator == 1 else f"{ratio:.4g} = {near}"
    return f"{ratio:.4g}"


def _ratio(actual: float, expected: float) -> str:
    """The ratio got / expected, written so that a learner can read a cause in it ("x1/8", "x8/7")."""
    ratio = _quotient(actual, expected)
    if not ratio:
        return ""
    off = math.fabs(ratio - 1)
    if FLOAT32_LIKE[0] <= off <= FLOAT32_LIKE[1]:
        return (f" (x(1 {'+' if ratio > 1 else '-'} {off:.1e}) of the expected: a difference of float32's "
                "precision (its rounding is up to 6e-8): a tensor or buffer in float32 (torch's default dtype) "
                "where the data is float64?)")
    if off < 1e-3:   # "x1" would read as "equal"
        return f" (x(1 {'+' if ratio > 1 else '-'} {off:.1e}) of the expected)"
    return f" (x{fraction(ratio)} of the expected)"


def known_ratios(*, ranks: dict | None = None, element_bytes: int | None = None,
                 dtype_bytes: tuple | None = None) -> dict:
    """{ratio got/expected: what it suggests} for the usual slips of a bill of bytes or an average over ranks.

    ``ranks``: {name: size} of the groups in play (``{"d": 8}``): a sum not averaged
    (x d), a division too many (x 1/d), the ring factor (d-1)/d left out (x d/(d-1))
    or put in where it does not belong (x (d-1)/d). ``element_bytes``: bytes per
    element of the data: elements counted for bytes (x 1/b) or bytes for elements (x b).
    ``dtype_bytes``: (the width the test asked for, the function's default): the
    argument ignored (x default/asked). Pass the result to :func:`expect_close`
    (``causes=``): only the context the test states is used, so an 8/7 in a count of
    layers is not read as a ring factor.
    """
    found: dict = {}

    def add(ratio, text):
        if ratio and ratio != 1:
            key = next((k for k in found if math.isclose(k, ratio, rel_tol=1e-9)), ratio)
            found[key] = f"{found[key]}; or {text}" if key in found else text

    for name, g in (ranks or {}).items():
        if not isinstance(g, int) or g < 2:
            continue
        add(g, f"a sum over the {name} = {g} ranks where their average belongs (a / {name} missing)?")
        add(1 / g, f"divided by {name} = {g} once too often?")
        add(g / (g - 1), f"the ring factor ({name}-1)/{name} = {g - 1}/{g} left out?")
        add((g - 1) / g, f"a ring factor ({name}-1)/{name} = {g - 1}/{g} where none belongs (or applied twice)?")
    if element_bytes and element_bytes > 1:
        add(1 / element_bytes, f"elements counted, not bytes: multiply by the element size, {element_bytes} bytes?")
        add(element_bytes, f"the element size ({element_bytes} bytes) applied twice, or bytes where elements belong?")
    if dtype_bytes:
        asked, default = dtype_bytes
        if asked and default and asked != default:
            add(default / asked, f"dtype_bytes ignored: counted at {default} bytes per element, not the {asked} asked?")
    return found


def close(actual, expected, *, rel: float = 1e-9, abs: float = 0.0) -> bool:  # noqa: A002
    """True when ``actual`` matches ``expected`` in kind, shape and value (see :func:`mismatch`)."""
    return mismatch(actual, expected, rel=rel, abs=abs) is None


def expect_close(actual, expected, *, rel: float = 1e-9, abs: float = 0.0, what: str = "the result",  # noqa: A002
                 hints: dict | None = None, causes: dict | None = None) -> None:
    """Fail the test, naming ``what`` and why, unless ``actual`` matches ``expected`` (:func:`mismatch`).

    ``hints`` maps a ratio actual/expected to what it suggests, e.g.
    ``{2.0: "gradients summed, not averaged over the d ranks?"}``; ``causes`` is the
    same from :func:`known_ratios` (the usual slips, given the test's context). Every
    hint within 1e-6 of the observed ratio (of the first number that differs, at any
    depth of a list or dict) is added, the test's own first.
    """
    __tracebackhide__ = True
    why, ratio = _difference(actual, expected, rel, abs)
    if why is None:
        return
    if ratio is not None:
        said = [hint for table in (hints, causes) for r, hint in (table or {}).items()
                if r and math.isclose(ratio, r, rel_tol=1e-6)]
        if said:
            why += ": " + "; or ".join(dict.fromkeys(said))
    fail(f"{what}: {why}")


def number(value, what: str = "the result") -> float:
    """``value`` as a float if it is a real number (not a bool, an array or a tensor), else fail naming ``what``.

    For tests that compare a learner's value with ``<`` or ``>``: an array or a
    tensor would compare element-wise (an empty one vacuously), so take the
    number out first.
    """
    __tracebackhide__ = True
    if _kind(value) != "number" or math.isnan(float(value)):
        fail(f"{what}: expected a number, got {_describe(value)}")
    return float(value)


#: How many OTHER parameters a ValueError's message may name besides the bad one: a message
#: may explain the bad argument by related ones ("gpus (32) must equal tp * pp * dp (8 * 2 * 4)").
MAX_OTHERS_NAMED = 3


def _names_word(message: str, name: str) -> bool:
    """Whether ``message`` names ``name`` as a whole identifier (``tp`` is not in ``tp_size``)."""
    return re.search(rf"(?<![A-Za-z0-9_]){re.escape(name)}(?![A-Za-z0-9_])", message) is not None


def _names_in_file(path, qualname: str) -> list[str]:
    """The parameters of the def (or the annotated fields of the class) ``qualname`` in the file ``path``.

    Read from the source, not imported: the ``lab`` proxy's functions live in the
    learner's process, and the process that grades never runs the learner's code.
    """
    try:
        with open(path, encoding="utf-8") as file:
            node = ast.parse(file.read())
    except (OSError, SyntaxError, ValueError):
        return []
    for part in qualname.split("."):
        node = next((n for n in getattr(node, "body", ()) if getattr(n, "name", None) == part), None)
        if node is None:
            return []
    if isinstance(node, ast.ClassDef):
        return [n.target.id for n in node.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)]
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return [a.arg for a in (*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs)]
    return []


def _parameter_names(function) -> list[str]:
    """The named parameters of ``function`` (not ``*args``/``**kwargs``); none if it has no signature."""
    proxy, qualname = getattr(function, "_proxy", None), getattr(function, "_qualname", None)
    if proxy is not None and isinstance(qualname, str):  # a lab function (commtax.boundary.proxy.LabFunction)
        return _names_in_file(proxy._path, qualname)
    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):
        return []
    return [p.name for p in parameters if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]


def expect_value_error(call, argument, *, function=None, parameters=(), related=(), what: str | None = None):
    """Call ``call()`` and fail unless it raises a ValueError that names the bad ``argument``.

    The course rule is "invalid input raises a ValueError naming THE bad
    argument"; ``pytest.raises(ValueError, match=argument)`` only searches the
    message, so one ValueError listing every parameter would pass every bad-input
    test. This checks three things:

    1. ``call()`` raises a ValueError (any other exception propagates, as with pytest.raises);
    2. its message names ``argument`` as a whole word: ``tp`` does not match inside
       ``tp_size``. ``argument`` may be a tuple of names when either is a fair answer
       (two lists of different lengths);
    3. it does not name most of the other parameters. The others are the named
       parameters of ``function`` (the learner's: read from its source for a ``lab``
       function, else ``inspect.signature``; ``*args``/``**kwargs`` name nothing)
       plus ``parameters`` (e.g. the keys of a plan dict). Rule: the message fails
       when it names more than :data:`MAX_OTHERS_NAMED` of them, or all of them
       (a legitimate message may name a few related arguments, "gpus (32) must
       equal tp * pp * dp (8 * 2 * 4)", but not every one: for a function of two
       parameters, name the bad one alone). Names in ``related`` are not counted:
       arguments the test made bad together with ``argument`` (0 / 0 names both).

    Returns the ValueError, for further checks.
    """
    __tracebackhide__ = True
    wanted = (argument,) if isinstance(argument, str) else tuple(argument)
    label = " or ".join(wanted)
    name = getattr(function, "__name__", None)
    where = what or (f"{name}()" if name else "the call")
    try:
        result = call()
    except ValueError as exc:
        error, message = exc, str(exc)
    else:
        fail(f"{where}: expected a ValueError naming the bad argument, {label}; it returned {_describe(result)}")
    if not any(_names_word(message, w) for w in wanted):
        fail(f"{where}: your ValueError says {message!r}, which does not name the bad argument, {label} "
             f"(as a word of its own: name the argument as it is spelt in the signature)")
    own = _parameter_names(function)
    if not own and getattr(function, "_proxy", None) is not None:
        # made at run time, or only *args/**kwargs: nothing to tell the bad argument from the others
        fail(f"{where}: define {name} with def and its named parameters, as in the starter "
             f"(the test reads them to check that your message names the bad one, {label})")
    others = [p for p in dict.fromkeys([*own, *parameters]) if p not in wanted and p not in related]
    named = [p for p in others if _names_word(message, p)]
    if len(named) > MAX_OTHERS_NAMED or (others and len(named) == len(others)):
        every = "every argument" if len(named) == len(others) else f"{len(named)} other arguments"
        fail(f"{where}: your message names {every} ({', '.join(named)}) besides {label}: "
             f"name the bad one, {label} (a message may mention at most {MAX_OTHERS_NAMED} related ones, and not all)")
    return error


# -- the repository's browser tests ------------------------------------------------------------------

def find_chromium() -> str | None:
    """The Chromium (or Chrome) the browser tests drive: COMMTAX_CHROMIUM, else Debian's, else on PATH."""
    import shutil
    candidates = [os.environ.get("COMMTAX_CHROMIUM"), "/usr/bin/chromium", shutil.which("chromium"),
                  shutil.which("chromium-browser"), shutil.which("google-chrome")]
    return next((c for c in candidates if c and os.path.exists(c)), None)
