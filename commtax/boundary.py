"""The boundary between the tests (trusted) and the learner's code (untrusted).

The ``lab`` fixture of every lab test is a :class:`LabProxy`: the pytest
process never imports the learner's ``starter.py`` (or ``solution.py``). A
*worker* process imports it, and ``lab.f(*args, **kwargs)`` sends the call
there and waits for the answer. So the process that decides whether a test
passed never runs a line of the learner's code.

Values cross in a **safe form** both ways: ``None``, bools, numbers, strings,
bytes, lists, tuples, dicts, sets, numpy arrays of numbers, torch tensors and
*records* (a dataclass instance becomes a :class:`LabRecord`: its class name
and its fields, read as attributes). The sending side lowers a value to that
form (numpy scalars become Python numbers, tensors become raw bytes plus
dtype and shape); the trusted side reads it with an unpickler that refuses
every global (:func:`loads`), so no object the learner crafts (a ``float``
subclass whose ``__eq__`` is always true, a pickle whose ``__reduce__`` calls
``os.system``) can exist, let alone run, in the trusted process.

An exception in the learner's code comes back as its type name, message and
traceback text. Built-in types (``ValueError``, ``TypeError``,
``NotImplementedError`` ...) are raised again as those types (a learner's
subclass of ``ValueError`` becomes a subclass of ``ValueError`` and
:class:`LearnerError` with the learner's class name), so
``pytest.raises(ValueError, match=...)`` works; anything else is a
:class:`LearnerError`. A call that does not return within
``COMMTAX_LAB_CALL_TIMEOUT`` seconds (default 60) kills the worker; the next
call starts a fresh one.

Stub detection (:func:`commtax.testing.require_implemented`) reads the
learner's file with :mod:`ast` in the trusted process: parsing runs nothing.
Passing the proxy (or ``lab.f``) to :func:`commtax.ranks.launch.run_ranks`
makes each rank load the real module from its file; ranks are untrusted
processes too, and their results come back through the same safe form.

Under the grader (``grading/grader.py``), the environment variable
``COMMTAX_SANDBOX`` tells this module where the learner's private copy of the
course is, which user to run learner processes as and which private
temporary folder they get: :func:`learner_popen_kwargs` is what both the
worker and the ranks are started with.
"""

from __future__ import annotations

import ast
import dataclasses
import io
import json
import os
import pickle
import select
import signal
import struct
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path

SANDBOX_ENV = "COMMTAX_SANDBOX"
CALL_TIMEOUT_ENV = "COMMTAX_LAB_CALL_TIMEOUT"
DEFAULT_CALL_TIMEOUT = 60.0
START_TIMEOUT = 120.0
MAX_FRAME = 512 * 2**20        # bytes of one message across the boundary
MAX_DEPTH = 64                 # nesting of containers
MESSAGE_LIMIT = 4000           # characters of a learner's exception message kept
TRACEBACK_LIMIT = 8000
OUTPUT_KEPT = 64 * 1024        # characters of a worker's printed output echoed per call
_TAG = "\x00commtax-boundary"  # first item of a tuple that encodes a non-plain value

# Exceptions raised again as themselves in the trusted process.
BUILTIN_EXCEPTIONS = {cls.__name__: cls for cls in (
    ValueError, TypeError, NotImplementedError, ZeroDivisionError, AssertionError, ArithmeticError,
    OverflowError, FloatingPointError, IndexError, LookupError, RuntimeError, RecursionError,
    AttributeError, ImportError, ModuleNotFoundError, MemoryError, UnicodeError, OSError,
)}


# -- errors the trusted side raises -----------------------------------------------------------

class LearnerError(Exception):
    """An exception raised by the learner's code that is not a built-in type; named after it."""


class LearnerProcessError(AssertionError):
    """The learner's process died, hung or broke the protocol during a call."""


class BoundaryError(TypeError):
    """A value that cannot cross the boundary (a callable, a module, an arbitrary object)."""


# -- the safe form ----------------------------------------------------------------------------

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
        return (self._type, self._fields) == (other._type, other._fields)

    def __hash__(self):
        return hash((self._type, tuple(sorted(self._fields))))

    def __repr__(self):
        inner = ", ".join(f"{k}={v!r}" for k, v in self._fields.items())
        return f"{self._type}({inner})"

    def __reduce__(self):
        return (LabRecord, (self._type, self._fields))


