#!/usr/bin/env python3
"""Set up and run the course with one command.

    python3 course.py lab     open the course in JupyterLab
    python3 course.py test    run the whole test suite (extra arguments go to pytest)
    python3 course.py book    build the course as a website into _build/html (see book/build.py;
                              every notebook executed once, as CI does; --quick: two lessons)

The first run creates a virtual environment in ``.venv`` next to this file and
installs the pinned dependencies of ``requirements.txt`` plus the course's own
package (``commtax``). Later runs reuse it, and reinstall only when
``requirements.txt`` or ``pyproject.toml`` changed. Needs Python 3.11 or newer
(the course is tested with 3.11; numpy 2.4.6 has no 3.10 build) and access to the package index.

``book`` also installs the book's tools (``book/requirements.txt``: Sphinx,
MyST-NB and the Sphinx Book Theme, constrained by ``requirements.txt`` so no
pin of the course moves) into the same environment, and the first build fetches
MathJax and the Jupyter widget manager with Node.js's ``npm``.

Set ``COMMTAX_VENV`` to put the environment somewhere else. Inside the
course's conda environment (``conda activate communication-tax``) the
commands use that environment instead of making ``.venv``.

JupyterLab settings the course relies on (``jupyter-settings/overrides.json``:
widget state saved with the notebook, so a reopened lesson shows its
calculators; no "official Jupyter news" pop-up; long code lines wrapped) are
installed into the environment's own settings folder,
``<env>/share/jupyter/lab/settings/overrides.d/communication-tax.json``, where
JupyterLab reads them as defaults (your own settings still win). After that,
a plain ``jupyter lab`` in the same environment has them too.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = Path(os.environ.get("COMMTAX_VENV", ROOT / ".venv"))
STAMP = VENV / ".commtax-installed"
BOOK_STAMP_NAME = ".commtax-book-installed"
FIRST_LESSON = "lessons/01-collectives-and-alpha-beta.ipynb"
SETTINGS = ROOT / "jupyter-settings" / "overrides.json"
CONDA_ENV = "communication-tax"  # the name in environment.yml


def in_course_conda_env() -> bool:
    """True when this Python is the course's activated conda environment (then it is used as is)."""
    return (
        os.environ.get("CONDA_DEFAULT_ENV") == CONDA_ENV
        and Path(os.environ.get("CONDA_PREFIX", "")).resolve() == Path(sys.prefix).resolve()
    )


def install_settings(prefix: Path) -> Path:
    """Copy the course's JupyterLab settings overrides into the environment at ``prefix``; return the file.

    JupyterLab merges ``<prefix>/share/jupyter/lab/settings/overrides.d/*.json``
    into its defaults (jupyterlab_server's app settings folder), under the user's
    own settings.
    """
    target = Path(prefix) / "share" / "jupyter" / "lab" / "settings" / "overrides.d" / "communication-tax.json"
    wanted = SETTINGS.read_text()
    if not target.exists() or target.read_text() != wanted:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(wanted)
    return target


def venv_python() -> Path:
    return VENV / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def wanted_stamp() -> str:
    digest = hashlib.sha256()
    for name in ("requirements.txt", "pyproject.toml"):
        digest.update((ROOT / name).read_bytes())
    return digest.hexdigest()


def ensure_environment() -> Path:
    """Create and fill the virtual environment if needed; return its Python."""
    if sys.version_info < (3, 11):  # noqa: UP036  (this file runs under whatever python3 the learner has)
        sys.exit(f"The course needs Python 3.11 or newer; this is {sys.version.split()[0]}.")
    python = venv_python()
    if not python.exists():
        print(f"[course] creating a virtual environment in {VENV} ...", flush=True)
        venv.EnvBuilder(with_pip=True).create(VENV)
    if not STAMP.exists() or STAMP.read_text() != wanted_stamp():
        print("[course] installing the pinned dependencies (first run: a few minutes) ...", flush=True)
        subprocess.run(
            [
                str(python),
                "-m",
                "pip",
                "install",
                "--disable-pip-version-check",
                "-r",
                str(ROOT / "requirements.txt"),
                "-e",
                str(ROOT),
            ],
            check=True,
        )
        STAMP.write_text(wanted_stamp())
    return python


def ensure_book_tools(python: str, prefix: Path) -> None:
    """Install the book's tools into the environment at ``prefix`` unless its stamp says they are there."""
    digest = hashlib.sha256()
    for name in ("book/requirements.txt", "requirements.txt"):
        digest.update((ROOT / name).read_bytes())
    stamp = Path(prefix) / BOOK_STAMP_NAME
    if stamp.exists() and stamp.read_text() == digest.hexdigest():
        return
    print("[course] installing the book's tools (Sphinx, MyST-NB; first run: a minute) ...", flush=True)
    subprocess.run(
        [
            python,
            "-m",
            "pip",
            "install",
            "--disable-pip-version-check",
            "-r",
            str(ROOT / "book" / "requirements.txt"),
            "-c",
            str(ROOT / "requirements.txt"),
        ],
        check=True,
    )
    stamp.write_text(digest.hexdigest())


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help", "help") or argv[0] not in ("lab", "test", "book"):
        print(__doc__)
        return 0 if argv and argv[0] in ("-h", "--help", "help") else 2
    command, extra = argv[0], argv[1:]
    if in_course_conda_env():
        python, prefix = sys.executable, Path(sys.prefix)
    else:
        python, prefix = str(ensure_environment()), VENV
    install_settings(prefix)
    if command == "lab":
        args = [
            python,
            "-m",
            "jupyterlab",
            f"--ServerApp.root_dir={ROOT}",
            f"--LabApp.default_url=/lab/tree/{FIRST_LESSON}",
            *extra,
        ]
        if hasattr(os, "geteuid") and os.geteuid() == 0 and "--allow-root" not in extra:
            args.append("--allow-root")  # containers often run as root; Jupyter refuses without this
    elif command == "book":
        ensure_book_tools(python, prefix)
        args = [python, str(ROOT / "book" / "build.py"), *extra]
    else:
        args = [python, "-m", "pytest", *extra]
    os.chdir(ROOT)
    try:
        return subprocess.call(args)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
