"""Run each notebook once, and keep the result until what it depends on changes.

An executed notebook is stored under ``_build/executed/`` with the key it was
run for (``metadata.commtax_book.key``). The key hashes the notebook's code
cells and kernel, and everything else its outputs depend on: the ``commtax``
package, the data files under ``labs/`` that lessons read, and the pinned
requirements. A build whose key matches reuses the stored notebook; anything
else (an edited cell, a changed formula in ``commtax``) runs it again, unless
the build asked for only some notebooks (``--quick``: the two quick lessons and
their solutions run, the others reuse a current execution or show no outputs).

Execution is what the test suite's nbval run does, with nbclient: the kernel of
this environment, the notebook's own folder as the working directory, the same
per-cell timeout (180 s). A cell that raises (or times out, or a kernel that
dies) fails the notebook: nothing of it is stored, the other notebooks still
run, and the build then fails naming each failed notebook and its cell.
nbclient also saves the widget state, so the calculators can be drawn on the
page.

The test suite runs each notebook only once: its nbval run skips a notebook
whose stored execution is current (``reusable``: the same key, made in the same
environment, every cell run, no error, no nbval marker asking for more than
"no cell raised"), so after ``python3 course.py book`` (CI builds it first) the
suite does not execute the course a second time. Anything else, nbval runs.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import nbformat

CELL_TIMEOUT_S = 180  # nbval's --nbval-cell-timeout in pyproject.toml
DEPENDENCIES = ("commtax", "labs", "requirements.txt")
DATA_SUFFIXES = {".csv", ".json", ".log", ".gz"}  # under labs/: the files lessons read (code there is not theirs)
STORE = Path("_build") / "executed"  # under the repository root
# nbval's cell markers (comments or tags) that ask it for more than "no cell raised": a notebook
# carrying one is left to nbval (the suite's --nbval-lax otherwise compares no output).
NBVAL_MARKERS = re.compile(r"^\s*#\s*(NBVAL_|PYTEST_VALIDATE_)", re.M)
NBVAL_TAGS = {"nbval-check-output", "nbval-raises-exception", "raises-exception", "nbval-skip", "nbval-ignore-output"}


def _files(root: Path):
    for name in DEPENDENCIES:
        path = root / name
        if path.is_file():
            yield path
        elif name == "labs":
            yield from (
                p
                for p in sorted(path.rglob("*"))
                if p.suffix in DATA_SUFFIXES and p.is_file() and "calibrations" not in p.parts
            )  # git-ignored, per machine
        else:
            yield from (p for p in sorted(path.rglob("*")) if p.is_file() and "__pycache__" not in p.parts)


def dependencies_digest(root: Path) -> str:
    """One hash of every file besides the notebook that an execution's outputs depend on."""
    digest = hashlib.sha256()
    for path in _files(root):
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def notebook_key(nb, dependencies: str) -> str:
    """The cache key of one execution: code cells, kernel and the dependencies' digest."""
    code = [c.source for c in nb.cells if c.cell_type == "code"]
    kernel = nb.metadata.get("kernelspec", {}).get("name", "python3")
    return hashlib.sha256(json.dumps([code, kernel, dependencies]).encode()).hexdigest()


def stored_key(path: Path) -> str | None:
    """The key of the execution stored at ``path`` if it ran in this environment, else None."""
    if not path.exists():
        return None
    record = nbformat.read(path, as_version=4).metadata.get("commtax_book", {})
    return record.get("key") if record.get("environment") == environment() else None


def environment() -> str:
    """The environment a notebook runs in here: its kernel is this Python (see ``_run``)."""
    return os.path.realpath(sys.prefix)


def unfinished_cell(nb) -> str | None:
    """The first code cell (numbered as nbval numbers them) that raised or never ran, else None."""
    code = [c for c in nb.cells if c.cell_type == "code"]
    for number, cell in enumerate(code):
        errors = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
        if errors:
            return f"Cell {number}: {errors[0].get('ename')}: {errors[0].get('evalue')}"
        if cell.source.strip() and not cell.get("execution_count"):
            return f"Cell {number} did not run"
    return None