class _PlainUnpickler(pickle.Unpickler):
    """Builds only None, bools, ints, floats, str, bytes, lists, tuples, dicts, sets: no globals at all."""

    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"refused: a value that needs {module}.{name} cannot cross the boundary")

    def persistent_load(self, pid):
        raise pickle.UnpicklingError("refused: persistent ids cannot cross the boundary")


def loads(data: bytes):
    """Decode bytes made by :func:`dumps` (or by anyone): plain data only, then rebuild arrays and records."""
    if len(data) > MAX_FRAME:
        raise BoundaryError(f"a value of {len(data)} bytes is larger than the {MAX_FRAME} the boundary carries")
    tree = _PlainUnpickler(io.BytesIO(data)).load()
    return _rebuild(tree, None, 0)


def dumps(value, module=None) -> bytes:
    """Lower ``value`` to the safe form (see the module docstring) and encode it."""
    return pickle.dumps(_lower(value, 0), protocol=4)


def _lower(value, depth):
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
        return (_TAG, "record", value._type, {k: _lower(v, depth + 1) for k, v in value._fields.items()})
    if isinstance(value, list):
        return [_lower(v, depth + 1) for v in value]
    if isinstance(value, tuple):
        return tuple(_lower(v, depth + 1) for v in value)
    if isinstance(value, dict):
        return {_lower(k, depth + 1): _lower(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (set, frozenset)):
        return (_TAG, "frozenset" if isinstance(value, frozenset) else "set", [_lower(v, depth + 1) for v in value])
    np = sys.modules.get("numpy")
    if np is not None:
        if isinstance(value, np.generic):
            return _lower(value.item(), depth + 1)
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
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {f.name: _lower(getattr(value, f.name), depth + 1) for f in dataclasses.fields(value)}
        return (_TAG, "record", type(value).__name__, fields)
    raise BoundaryError(f"a {type(value).__name__} object cannot cross the boundary between the tests and the "
                        "learner's code: only numbers, strings, lists, tuples, dicts, numpy arrays, tensors "
                        "and dataclass records can")


_TORCH_DTYPES = {"float64", "float32", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8",
                 "bool", "complex64", "complex128"}


def _rebuild(tree, module, depth):
    """Undo :func:`_lower`. ``module``: the learner's module (worker side: records become its dataclasses)."""
    if depth > MAX_DEPTH:
        raise BoundaryError(f"a value nested more than {MAX_DEPTH} levels deep cannot cross the boundary")
    kind = type(tree)
    if kind is list:
        return [_rebuild(v, module, depth + 1) for v in tree]
    if kind is dict:
        return {_rebuild(k, module, depth + 1): _rebuild(v, module, depth + 1) for k, v in tree.items()}
    if kind is not tuple:
        return tree
    if not (len(tree) >= 2 and tree[0] == _TAG and type(tree[1]) is str):
        return tuple(_rebuild(v, module, depth + 1) for v in tree)
    tag = tree[1]
    if tag == "complex":
        return complex(float(tree[2]), float(tree[3]))
    if tag in ("set", "frozenset"):
        items = [_rebuild(v, module, depth + 1) for v in tree[2]]
        return set(items) if tag == "set" else frozenset(items)
    if tag == "ndarray":
        import numpy as np
        dtype = np.dtype(str(tree[2]))
        if dtype.kind not in "biufc":
            raise BoundaryError(f"refused: a numpy array of dtype {dtype}")
        shape = tuple(int(n) for n in tree[3])
        return np.frombuffer(bytes(tree[4]), dtype=dtype).reshape(shape).copy()
    if tag == "tensor":
        import torch
        name, shape, raw = str(tree[2]), tuple(int(n) for n in tree[3]), bytes(tree[4])
        if name not in _TORCH_DTYPES:
            raise BoundaryError(f"refused: a tensor of dtype {name}")
        dtype = getattr(torch, name)
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
        name, fields = str(tree[2]), {str(k): _rebuild(v, module, depth + 1) for k, v in dict(tree[3]).items()}
        if module is not None:
            cls = getattr(module, name, None)
            if isinstance(cls, type) and dataclasses.is_dataclass(cls):
                obj = cls.__new__(cls)
                for key, value in fields.items():
                    object.__setattr__(obj, key, value)
                return obj
        return LabRecord(name, fields)
    return tuple(_rebuild(v, module, depth + 1) for v in tree)


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
    text = "".join(traceback.format_exception(type(exc), exc, tb))
    return {"type": type(exc).__name__, "mro": [c.__name__ for c in type(exc).__mro__],
            "message": message[:MESSAGE_LIMIT], "traceback": text[-TRACEBACK_LIMIT:]}


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


# -- where learner processes run ----------------------------------------------------------------

def sandbox() -> dict | None:
    """The grader's sandbox settings (None outside the grader)."""
    text = os.environ.get(SANDBOX_ENV)
    if not text:
        return None
    return json.loads(text)


def learner_path(path) -> str:
    """Where a learner process finds ``path`` (a file of the trusted tree): its copy in the sandbox."""
    box = sandbox()
    path = str(path)
    if not box:
        return path
    real = os.path.realpath(path)
    trusted = box["trusted_root"]
    if real == trusted or real.startswith(trusted + os.sep):
        return box["learner_root"] + real[len(trusted):]
    return path


def learner_sys_path(paths) -> list:
    """``sys.path`` for a learner process: trusted-tree entries mapped into the sandbox, or dropped."""
    box = sandbox()
    if not box:
        return list(paths)
    out = []
    for entry in paths:
        if entry == "":
            continue
        mapped = learner_path(entry)
        if mapped != entry or not os.path.realpath(entry).startswith(box["trusted_root"]):
            if os.path.isdir(mapped) and mapped not in out:
                out.append(mapped)
    if box["learner_root"] not in out:
        out.insert(0, box["learner_root"])
    return out


# Under the grader, learner processes get only these variables of ours (no tokens, no paths of the
# grader's own): the locale, the search path for programs and libraries, and what torch, NCCL
# and gloo read.
LEARNER_VARIABLES = {"PATH", "LANG", "LANGUAGE", "TZ", "TERM", "LD_LIBRARY_PATH", "LAB_IMPL", "OMP_NUM_THREADS",
                     "MKL_NUM_THREADS", "MPLBACKEND", "PYTHONDONTWRITEBYTECODE", "PYTHONUNBUFFERED",
                     "PYTHONHASHSEED", "COMMTAX_LAB_CALL_TIMEOUT"}
LEARNER_PREFIXES = ("LC_", "NCCL_", "GLOO_", "TORCH_", "CUDA_", "NVIDIA_")


def learner_env(extra: dict | None = None) -> dict:
    """The environment of a learner process: ours, without the grader's variables, plus ``extra``."""
    box = sandbox()
    package_root = str(Path(__file__).resolve().parent.parent)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("COMMTAX_SANDBOX", "PYTEST_")) and not k.startswith("COMMTAX_GRADING_")}
    if box:
        env = {k: v for k, v in env.items() if k in LEARNER_VARIABLES or k.startswith(LEARNER_PREFIXES)}
    if "COMMTAX_GRADING_RUN" in os.environ:
        env["COMMTAX_GRADING_RUN"] = os.environ["COMMTAX_GRADING_RUN"]  # the tag the grader kills by
    if box:
        env.update(PYTHONPATH=box["learner_root"], TMPDIR=box["tmp"], TMP=box["tmp"], TEMP=box["tmp"],
                   HOME=box["tmp"], XDG_CACHE_HOME=box["tmp"], MPLCONFIGDIR=box["tmp"],
                   PYTHONDONTWRITEBYTECODE="1")
    else:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
    env.update(extra or {})
    return env


