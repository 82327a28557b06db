"""The trusted side of the boundary: the ``lab`` proxy that calls the learner's code in another process.

The ``lab`` fixture of every lab test is a :class:`LabProxy`: the pytest
process never imports the learner's ``starter.py`` (or ``solution.py``). A
*worker* process (:mod:`commtax.boundary.worker`) imports it, and
``lab.f(*args, **kwargs)`` sends the call there and waits for the answer, in
the safe form of :mod:`commtax.boundary.codec`. So the process that decides
whether a test passed never runs a line of the learner's code.

A call that does not return within ``COMMTAX_LAB_CALL_TIMEOUT`` seconds
(default 60) kills the worker; the next call starts a fresh one. Stub
detection (:func:`commtax.testing.require_implemented`) reads the learner's
file (:mod:`commtax.boundary.stubs`). Passing the proxy (or ``lab.f``) to
:func:`commtax.ranks.launch.run_ranks` makes each rank load the real module
from its file; ranks are learner processes too. Learner processes are
started by :func:`commtax.learner_process.learner_popen`: under the grader,
inside its sandbox.
"""

from __future__ import annotations

import os
import pickle
import select
import signal
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import commtax.boundary.byfile as _byfile
from commtax.boundary.codec import MAX_FRAME, BoundaryError, LearnerProcessError, dumps, loads, rebuild_exception
from commtax.boundary.stubs import stub_message_in_file
from commtax.learner_process import learner_path, learner_popen, sandbox

CALL_TIMEOUT_ENV = "COMMTAX_LAB_CALL_TIMEOUT"
DEFAULT_CALL_TIMEOUT = 60.0
START_TIMEOUT = 120.0
OUTPUT_KEPT = 64 * 1024  # characters of a worker's printed output echoed per call
WORKER_MODULE = "commtax.boundary.worker"


def _call_timeout() -> float:
    try:
        return float(os.environ.get(CALL_TIMEOUT_ENV, DEFAULT_CALL_TIMEOUT))
    except ValueError:
        return DEFAULT_CALL_TIMEOUT


def _with_breakpoint_hint(body, path: str):
    """``body`` (a described exception), its message the way to debug when it is a ``bdb.BdbQuit``.

    A ``breakpoint()`` in the learner's code, called through this proxy, runs in the worker, whose stdin is
    not the terminal: pdb reads end-of-file and quits. The message says how to run the test with the lab in
    the test process instead (``LAB_INPROCESS``, :mod:`commtax.harness.labs`), naming the lab, the file
    (``LAB_IMPL``) and the test (pytest's ``PYTEST_CURRENT_TEST``, parameters left out). Not under the
    grader, which refuses ``LAB_INPROCESS``.
    """
    if not isinstance(body, dict) or body.get("type") != "BdbQuit" or sandbox() is not None:
        return body
    current = os.environ.get("PYTEST_CURRENT_TEST", "")
    test = current.split("::")[-1].split(" ")[0].split("[")[0] if "::" in current else "<test>"
    lab = Path(path).parent.name
    command = f"LAB_INPROCESS=1 LAB_IMPL={Path(path).stem} pytest labs/{lab} -k {test} -s"
    return {**body, "message": f"breakpoint() needs LAB_INPROCESS=1: run `{command}`"}


class _Worker:
    """One learner process and the two pipes we talk to it through."""

    def __init__(self, module_name: str, path: str, cwd: str):
        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe()
        command = [
            sys.executable,
            "-m",
            WORKER_MODULE,
            module_name,
            learner_path(path),
            str(to_child_r),
            str(from_child_w),
        ]
        try:
            self.proc = learner_popen(
                command,
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                pass_fds=(to_child_r, from_child_w),
            )
        finally:
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
            code = self.proc.wait(timeout=5)  # it closed its pipe: it is exiting
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
        return (_byfile._load_module, (self._module_name, learner_path(self._path)))

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
            how = worker.exit_description() if isinstance(exc, (EOFError, OSError)) else "sent what cannot be read"
            worker.kill()
            self._echo(worker)
            raise LearnerProcessError(
                f"the process importing {Path(self._path).name} {how}"
                + ("" if isinstance(exc, EOFError) else f" ({exc})")
            ) from None
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
        __tracebackhide__ = True  # pytest: an error the learner's code raised is shown from the test's line
        request = dumps(("call", qualname, args, kwargs))
        worker = self._ensure()
        timeout = _call_timeout()
        try:
            worker.send(request)
            kind, body = worker.receive(timeout)
        except TimeoutError:
            self._drop(worker)
            raise LearnerProcessError(
                f"lab.{qualname}() did not return within {timeout:g} s (an infinite loop, or a wait that never ends?)"
            ) from None
        except (EOFError, OSError, pickle.UnpicklingError, BoundaryError, ValueError, TypeError) as exc:
            how = worker.exit_description() if isinstance(exc, (EOFError, OSError)) else f"sent {exc}"
            self._drop(worker)
            raise LearnerProcessError(f"the learner's process {how} during lab.{qualname}()") from None
        self._echo(worker)
        if kind == "ok":
            return body
        if kind == "error":
            raise rebuild_exception(_with_breakpoint_hint(body, self._path))
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
        __tracebackhide__ = True  # pytest: the test's line and the learner's error, not the proxy's frames
        return self._proxy._call(self._qualname, args, kwargs)

    def __repr__(self):
        return f"<lab function {self._qualname} (in a separate process)>"

    def __reduce__(self):
        return (_byfile._load_object, (self._proxy._module_name, learner_path(self._proxy._path), self._qualname))

    def _commtax_stub_message(self):
        return stub_message_in_file(self._proxy._path, self._qualname)
