"""Build the course as a static website: ``python3 course.py book`` runs this.

    python book/build.py [--jobs N] [--repository-url URL] [--clean] [--execute 03,04 | --quick]

1. fetch the browser assets once (book/assets.py; needs npm the first time);
2. execute every lesson and worked solution that changed since the last build
   (book/execute.py: one run each, cached in ``_build/executed/``); with
   ``--execute 03,04`` only those lessons and their solutions run, and the
   other notebooks whose execution is not current are shown without outputs
   (``--quick``: QUICK below, the test suite's build outside CI; CI builds
   every notebook, and the suite's nbval run then reuses those executions);
3. stage the pages (book/pages.py) in ``_build/src/``;
4. render them with Sphinx + MyST-NB (book/conf.py) into ``_build/html/``.

Open ``_build/html/index.html`` in a browser. Sphinx's warnings fail the build
(a broken link between pages is one). Run it with the course's environment
(``course.py book`` does); the notebooks execute in that environment's kernel.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
BUILD = ROOT / "_build"
HTML = BUILD / "html"
# The lessons (and their worked solutions) the test suite's quick build executes (outside CI): the
# two quickest (about 11 s together on an idle two-core machine) that carry formulas, a figure and
# calculators. CI builds the whole book, and the suite's nbval run reuses its executions.
QUICK = ("03", "04")

sys.path.insert(0, str(ROOT))
from book import assets, execute, pages  # noqa: E402


def notebooks(root: Path = ROOT) -> list[Path]:
    """Every lesson and worked solution (solutions are absent from the student release)."""
    return sorted((root / "lessons").glob("[0-9][0-9]-*.ipynb")) + sorted(
        (root / "solutions").glob("[0-9][0-9]-*.ipynb")
    )


def repository_url(given: str | None) -> str:
    """The URL readers clone: --repository-url, COMMTAX_BOOK_REPOSITORY, else git's https origin, else none."""
    url = given or os.environ.get("COMMTAX_BOOK_REPOSITORY", "")
    if not url:
        found = subprocess.run(["git", "-C", str(ROOT), "remote", "get-url", "origin"], capture_output=True, text=True)
        url = found.stdout.strip() if found.returncode == 0 else ""
    url = url.removesuffix(".git")
    return url if url.startswith("https://") else ""


def selected(lessons: list[str] | None, root: Path = ROOT) -> set[Path] | None:
    """The notebooks of the lessons numbered in ``lessons`` ("03"), or None for all of them."""
    if lessons is None:
        return None
    chosen = {p for p in notebooks(root) if p.name[:2] in lessons}
    unknown = set(lessons) - {p.name[:2] for p in chosen}
    if unknown:
        raise SystemExit(f"[book] --execute: no lesson numbered {', '.join(sorted(unknown))}")
    return chosen


def rendered_from(repository: str) -> str:
    """A digest of everything Sphinx renders from: the staged pages, this folder (conf.py, static/)
    and the assets' versions. Equal digests: the site in _build/html is already these pages."""
    digest = hashlib.sha256(repository.encode())
    for folder in (BUILD / "src", HERE / "static"):
        for path in sorted(p for p in folder.rglob("*") if p.is_file()):
            digest.update(str(path).encode() + b"\0" + path.read_bytes())
    for path in [HERE / "conf.py", *sorted((BUILD / "assets").glob("*/.version"))]:
        digest.update(str(path).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def build(jobs: int = 1, repository: str | None = None, clean: bool = False, lessons: list[str] | None = None) -> Path:
    """Build the book into ``_build/html``; return the path of its home page.

    ``lessons``: the numbers of the lessons whose notebooks run if their execution is not
    current (None: all); the others reuse a current execution or show no outputs.
    """
    start = time.monotonic()
    if clean:
        import shutil

        shutil.rmtree(BUILD / "src", ignore_errors=True)
        shutil.rmtree(HTML, ignore_errors=True)
        shutil.rmtree(BUILD / "doctrees", ignore_errors=True)
    asset_dir = assets.ensure_assets(BUILD / "assets")
    executed = execute.execute_all(notebooks(), ROOT, BUILD / "executed", jobs=jobs, run=selected(lessons))
    ran = time.monotonic()
    url = repository_url(repository)
    pages.stage(ROOT, BUILD / "src", executed, url)
    rendered = HTML / ".commtax-rendered"  # what the last complete render was made from
    inputs = rendered_from(url)
    if rendered.exists() and rendered.read_text() == inputs:
        print("[book] no page changed since the last build: not rendered again", flush=True)
    else:
        env = dict(os.environ, COMMTAX_BOOK_ASSETS=str(asset_dir), COMMTAX_BOOK_REPOSITORY=url)
        command = [
            sys.executable,
            "-m",
            "sphinx",
            "-b",
            "html",
            "-c",
            str(HERE),
            "-d",
            str(BUILD / "doctrees"),
            "-W",
            "--keep-going",
            "-q",
            str(BUILD / "src"),
            str(HTML),
        ]
        rendered.unlink(missing_ok=True)
        if subprocess.call(command, env=env) != 0:
            raise SystemExit("[book] Sphinx reported the problems above; the book is not complete")
        rendered.write_text(inputs)
    done = time.monotonic()
    print(
        f"[book] built in {done - start:.0f} s (notebooks {ran - start:.0f} s, pages {done - ran:.0f} s): "
        f"open {HTML / 'index.html'}",
        flush=True,
    )
    return HTML / "index.html"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="course.py book", description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=1, help="notebooks executed at a time (default 1)")
    parser.add_argument("--repository-url", help="the https URL readers clone (default: git's origin, if https)")
    parser.add_argument("--clean", action="store_true", help="re-render every page (executions stay cached)")
    parser.add_argument(
        "--execute",
        metavar="NN,NN",
        type=lambda text: [n.strip().zfill(2) for n in text.split(",")],
        help="execute only these lessons (and their solutions); others show outputs only "
        f"from an earlier build (the test suite's quick build: {','.join(QUICK)})",
    )
    parser.add_argument(
        "--quick", action="store_true", help=f"--execute {','.join(QUICK)}: the test suite's build outside CI (seconds)"
    )
    args = parser.parse_args(argv)
    build(args.jobs, args.repository_url, args.clean, list(QUICK) if args.quick else args.execute)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