def _learner_preexec():  # pragma: no cover - runs in the child between fork and exec
    os.umask(0o077)
    try:
        import resource
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    except (ImportError, ValueError, OSError):
        pass


def learner_popen_kwargs(cwd=None, extra_env: dict | None = None) -> dict:
    """Keyword arguments for ``subprocess.Popen`` that start a learner process (a worker or a rank)."""
    box = sandbox()
    kwargs = {"env": learner_env(extra_env)}
    if os.name == "posix":
        kwargs["start_new_session"] = True
    if box:
        kwargs["cwd"] = learner_path(cwd) if cwd else box["learner_root"]
        kwargs["preexec_fn"] = _learner_preexec
        if box.get("uid") is not None and os.geteuid() == 0:
            kwargs.update(user=int(box["uid"]), group=int(box["gid"]), extra_groups=[])
    elif cwd:
        kwargs["cwd"] = str(cwd)
    return kwargs


def learner_run_dir(prefix: str = "commtax-run-") -> str:
    """A folder that learner processes can write into and the trusted side reads (ranks' run folders)."""
    import tempfile
    box = sandbox()
    if not box:
        return tempfile.mkdtemp(prefix=prefix)
    path = tempfile.mkdtemp(prefix=prefix, dir=box["runs"])
    # Sticky and world-writable, owned by the trusted user: learner processes add files, but cannot
    # rename this folder or replace the files the trusted side created in it.
    os.chmod(path, 0o1777)
    return path


