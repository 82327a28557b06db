"""The safe form: how values cross between the tests (trusted) and the learner's processes.

``None``, bools, numbers, strings, bytes, lists, tuples, dicts, sets, numpy
arrays of numbers, torch tensors and *records* (a dataclass instance becomes a
:class:`LabRecord`: its class name and its fields, read as attributes). The
sending side lowers a value to that form (numpy scalars become Python numbers,
arrays and tensors become raw bytes plus dtype and shape); the trusted side
reads it with an unpickler that refuses every global (:func:`loads`), so no
object the learner crafts (a ``float`` subclass whose ``__eq__`` is always
true, a pickle whose ``__reduce__`` calls ``os.system``) can exist, let alone
run, in the trusted process.

Kind and shape are kept exactly: a bool stays a bool, a tuple a tuple, an
array keeps its dtype and shape (an empty array stays empty, so a test that
compares through :func:`commtax.testing.expect_close` sees it is empty), and
what the learner sends is checked against what it claims (bytes against
shape and dtype; no negative or absurd dimension), so no crafted message
makes the trusted side build a value of another kind or allocate memory
nobody sent. A :class:`LabRecord` equals only a record of the same name whose
fields are equal in kind, shape and value.

An exception in the learner's code comes back as its type name, message and
traceback text (:func:`describe_exception`); built-in types are raised again
as themselves (:func:`rebuild_exception`), so ``pytest.raises(ValueError)``
works, anything else is a :class:`LearnerError`.
"""

from __future__ import annotations

import dataclasses
import io
import math
import pickle
import sys
import traceback

MAX_FRAME = 512 * 2**20  # bytes of one message across the boundary
MAX_DEPTH = 64  # nesting of containers
MAX_DIMENSIONS = 32  # of an array or a tensor (numpy's own limit is 64)
MESSAGE_LIMIT = 4000  # characters of a learner's exception message kept
TRACEBACK_LIMIT = 8000
_TAG = "\x00commtax-boundary"  # first item of a tuple that encodes a non-plain value

# Exceptions raised again as themselves in the trusted process.
BUILTIN_EXCEPTIONS = {
    cls.__name__: cls
    for cls in (
        ValueError,
        TypeError,
        NotImplementedError,
        ZeroDivisionError,
        AssertionError,
        ArithmeticError,
        OverflowError,
        FloatingPointError,
        IndexError,
        LookupError,
        RuntimeError,
        RecursionError,
        AttributeError,
        ImportError,
        ModuleNotFoundError,
        MemoryError,
        UnicodeError,
        OSError,
    )
}


# -- errors the trusted side raises -----------------------------------------------------------


class LearnerError(Exception):
    """An exception raised by the learner's code that is not a built-in type; named after it."""


class LearnerProcessError(AssertionError):
    """The learner's process died, hung or broke the protocol during a call."""


class BoundaryError(TypeError):
    """A value that cannot cross the boundary (a callable, a module, an arbitrary object)."""


# -- records ------------------------------------------------------------------------------------


def same_value(a, b) -> bool:
    """Equal in kind, shape and value, all the way down (NaN equals nothing; an empty array only
    an empty array of the same shape). What a :class:`LabRecord` compares its fields with."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return a == b and not math.isnan(a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same_value(a[k], b[k]) for k in a)
    np = sys.modules.get("numpy")
    if np is not None and isinstance(a, np.ndarray):
        return a.dtype == b.dtype and a.shape == b.shape and bool(np.array_equal(a, b))
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(a, torch.Tensor):
        return a.dtype == b.dtype and a.shape == b.shape and bool(torch.equal(a, b))
    result = a == b
    return result if isinstance(result, bool) else False


class LabRecord:
    """A dataclass instance from the learner's side: its class name and fields, read-only."""

    __slots__ = ("_type", "_fields")

    def __init__(self, type_name: str, fields: dict):
        object.__setattr__(self, "_type", str(type_name))
        object.__setattr__(self, "_fields", dict(fields))

    def __getattr__(self, name):
        fields = object.__getattribute__(self, "_fields")
        if name in fields:
            return fields[name]
        raise AttributeError(f"{object.__getattribute__(self, '_type')} has no field {name!r}")

    def __setattr__(self, name, value):
        raise AttributeError("a LabRecord is read-only")

    def __eq__(self, other):
        if not isinstance(other, LabRecord):
            return NotImplemented
        return self._type == other._type and same_value(self._fields, other._fields)

    def __hash__(self):
        return hash((self._type, tuple(sorted(self._fields))))

    def __repr__(self):
        inner = ", ".join(f"{k}={v!r}" for k, v in self._fields.items())
        return f"{self._type}({inner})"

    def __reduce__(self):
        return (LabRecord, (self._type, self._fields))


# -- encoding -------------------------------------------------------------------------------------


class PlainUnpickler(pickle.Unpickler):
    """Builds only None, bools, ints, floats, str, bytes, lists, tuples, dicts, sets: no globals at all."""

    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"refused: a value that needs {module}.{name} cannot cross the boundary")

    def persistent_load(self, pid):
        raise pickle.UnpicklingError("refused: persistent ids cannot cross the boundary")


