"""Reading a rank's stack: which frame is the learner's line, and which torch.distributed call it waits in.

A stack arrives as ``[file, line, function]`` triples, innermost first: from
a rank's heartbeat (:mod:`commtax.ranks._heartbeat`), from the traceback of
an exception it raised, or parsed from a ``faulthandler`` dump. Every name in
it was written by a process that runs the learner's code: nothing here opens
a file; source lines come only from :class:`commtax.ranks._quotes.Quotes`.
"""

from __future__ import annotations

import os
import re
import sysconfig
import traceback

_RANKS_DIR = os.path.dirname(os.path.abspath(__file__))
_PUBLIC_RUNNER_FILES = ("launch.py", "traffic.py")  # the rest of the runner's files start with "_"
_STDLIB = sysconfig.get_paths().get("stdlib", "\0")
_FRAME_RE = re.compile(r'File "(?P<file>.+)", line (?P<line>\d+) in (?P<func>\S+)')
RECEIVES = ("recv", "irecv", "wait")
# A request's wait, as the rank sees it: commtax.ranks._requests puts this wrapper on Work.wait.
_REQUEST_WAIT = ("_requests.py", "wait")


def _ranks_dirs() -> set[str]:
    """This folder, and under the grader its copy in the learner's sandbox (where ranks import it from)."""
    from commtax.boundary import learner_path

    return {_RANKS_DIR, os.path.normpath(learner_path(_RANKS_DIR))}


def is_runner_file(path: str) -> bool:
    """True for the runner's own files (this package's ``_*.py``, ``launch.py``, ``traffic.py``)."""
    name = os.path.basename(path)
    if not (name.startswith("_") or name in _PUBLIC_RUNNER_FILES) or not name.endswith(".py"):
        return False
    return os.path.dirname(os.path.normpath(os.path.abspath(path))) in _ranks_dirs()


def is_runner_or_library(path: str) -> bool:
    """True for frames the learner did not write: torch, the standard library, this runner."""
    posix = path.replace("\\", "/")
    if posix.startswith("<") or "/site-packages/" in posix or "/dist-packages/" in posix or "/torch/" in posix:
        return True
    return is_runner_file(path) or os.path.abspath(path).startswith(_STDLIB)


def _in_torch_distributed(path: str) -> bool:
    return "/torch/distributed/" in path.replace("\\", "/")


def _is_request_wait(path: str, func: str) -> bool:
    return os.path.basename(path) == _REQUEST_WAIT[0] and func == _REQUEST_WAIT[1] and is_runner_file(path)


def waiting_call(frames) -> str | None:
    """The torch.distributed call a rank is inside (``recv``, ``all_reduce``...), ``"wait"`` when its
    code waits on a request (``req.wait()``), or None when the rank is not waiting on a peer."""
    call, in_wait = None, False
    for file, _line, func in frames:
        if _in_torch_distributed(file):
            if call is None and file.replace("\\", "/").endswith("distributed_c10d.py"):
                call = func  # the innermost torch.distributed function: the one that waits
            continue
        if _is_request_wait(file, func):
            in_wait = True
            continue
        if is_runner_file(file):
            continue  # the heartbeat's and the byte counter's wrappers around the call
        break
    return call or ("wait" if in_wait else None)


def _family(name: str) -> str:
    return {"isend": "send", "irecv": "recv"}.get(name, name)


def _candidates(frames, wrapped: str | None = None):
    """Frames of code someone wrote (not torch, not the runner), innermost first, skipping wrappers.

    A wrapper is a function named like the torch.distributed call it sits on
    (a learner's byte ledger replacing ``dist.all_reduce``, a test's counter
    replacing ``dist.isend``): the line that matters is the one that called it.
    """
    for file, line, func in frames:
        if _in_torch_distributed(file):
            if wrapped is None and file.replace("\\", "/").endswith("distributed_c10d.py"):
                wrapped = func
            continue
        if is_runner_or_library(file):
            continue
        if wrapped and _family(func) == _family(wrapped):
            continue
        wrapped = None
        yield file, line, func


