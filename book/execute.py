"""Run each notebook once, and keep the result until what it depends on changes.

An executed notebook is stored under ``_build/executed/`` with the key it was
run for (``metadata.commtax_book.key``). The key hashes the notebook's code
cells and kernel, and everything else its outputs depend on: the ``commtax``
package, the data files under ``labs/`` that lessons read, and the pinned
requirements. A build whose key matches reuses the stored notebook; anything
else (an edited cell, a changed formula in ``commtax``) runs it again, unless
the build asked for only some notebooks (``--quick``, CI's build: a fresh clone
has no store, so there the two quick lessons and their solutions run, once).

Execution is what the test suite's nbval run does, with nbclient: the kernel of
this environment, the notebook's own folder as the working directory, the same
per-cell timeout (180 s), and any cell error fails the build, naming the
notebook and the cell. nbclient also saves the widget state, so the calculators
can be drawn on the page.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import nbformat

CELL_TIMEOUT_S = 180          # nbval's --nbval-cell-timeout in pyproject.toml
DEPENDENCIES = ("commtax", "labs", "requirements.txt")
DATA_SUFFIXES = {".csv", ".json"}   # under labs/: the files lessons read (code there is not theirs)


def _files(root: Path):
    for name in DEPENDENCIES:
        path = root / name
        if path.is_file():
            yield path
        elif name == "labs":
            yield from (p for p in sorted(path.rglob("*")) if p.suffix in DATA_SUFFIXES and p.is_file()
                        and "calibrations" not in p.parts)   # git-ignored, per machine
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
    if not path.exists():
        return None
    return nbformat.read(path, as_version=4).metadata.get("commtax_book", {}).get("key")


def _run(source: Path, target: Path, key: str, root: Path) -> float:
    from nbclient import NotebookClient

    from nbclient.exceptions import CellExecutionError, CellTimeoutError

    nb = nbformat.read(source, as_version=4)
    start = time.monotonic()
    try:
        NotebookClient(nb, timeout=CELL_TIMEOUT_S, kernel_name="python3", allow_errors=False,
                       store_widget_state=True, resources={"metadata": {"path": str(source.parent)}}).execute()
    except (CellExecutionError, CellTimeoutError) as error:
        raise SystemExit(f"[book] {source.relative_to(root)} failed; nothing of it is stored:\n{error}") from None
    seconds = time.monotonic() - start
    nb.metadata["commtax_book"] = {"key": key, "source": str(source.relative_to(root)),
                                   "seconds": round(seconds, 1)}
    target.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, target)
    return seconds


def execute_all(sources: list[Path], root: Path, store: Path, jobs: int = 1,
                run: set[Path] | None = None) -> dict[Path, Path]:
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
    print(f"[book] {len(sources) - len(todo) - len(skipped)} of {len(sources)} notebooks reused from {store}; "
          f"executing {len(todo)}" + (f"; {len(skipped)} shown without outputs" if skipped else ""), flush=True)

    def one(item):
        source, target, key = item
        seconds = _run(source, target, key, root)
        print(f"[book]   executed {source.relative_to(root)} in {seconds:.0f} s", flush=True)

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        list(pool.map(one, todo))   # list(): re-raises the first notebook's error
    return done
