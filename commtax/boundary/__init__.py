"""The boundary between the tests (trusted) and the learner's code (untrusted).

* :mod:`commtax.boundary.codec`: the safe form values cross in (plain data;
  arrays and tensors keep dtype and shape; records), and exceptions.
* :mod:`commtax.boundary.proxy`: the ``lab`` proxy the tests call, which runs
  the learner's file in a worker process (:mod:`commtax.boundary.worker`).
* :mod:`commtax.boundary.stubs`: is a function still the starter's stub
  (read from the file, nothing run).
* :mod:`commtax.boundary.byfile`: pickle functions and modules of files Python cannot import by
  name (a lab's files), for a rank or a worker to load by path.
* :mod:`commtax.boundary.labfiles`: find a lab and load its ``starter.py`` or ``solution.py``
  (``LAB_IMPL``); ``commtax.labs`` re-exports it for the tests, the ranks' demos import it here.
* :mod:`commtax.learner_process`: how a learner process is started and where
  it finds its files (under the grader: in its sandbox).

This package re-exports their public names, so ``from commtax import boundary``
reaches all of them.
"""

from commtax.boundary.codec import (
    BUILTIN_EXCEPTIONS,
    MAX_FRAME,
    BoundaryError,
    LabRecord,
    LearnerError,
    LearnerProcessError,
    describe_exception,
    dumps,
    loads,
    rebuild_exception,
    same_value,
)
from commtax.boundary.proxy import CALL_TIMEOUT_ENV, LabFunction, LabProxy
from commtax.boundary.stubs import _stub_message_of, stub_message_in_file, stub_message_of
from commtax.learner_process import (
    SANDBOX_ENV,
    create_trusted_file,
    learner_env,
    learner_path,
    learner_popen,
    learner_popen_kwargs,
    learner_run,
    learner_run_dir,
    learner_sys_path,
    make_trusted_folder,
    open_learner_file,
    sandbox,
)
from commtax.learner_process import nested as _own_sandboxes

__all__ = [
    "BUILTIN_EXCEPTIONS",
    "MAX_FRAME",
    "BoundaryError",
    "LabRecord",
    "LearnerError",
    "LearnerProcessError",
    "describe_exception",
    "dumps",
    "loads",
    "rebuild_exception",
    "same_value",
    "CALL_TIMEOUT_ENV",
    "LabFunction",
    "LabProxy",
    "_stub_message_of",
    "stub_message_in_file",
    "stub_message_of",
    "SANDBOX_ENV",
    "create_trusted_file",
    "make_trusted_folder",
    "learner_env",
    "learner_path",
    "learner_popen",
    "learner_popen_kwargs",
    "learner_run",
    "learner_run_dir",
    "learner_sys_path",
    "nested",
    "open_learner_file",
    "sandbox",
]


def nested() -> bool:
    """Whether the lab's learner processes cannot meet through a lock on a shared file, so ranks must meet
    over TCP (:class:`commtax.ranks._start.Rendezvous`): each has a sandbox of its own (root mode), or the
    lab's sandbox runs under the seccomp program that refuses file locks (same-user mode)."""
    box = sandbox()
    return _own_sandboxes() or bool(box and box.get("relay") and box.get("filtered"))