def learner_frame(frames, learner=(), call: str | None = None):
    """The learner's line on a stack, ``(file, line, function)``, or None.

    The innermost frame in one of the ``learner`` files (the lab's module: a
    test's wrapper around it is not the learner's line) if there is one, else
    the innermost frame that is not torch's, the standard library's or the
    runner's. ``call``: the torch.distributed function the stack starts in,
    when the stack does not show it (a request's creation site).
    """
    found = []
    for file, line, func in _candidates(frames, call):
        try:
            spot = (file, int(line), func)
        except (TypeError, ValueError):
            continue
        if file in learner:
            return spot
        found.append(spot)
    return found[0] if found else None


def _main_thread(stack: str) -> list[str]:
    """The lines of the dump's block for the thread running the worker (it started in _rank.main)."""
    blocks, current = [], []
    for line in stack.splitlines():
        if line.startswith(("Thread ", "Current thread ")) and current:
            blocks.append(current)
            current = []
        current.append(line)
    blocks.append(current)
    for block in blocks:
        if any("_rank.py" in line and line.rstrip().endswith(" in main") for line in block):
            return block
    return stack.splitlines()


def parse_dump(stack: str) -> list:
    """A faulthandler dump's worker thread as ``[file, line, function]``, innermost first."""
    frames = []
    for line in _main_thread(stack):
        match = _FRAME_RE.search(line)
        if match:
            frames.append([match["file"], int(match["line"]), match["func"]])
    return frames


def frames_of(failure) -> list:
    """A :class:`RankFailure`'s stack: the heartbeat's or the traceback's, else its dump's."""
    return failure.frames if failure.frames else parse_dump(failure.stack)


_NOISE = ("threading.py", "_exit_when_orphaned", "_heartbeat.py", "_requests.py", "<frozen runpy>", "c10d_logger.py")


def shown_dump(stack: str, limit: int = 12) -> str:
    """The useful part of a faulthandler dump: the runner's own frames and idle threads dropped."""
    keep = []
    for line in stack.splitlines():
        if "commtax/ranks/_rank.py" in line or "commtax\\ranks\\_rank.py" in line:
            continue
        if any(noise in line for noise in _NOISE) or line.startswith("Extension modules:"):
            continue
        keep.append(line)
    # faulthandler lists a block per thread; drop blocks left empty by the filter.
    blocks, current = [], []
    for line in keep:
        if line.startswith(("Thread ", "Current thread ", "Stack (most recent")) and current:
            blocks.append(current)
            current = []
        current.append(line)
    if current:
        blocks.append(current)
    useful = [b for b in blocks if any(l.strip().startswith("File ") for l in b)]
    lines = [l for b in useful for l in b][: limit * 2]
    return "\n".join(lines) if lines else "(no Python stack: it was inside C code with no Python frames)"


def shown_path(file: str) -> str:
    """How an error names a file: relative to the learner's sandbox (under the grader) or to the
    working folder when it lies below them, else as the rank gave it."""
    from commtax.boundary import sandbox

    roots = [os.getcwd()]
    box = sandbox()
    if box:
        roots.insert(0, box["learner_root"])
    normal = os.path.normpath(file) if isinstance(file, str) else str(file)
    for root in roots:
        if normal.startswith(root + os.sep):
            return os.path.relpath(normal, root)
    return normal


def where(file: str, line: int, func: str, quotes=None) -> str:
    """``labs/lab-02.../starter.py:156 in ring_reduce_scatter: `dist.recv(...)```, quoted only from ``quotes``."""
    source = quotes.line(file, line).strip() if quotes is not None else ""
    return f"{shown_path(file)}:{line} in {func}" + (f": `{source}`" if source else "")


def _without_runner(te: traceback.TracebackException) -> None:
    while te is not None:
        te.stack = traceback.StackSummary.from_list([f for f in te.stack if not is_runner_file(f.filename)])
        te = te.__cause__ or te.__context__


def learner_traceback(exc: BaseException, limit: int = 4000) -> str:
    """``exc``'s traceback as text, without the runner's frames, at most ``limit`` characters (its end).

    For a worker that catches an exception to report it as data
    (``{"error": learner_traceback(exc)}``): the learner sees the lines of
    their own file that led to it, as a rank that raises shows them.
    """
    te = traceback.TracebackException.from_exception(exc)
    _without_runner(te)
    text = "".join(te.format())
    return text if len(text) <= limit else "..." + text[-limit:]