def plain_loads(data: bytes):
    """Plain data only (no rebuilding of arrays or records): what a frame holds."""
    return PlainUnpickler(io.BytesIO(data)).load()


def loads(data: bytes):
    """Decode bytes made by :func:`dumps` (or by anyone): plain data only, then rebuild arrays and records."""
    if len(data) > MAX_FRAME:
        raise BoundaryError(f"a value of {len(data)} bytes is larger than the {MAX_FRAME} the boundary carries")
    return rebuild(plain_loads(data), None, 0)


def dumps(value, module=None) -> bytes:
    """Lower ``value`` to the safe form (see the module docstring) and encode it."""
    return pickle.dumps(lower(value, 0), protocol=4)


def lower(value, depth=0):
    """``value`` as plain data (tagged tuples for arrays, tensors, records, sets, complex numbers)."""
    if depth > MAX_DEPTH:
        raise BoundaryError(f"a value nested more than {MAX_DEPTH} levels deep cannot cross the boundary")
    if value is None or value is True or value is False:
        return value
    kind = type(value)
    if kind in (int, float, str, bytes):
        return value
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, int):
        return int.__index__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, complex):
        return (_TAG, "complex", complex.__getattribute__(value, "real"), complex.__getattribute__(value, "imag"))
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, LabRecord):
        return (_TAG, "record", value._type, {k: lower(v, depth + 1) for k, v in value._fields.items()})
    if isinstance(value, list):
        return [lower(v, depth + 1) for v in value]
    if isinstance(value, tuple):
        items = tuple(lower(v, depth + 1) for v in value)
        # A plain tuple that starts like a tagged one travels tagged itself, so it stays a tuple.
        return (_TAG, "tuple", list(items)) if items and items[0] == _TAG else items
    if isinstance(value, dict):
        return {lower(k, depth + 1): lower(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (set, frozenset)):
        return (_TAG, "frozenset" if isinstance(value, frozenset) else "set", [lower(v, depth + 1) for v in value])
    lowered = _lower_library(value, depth)
    if lowered is not None:
        return lowered
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {f.name: lower(getattr(value, f.name), depth + 1) for f in dataclasses.fields(value)}
        return (_TAG, "record", type(value).__name__, fields)
    raise BoundaryError(
        f"a {type(value).__name__} object cannot cross the boundary between the tests and the "
        "learner's code: only numbers, strings, lists, tuples, dicts, numpy arrays, tensors "
        "and dataclass records can"
    )


def _lower_library(value, depth):
    """numpy and torch values (None for anything else)."""
    np = sys.modules.get("numpy")
    if np is not None:
        if isinstance(value, np.generic):
            return lower(value.item(), depth + 1)
        if isinstance(value, np.ndarray):
            if value.dtype.kind not in "biufc":
                raise BoundaryError(f"a numpy array of dtype {value.dtype} cannot cross the boundary (numbers only)")
            array = np.ascontiguousarray(value)
            return (_TAG, "ndarray", array.dtype.str, tuple(int(n) for n in array.shape), array.tobytes())
    torch = sys.modules.get("torch")
    if torch is not None:
        if isinstance(value, torch.Tensor):
            t = value.detach().to("cpu").contiguous()
            raw = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
            return (_TAG, "tensor", str(t.dtype).removeprefix("torch."), tuple(int(n) for n in t.shape), raw)
        if isinstance(value, torch.Size):
            return tuple(int(n) for n in value)
        if isinstance(value, torch.dtype):
            return (_TAG, "dtype", str(value).removeprefix("torch."))
        if isinstance(value, torch.device):
            return str(value)
    return None


_TORCH_DTYPES = {
    "float64",
    "float32",
    "float16",
    "bfloat16",
    "int64",
    "int32",
    "int16",
    "int8",
    "uint8",
    "bool",
    "complex64",
    "complex128",
}


def _shape(value) -> tuple:
    """A shape a learner sent: a tuple of at most MAX_DIMENSIONS non-negative ints."""
    if type(value) not in (tuple, list) or len(value) > MAX_DIMENSIONS:
        raise BoundaryError("refused: a malformed shape")
    shape = tuple(value)
    if not all(type(n) is int and 0 <= n for n in shape):
        raise BoundaryError(f"refused: a shape with a negative or non-integer dimension {shape}")
    return shape


def _check_size(shape: tuple, itemsize: int, raw: bytes, what: str) -> None:
    count = math.prod(shape)
    if count * itemsize != len(raw):
        raise BoundaryError(f"refused: a {what} of shape {shape} needs {count * itemsize} bytes, {len(raw)} were sent")


def rebuild(tree, module, depth=0):
    """Undo :func:`lower`. ``module``: the learner's module (worker side: records become its dataclasses)."""
    if depth > MAX_DEPTH:
        raise BoundaryError(f"a value nested more than {MAX_DEPTH} levels deep cannot cross the boundary")
    kind = type(tree)
    if kind is list:
        return [rebuild(v, module, depth + 1) for v in tree]
    if kind is dict:
        return {rebuild(k, module, depth + 1): rebuild(v, module, depth + 1) for k, v in tree.items()}
    if kind is not tuple:
        return tree
    if not (len(tree) >= 2 and tree[0] == _TAG and type(tree[1]) is str):
        return tuple(rebuild(v, module, depth + 1) for v in tree)
    return _rebuild_tagged(tree, module, depth)


def _rebuild_tagged(tree, module, depth):
    tag = tree[1]
    if tag == "tuple":
        return tuple(rebuild(v, module, depth + 1) for v in tree[2])
    if tag == "complex":
        return complex(float(tree[2]), float(tree[3]))
    if tag in ("set", "frozenset"):
        items = [rebuild(v, module, depth + 1) for v in tree[2]]
        return set(items) if tag == "set" else frozenset(items)
    if tag == "ndarray":
        import numpy as np

        dtype = np.dtype(str(tree[2]))
        if dtype.kind not in "biufc":
            raise BoundaryError(f"refused: a numpy array of dtype {dtype}")
        shape, raw = _shape(tree[3]), bytes(tree[4])
        _check_size(shape, dtype.itemsize, raw, "numpy array")
        return np.frombuffer(raw, dtype=dtype).reshape(shape).copy()
    if tag == "tensor":
        import torch

        name, shape, raw = str(tree[2]), _shape(tree[3]), bytes(tree[4])
        if name not in _TORCH_DTYPES:
            raise BoundaryError(f"refused: a tensor of dtype {name}")
        dtype = getattr(torch, name)
        _check_size(shape, torch.empty((), dtype=dtype).element_size(), raw, "tensor")
        if not raw:
            return torch.empty(shape, dtype=dtype)
        return torch.frombuffer(bytearray(raw), dtype=dtype).reshape(shape).clone()
    if tag == "dtype":
        import torch

        name = str(tree[2])
        if name not in _TORCH_DTYPES:
            raise BoundaryError(f"refused: dtype {name}")
        return getattr(torch, name)
    if tag == "record":
        return _rebuild_record(tree, module, depth)
    raise BoundaryError(f"refused: an unknown kind of value {tag[:40]!r}")


def _rebuild_record(tree, module, depth):
    name, fields = str(tree[2]), {str(k): rebuild(v, module, depth + 1) for k, v in dict(tree[3]).items()}
    if module is not None:
        cls = getattr(module, name, None)
        if isinstance(cls, type) and dataclasses.is_dataclass(cls):
            obj = cls.__new__(cls)
            for key, value in fields.items():
                object.__setattr__(obj, key, value)
            return obj
    return LabRecord(name, fields)


# -- exceptions ---------------------------------------------------------------------------------


def describe_exception(exc: BaseException, skip_frames: int = 0) -> dict:
    """What crosses the boundary about an exception: names, message, traceback text (plain data)."""
    tb = exc.__traceback__
    for _ in range(skip_frames):
        if tb is not None and tb.tb_next is not None:
            tb = tb.tb_next
    try:
        message = str(exc)
    except BaseException:  # noqa: BLE001 - a learner's __str__ may raise
        message = "(the exception's message could not be shown)"
    if isinstance(exc, SystemExit):
        message = f"called sys.exit({exc.code!r}) instead of returning"
    try:
        text = "".join(traceback.format_exception(type(exc), exc, tb))
    except BaseException:  # noqa: BLE001 - formatting runs the learner's __str__ again
        text = ""
    return {
        "type": type(exc).__name__,
        "mro": [c.__name__ for c in type(exc).__mro__],
        "message": message[:MESSAGE_LIMIT],
        "traceback": text[-TRACEBACK_LIMIT:],
    }


def rebuild_exception(info) -> BaseException:
    """The exception to raise in the trusted process for ``info`` (from :func:`describe_exception`)."""
    info = info if isinstance(info, dict) else {}
    name = str(info.get("type", "Exception"))
    name = name if name.isidentifier() else "LearnerException"
    message = str(info.get("message", ""))[:MESSAGE_LIMIT]
    mro = [str(n) for n in info.get("mro", [])] if isinstance(info.get("mro"), list) else []
    if name in BUILTIN_EXCEPTIONS:
        exc = BUILTIN_EXCEPTIONS[name](message)
    else:
        base = next((BUILTIN_EXCEPTIONS[n] for n in mro if n in BUILTIN_EXCEPTIONS), None)
        try:
            cls = type(name, (LearnerError, base) if base else (LearnerError,), {"__module__": "learner"})
        except TypeError:  # a base whose instance layout does not mix
            cls = type(name, (LearnerError,), {"__module__": "learner"})
        exc = cls(message)
    trace = str(info.get("traceback", ""))[-TRACEBACK_LIMIT:]
    if trace:
        exc.add_note("in the learner's code:\n" + trace.rstrip())
    return exc
