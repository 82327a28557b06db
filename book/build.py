"""Build the course as a static website: ``python3 course.py book`` runs this.

    python book/build.py [--jobs N] [--repository-url URL] [--clean]

1. fetch the browser assets once (book/assets.py; needs npm the first time);
2. execute every lesson and worked solution that changed since the last build
   (book/execute.py: one run each, cached in ``_build/executed/``);
3. stage the pages (book/pages.py) in ``_build/src/``;
4. render them with Sphinx + MyST-NB (book/conf.py) into ``_build/html/``.

Open ``_build/html/index.html`` in a browser. Sphinx's warnings fail the build
(a broken link between pages is one). Run it with the course's environment
(``course.py book`` does); the notebooks execute in that environment's kernel.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
BUILD = ROOT / "_build"
HTML = BUILD / "html"

sys.path.insert(0, str(ROOT))
from book import assets, execute, pages  # noqa: E402


def notebooks(root: Path = ROOT) -> list[Path]:
    """Every lesson and worked solution (solutions are absent from the student release)."""
    return sorted((root / "lessons").glob("[0-9][0-9]-*.ipynb")) + \
        sorted((root / "solutions").glob("[0-9][0-9]-*.ipynb"))


def repository_url(given: str | None) -> str:
    """The URL readers clone: --repository-url, COMMTAX_BOOK_REPOSITORY, else git's https origin, else none."""
    url = given or os.environ.get("COMMTAX_BOOK_REPOSITORY", "")
    if not url:
        found = subprocess.run(["git", "-C", str(ROOT), "remote", "get-url", "origin"],
                               capture_output=True, text=True)
        url = found.stdout.strip() if found.returncode == 0 else ""
    url = url.removesuffix(".git")
    return url if url.startswith("https://") else ""


def build(jobs: int = 1, repository: str | None = None, clean: bool = False) -> Path:
    """Build the book into ``_build/html``; return the path of its home page."""
    start = time.monotonic()
    if clean:
        import shutil
        shutil.rmtree(BUILD / "src", ignore_errors=True)
        shutil.rmtree(HTML, ignore_errors=True)
        shutil.rmtree(BUILD / "doctrees", ignore_errors=True)
    asset_dir = assets.ensure_assets(BUILD / "assets")
    executed = execute.execute_all(notebooks(), ROOT, BUILD / "executed", jobs=jobs)
    ran = time.monotonic()
    url = repository_url(repository)
    pages.stage(ROOT, BUILD / "src", executed, url)
    env = dict(os.environ, COMMTAX_BOOK_ASSETS=str(asset_dir), COMMTAX_BOOK_REPOSITORY=url)
    command = [sys.executable, "-m", "sphinx", "-b", "html", "-c", str(HERE), "-d", str(BUILD / "doctrees"),
               "-W", "--keep-going", "-q", str(BUILD / "src"), str(HTML)]
    if subprocess.call(command, env=env) != 0:
        raise SystemExit("[book] Sphinx reported the problems above; the book is not complete")
    done = time.monotonic()
    print(f"[book] built in {done - start:.0f} s (notebooks {ran - start:.0f} s, pages {done - ran:.0f} s): "
          f"open {HTML / 'index.html'}", flush=True)
    return HTML / "index.html"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="course.py book", description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=1, help="notebooks executed at a time (default 1)")
    parser.add_argument("--repository-url", help="the https URL readers clone (default: git's origin, if https)")
    parser.add_argument("--clean", action="store_true", help="re-render every page (executions stay cached)")
    args = parser.parse_args(argv)
    build(args.jobs, args.repository_url, args.clean)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