def open_learner_file(path, mode: str = "rb"):
    """Open a file a learner process may have written, never following a symbolic link."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(path, flags)
    return os.fdopen(fd, mode) if "b" in mode else os.fdopen(fd, mode, errors="replace")


def make_undumpable() -> None:
    """Keep processes of the same user out of this one's memory, descriptors and environment (Linux)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE, 0
    except (OSError, AttributeError):  # pragma: no cover
        pass


def become_subreaper() -> None:
    """Orphaned descendants become our children, not init's (Linux): a learner's double fork stays findable."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):  # pragma: no cover
        pass


# -- stub detection, statically -----------------------------------------------------------------

def _stub_message_of(node, name: str) -> str | None:
    body = list(getattr(node, "body", []))
    if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant):
        body = body[1:]
    if len(body) != 1 or not isinstance(body[0], ast.Raise) or not isinstance(body[0].exc, ast.Call):
        return None
    call = body[0].exc
    if getattr(call.func, "id", None) != "NotImplementedError":
        return None
    if call.args and isinstance(call.args[0], ast.Constant):
        return str(call.args[0].value)
    return f"{name}: not implemented yet"


def stub_message_in_file(path, qualname: str) -> str | None:
    """The NotImplementedError message if ``qualname`` in the file ``path`` is an untouched stub, else None."""
    try:
        tree = ast.parse(Path(path).read_text())
    except (OSError, SyntaxError, ValueError):
        return None
    node = tree
    for part in qualname.split("."):
        found = None
        for child in getattr(node, "body", []):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and child.name == part:
                found = child  # the last definition wins, as at run time
        if found is None:
            return None
        node = found
    if isinstance(node, ast.ClassDef):
        return None
    return _stub_message_of(node, qualname.rsplit(".", 1)[-1])


# -- the trusted side: the proxy ----------------------------------------------------------------

def _call_timeout() -> float:
    try:
        return float(os.environ.get(CALL_TIMEOUT_ENV, DEFAULT_CALL_TIMEOUT))
    except ValueError:
        return DEFAULT_CALL_TIMEOUT


class _Worker:
    """One learner process and the two pipes we talk to it through."""

    def __init__(self, module_name: str, path: str, cwd: str):
        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe()
        command = [sys.executable, "-m", "commtax.boundary", module_name, learner_path(path),
                   str(to_child_r), str(from_child_w)]
        kwargs = learner_popen_kwargs(cwd)
        self.proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, pass_fds=(to_child_r, from_child_w), **kwargs)
        os.close(to_child_r)
        os.close(from_child_w)
        self.send_fd, self.recv_fd = to_child_w, from_child_r
        self.output: list[str] = []
        self.output_size = 0
        self.dropped = 0
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read_output, daemon=True)
        self._reader.start()

    def _read_output(self):
        for raw in iter(lambda: self.proc.stdout.read1(65536), b""):
            text = raw.decode(errors="replace")
            with self._lock:
                if self.output_size + len(text) <= OUTPUT_KEPT:
                    self.output.append(text)
                    self.output_size += len(text)
                else:
                    self.dropped += len(text)

    def take_output(self) -> str:
        with self._lock:
            text, dropped = "".join(self.output), self.dropped
            self.output, self.output_size, self.dropped = [], 0, 0
        if dropped:
            text += f"\n[{dropped} more characters of output from the learner's code not shown]\n"
        return text

    def send(self, data: bytes) -> None:
        frame = struct.pack("<Q", len(data)) + data
        view = memoryview(frame)
        while view:
            written = os.write(self.send_fd, view)
            view = view[written:]

    def _read_exactly(self, n: int, deadline: float) -> bytes:
        chunks, got = [], 0
        while got < n:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            ready, _, _ = select.select([self.recv_fd], [], [], min(left, 1.0))
            if not ready:
                continue
            chunk = os.read(self.recv_fd, min(n - got, 1 << 20))
            if not chunk:
                raise EOFError
            chunks.append(chunk)
            got += len(chunk)
        return b"".join(chunks)

    def receive(self, timeout: float):
        deadline = time.monotonic() + timeout
        (size,) = struct.unpack("<Q", self._read_exactly(8, deadline))
        if size > MAX_FRAME:
            raise BoundaryError(f"the learner's process sent a message of {size} bytes (at most {MAX_FRAME})")
        return loads(self._read_exactly(size, deadline))

    def exit_description(self) -> str:
        try:
            code = self.proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            return "stopped answering"
        if code < 0:
            try:
                return f"was killed by {signal.Signals(-code).name}"
            except ValueError:
                return f"was killed by signal {-code}"
        return f"exited with code {code} (os._exit, or a crash in C code)"

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError, AttributeError):
            try:
                self.proc.kill()
            except ProcessLookupError:
                pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:  # pragma: no cover
            pass
        for fd in (self.send_fd, self.recv_fd):
            try:
                os.close(fd)
            except OSError:
                pass
        self._reader.join(timeout=2)


class LabProxy:
    """The learner's lab module, as the trusted tests see it: calls go to a worker process.

    ``lab.f(...)`` calls ``f`` there; ``lab.C.method`` names a method (for
    :func:`commtax.testing.require_implemented`, or to call a classmethod);
    ``lab.NAME`` of a plain value returns that value. ``lab.__file__`` is
    the path of the learner's file.
    """

    def __init__(self, path, module_name: str):
        object.__setattr__(self, "_path", str(path))
        object.__setattr__(self, "_module_name", module_name)
        object.__setattr__(self, "_worker", None)
        object.__setattr__(self, "_names", None)
        object.__setattr__(self, "_import_error", None)
        object.__setattr__(self, "_pending", None)

    # -- what the proxy says about itself
    @property
    def __file__(self):
        return self._path

    @property
    def __name__(self):
        return self._module_name

    def __repr__(self):
        return f"<lab {self._module_name} from {self._path} (in a separate process)>"

    def __reduce__(self):
        from commtax.ranks._byfile import _load_module
        return (_load_module, (self._module_name, learner_path(self._path)))

    def __setattr__(self, name, value):
        raise AttributeError("the lab module cannot be changed from the tests")

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        names = self._listing()
        if names is not None and name not in names:
            raise AttributeError(f"{Path(self._path).name} has no attribute {name!r}")
        entry = names.get(name) if names else None
        if entry and entry[0] == "value":
            return entry[1]
        return LabFunction(self, name)

    def __dir__(self):
        return sorted(self._listing() or ())

    # -- the worker
    def _listing(self):
        if self._names is None and self._import_error is None:
            try:
                self._ensure()
            except BaseException:  # noqa: BLE001 - the call that needs it raises the same error
                return None
        return self._names

    def _ensure(self) -> _Worker:
        if self._import_error is not None:
            raise rebuild_exception(self._import_error)
        if self._worker is not None:
            return self._worker
        worker = self._pending or _Worker(self._module_name, self._path, str(Path(self._path).parent))
        object.__setattr__(self, "_pending", None)
        try:
            kind, body = worker.receive(START_TIMEOUT)
        except TimeoutError:
            worker.kill()
            raise LearnerProcessError(f"importing {Path(self._path).name} took more than {START_TIMEOUT:g} s") from None
        except (EOFError, OSError, pickle.UnpicklingError, BoundaryError, ValueError) as exc:
            worker.kill()
            self._echo(worker)
            raise LearnerProcessError(f"the process importing {Path(self._path).name} {worker.exit_description()}"
                                      + ("" if isinstance(exc, EOFError) else f" ({exc})")) from None
        self._echo(worker)
        if kind == "import-error":
            worker.kill()
            object.__setattr__(self, "_import_error", body)
            raise rebuild_exception(body)
        object.__setattr__(self, "_names", dict(body))
        object.__setattr__(self, "_worker", worker)
        return worker

    def prestart(self) -> None:
        """Start the worker now, without waiting for it (its imports overlap other tests)."""
        if self._worker is None and self._pending is None and self._import_error is None:
            object.__setattr__(self, "_pending", _Worker(self._module_name, self._path, str(Path(self._path).parent)))

    def _echo(self, worker: _Worker) -> None:
        text = worker.take_output()
        if text:
            sys.stdout.write(text if text.endswith("\n") else text + "\n")

    def _call(self, qualname: str, args: tuple, kwargs: dict):
        request = dumps(("call", qualname, args, kwargs))
        worker = self._ensure()
        timeout = _call_timeout()
        try:
            worker.send(request)
            kind, body = worker.receive(timeout)
        except TimeoutError:
            self._drop(worker)
            raise LearnerProcessError(f"lab.{qualname}() did not return within {timeout:g} s "
                                      "(an infinite loop, or a wait that never ends?)") from None
        except (EOFError, OSError, pickle.UnpicklingError, BoundaryError, ValueError, TypeError) as exc:
            how = worker.exit_description() if isinstance(exc, (EOFError, OSError)) else f"sent {exc}"
            self._drop(worker)
            raise LearnerProcessError(f"the learner's process {how} during lab.{qualname}()") from None
        self._echo(worker)
        if kind == "ok":
            return body
        if kind == "error":
            raise rebuild_exception(body)
        self._drop(worker)
        raise LearnerProcessError(f"the learner's process answered lab.{qualname}() with nonsense")

    def _drop(self, worker: _Worker) -> None:
        worker.kill()
        self._echo(worker)
        object.__setattr__(self, "_worker", None)

    def close(self) -> None:
        for worker in (self._worker, self._pending):
            if worker is not None:
                worker.kill()
        object.__setattr__(self, "_worker", None)
        object.__setattr__(self, "_pending", None)


class LabFunction:
    """``lab.f`` (or ``lab.C.method``): call it, pass it to ranks, or ask whether it is still a stub."""

    def __init__(self, proxy: LabProxy, qualname: str):
        self._proxy, self._qualname = proxy, qualname
        self.__qualname__ = qualname
        self.__name__ = qualname.rsplit(".", 1)[-1]

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return LabFunction(self._proxy, f"{self._qualname}.{name}")

    def __call__(self, *args, **kwargs):
        return self._proxy._call(self._qualname, args, kwargs)

    def __repr__(self):
        return f"<lab function {self._qualname} (in a separate process)>"

    def __reduce__(self):
        from commtax.ranks._byfile import _load_object
        return (_load_object, (self._proxy._module_name, learner_path(self._proxy._path), self._qualname))

    def _commtax_stub_message(self):
        return stub_message_in_file(self._proxy._path, self._qualname)


def load_lab_proxy(lab_dir, impl: str | None = None) -> LabProxy:
    """The proxy for ``lab_dir``'s ``starter.py``/``solution.py`` (chosen as :func:`commtax.labs.load_lab` does)."""
    from commtax.labs import lab_file
    path, name = lab_file(lab_dir, impl)
    return LabProxy(path, name)