def reusable(source: Path, root: Path, dependencies: str | None = None) -> tuple[Path | None, str]:
    """The stored execution of ``source`` if the suite's nbval run may take it for its own, and why (not).

    It may when nbval would check nothing more on a run of its own: the stored run
    is of these code cells and dependencies (the key), in this environment (nbval
    runs ``--nbval-current-env``), every code cell ran and none raised, and no cell
    carries an nbval marker (those ask nbval to compare outputs or expect an error).
    """
    source, root = Path(source).resolve(), Path(root).resolve()
    if not source.is_relative_to(root):
        return None, "not a notebook of this repository"
    target = root / STORE / source.relative_to(root)
    if not target.exists():
        return None, "no stored execution"
    nb = nbformat.read(source, as_version=4)
    if any(
        NBVAL_MARKERS.search(c.source) or NBVAL_TAGS & set(c.metadata.get("tags", []))
        for c in nb.cells
        if c.cell_type == "code"
    ):
        return None, "it carries an nbval marker"
    stored = nbformat.read(target, as_version=4)
    record = stored.metadata.get("commtax_book", {})
    if record.get("key") != notebook_key(nb, dependencies or dependencies_digest(root)):
        return None, "the stored execution is of other sources"
    if record.get("environment") != environment():
        return None, f"the stored execution ran in another environment ({record.get('environment')})"
    problem = unfinished_cell(stored)
    if problem:
        return None, f"the stored execution is not clean ({problem})"
    return target, (
        f"run once, by the book's build ({target.relative_to(root)}, {record.get('seconds')} s; "
        "current and clean): nbval does not run it again"
    )


def _run(source: Path, target: Path, key: str, root: Path) -> tuple[float, str | None]:
    """Execute ``source``; store it under ``target`` if it ran clean. Return (seconds, what failed)."""
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError

    nb = nbformat.read(source, as_version=4)
    start = time.monotonic()
    try:
        NotebookClient(
            nb,
            timeout=CELL_TIMEOUT_S,
            kernel_name="python3",
            allow_errors=False,
            store_widget_state=True,
            resources={"metadata": {"path": str(source.parent)}},
        ).execute()
    except (CellExecutionError, CellTimeoutError, DeadKernelError) as error:
        lines = re.sub(r"\x1b\[[0-9;]*m", "", str(error)).strip().splitlines()  # no terminal colours
        return time.monotonic() - start, unfinished_cell(nb) or (lines[-1] if lines else type(error).__name__)
    seconds = time.monotonic() - start
    nb.metadata["commtax_book"] = {
        "key": key,
        "source": str(source.relative_to(root)),
        "seconds": round(seconds, 1),
        "environment": environment(),
    }
    target.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, target)
    return seconds, None


def execute_all(
    sources: list[Path], root: Path, store: Path, jobs: int = 1, run: set[Path] | None = None
) -> dict[Path, Path]:
    """Return {source notebook: its executed copy} for every source that has a current execution.

    A notebook whose stored execution is stale is executed again when ``run`` is
    None (every notebook) or holds it; otherwise it is left out of the result and
    its page shows the notebook as stored, without outputs (``--execute`` builds,
    such as the test suite's quick one). ``jobs`` notebooks run at a time (default
    one: the lessons start several ranks each, and the suite's nbval runs them one
    after another too).
    """
    # The kernels import this tree's commtax, whatever the environment has installed.
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))
    dependencies = dependencies_digest(root)
    done, todo, skipped = {}, [], []
    for source in sources:
        target = store / source.relative_to(root)
        key = notebook_key(nbformat.read(source, as_version=4), dependencies)
        if stored_key(target) == key:
            done[source] = target
        elif run is None or source in run:
            todo.append((source, target, key))
            done[source] = target
        else:
            skipped.append(source)
    print(
        f"[book] {len(sources) - len(todo) - len(skipped)} of {len(sources)} notebooks reused from {store}; "
        f"executing {len(todo)}" + (f"; {len(skipped)} shown without outputs" if skipped else ""),
        flush=True,
    )

    failed = {}

    def one(item):
        source, target, key = item
        seconds, failure = _run(source, target, key, root)
        if failure:
            failed[source] = failure
            done.pop(source, None)
            print(f"[book]   FAILED {source.relative_to(root)} after {seconds:.0f} s: {failure}", flush=True)
        else:
            print(f"[book]   executed {source.relative_to(root)} in {seconds:.0f} s", flush=True)

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        list(pool.map(one, todo))  # list(): re-raises an unexpected error
    if failed:  # the others ran and are stored; the test suite's nbval run shows each traceback in full
        raise SystemExit(
            "[book] these notebooks failed; nothing of them is stored:\n"
            + "\n".join(f"  {source.relative_to(root)}: {failure}" for source, failure in sorted(failed.items()))
        )
    return done