# -- the untrusted side: the worker -------------------------------------------------------------

def _listing(module) -> dict:
    names = {}
    for name, value in vars(module).items():
        if name.startswith("__"):
            continue
        if callable(value) or isinstance(value, type(sys)):
            names[name] = ("callable",)
            continue
        try:
            names[name] = ("value", _lower(value, 0))
        except BoundaryError:
            names[name] = ("object",)
    return names


def _worker_main(module_name: str, path: str, recv_fd: int, send_fd: int) -> None:  # pragma: no cover - a child
    from commtax.ranks._byfile import load_module_from_file

    def send(obj) -> None:
        try:
            data = pickle.dumps(obj, protocol=4)
        except Exception as exc:  # noqa: BLE001
            data = pickle.dumps(("error", describe_exception(BoundaryError(str(exc)))), protocol=4)
        frame = struct.pack("<Q", len(data)) + data
        view = memoryview(frame)
        while view:
            view = view[os.write(send_fd, view):]

    def receive():
        header = b""
        while len(header) < 8:
            chunk = os.read(recv_fd, 8 - len(header))
            if not chunk:
                os._exit(0)
            header += chunk
        (size,) = struct.unpack("<Q", header)
        parts, got = [], 0
        while got < size:
            chunk = os.read(recv_fd, min(size - got, 1 << 20))
            if not chunk:
                os._exit(0)
            parts.append(chunk)
            got += len(chunk)
        return _PlainUnpickler(io.BytesIO(b"".join(parts))).load()

    sys.path.insert(0, str(Path(path).parent))
    try:
        module = load_module_from_file(module_name, path)
    except BaseException as exc:  # noqa: BLE001 - SystemExit at import is the learner's error too
        send(("import-error", describe_exception(exc, skip_frames=1)))
        sys.stdout.flush()
        os._exit(0)
    send(("ready", _listing(module)))
    while True:
        request = receive()
        try:
            _, qualname, args, kwargs = request
            target = module
            for part in str(qualname).split("."):
                target = getattr(target, part)
            result = target(*_rebuild(args, module, 0), **_rebuild(kwargs, module, 0))
            reply = ("ok", _lower(result, 0))
        except BaseException as exc:  # noqa: BLE001
            reply = ("error", describe_exception(exc, skip_frames=1))
        sys.stdout.flush()
        sys.stderr.flush()
        send(reply)


if __name__ == "__main__":  # pragma: no cover
    _worker_main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
