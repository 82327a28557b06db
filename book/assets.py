"""The browser assets the book serves itself: MathJax and the Jupyter widget manager.

The pages must work without a CDN (a reader offline, a CI machine that reaches
only package registries), so the two JavaScript packages they load are taken
from the npm registry with npm's own client (``npm pack``: just the package's
tarball, none of its development dependencies), checked against the integrity
hash pinned here, and unpacked into ``_build/assets/`` once. Later builds reuse
them and need no network.

* ``@jupyter-widgets/html-manager``'s ``dist/embed.js``: renders a notebook's
  saved widget state (the calculators) as static controls, without a kernel.
  It carries ipywidgets' base, controls and output widgets, all the course uses.
* ``mathjax`` 3: typesets the lessons' formulas in the browser (its ``es5``
  build: the combined TeX loader, its fonts, and the extensions it autoloads).
"""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
import subprocess
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Asset:
    package: str
    version: str
    integrity: str  # npm's sha512 of the tarball, as `npm pack --json` reports it
    folder: str  # where it lands under the assets folder (served as _static/<folder>/)
    members: tuple  # path prefixes inside the tarball to keep, relative to its `package/` folder
    strip: str  # prefix removed from each kept path

    @property
    def spec(self) -> str:
        return f"{self.package}@{self.version}"


ASSETS = (
    Asset(
        "@jupyter-widgets/html-manager",
        "1.0.15",
        "sha512-5thBIV6ymNgmPVOHvzx+gGy8ZSKmSazhtGw4/c4xJDVzRhG9PTeQsRjF3FUTopvFi//SABeNz1yp47bCrJ3CQA==",
        "html-manager",
        (
            "dist/embed.js",
            "dist/embed.js.LICENSE.txt",
            "dist/*.woff2",
            "dist/*.woff",
            "dist/*.ttf",
            "dist/*.eot",
            "dist/*.svg",
            "LICENSE",
        ),
        "dist/",
    ),
    Asset(
        "mathjax",
        "3.2.2",
        "sha512-Bt+SSVU8eBG27zChVewOicYs7Xsdt40qm4+UpHyX7k0/O9NliPc+x77k1/FEsPsjKPZGJvtRZM1vO+geW0OhGw==",
        "mathjax",
        (
            "es5/tex-mml-chtml.js",
            "es5/input/",
            "es5/output/chtml",
            "es5/a11y/",
            "es5/ui/",
            "es5/sre/",
            "es5/adaptors/",
            "LICENSE",
        ),
        "es5/",
    ),
)


def _wanted(name: str, asset: Asset) -> bool:
    from fnmatch import fnmatch

    return any(fnmatch(name, m) if "*" in m else name.startswith(m) for m in asset.members)


def _integrity(path: Path) -> str:
    return "sha512-" + base64.b64encode(hashlib.sha512(path.read_bytes()).digest()).decode()


def _npm() -> str:
    npm = shutil.which("npm")
    if npm is None:
        raise SystemExit(
            "[book] npm (Node.js) is needed once, to fetch MathJax and the Jupyter widget manager "
            "from the npm registry: install Node.js 18 or newer (Debian: apt-get install nodejs npm) "
            "and run the command again."
        )
    return npm


def ensure_assets(dest: Path) -> Path:
    """Make ``dest/<folder>/`` hold each asset at its pinned version; return ``dest``.

    A folder is complete when its ``.version`` file names the pinned spec, so an
    interrupted unpack is redone and a version bump refetches.
    """
    dest.mkdir(parents=True, exist_ok=True)
    for asset in ASSETS:
        target = dest / asset.folder
        stamp = target / ".version"
        if stamp.exists() and stamp.read_text() == asset.spec:
            continue
        with tempfile.TemporaryDirectory() as tmp:
            print(f"[book] fetching {asset.spec} from the npm registry ...", flush=True)
            out = subprocess.run(
                [_npm(), "pack", "--json", "--pack-destination", tmp, asset.spec],
                check=True,
                capture_output=True,
                text=True,
            ).stdout
            tarball = Path(tmp) / json.loads(out)[0]["filename"]
            got = _integrity(tarball)
            if got != asset.integrity:
                raise SystemExit(f"[book] {asset.spec}: integrity {got} does not match the pinned {asset.integrity}")
            shutil.rmtree(target, ignore_errors=True)
            with tarfile.open(tarball) as tar:
                for member in tar.getmembers():
                    name = member.name.removeprefix("package/")
                    if member.isfile() and _wanted(name, asset):
                        out_path = target / name.removeprefix(asset.strip)
                        out_path.parent.mkdir(parents=True, exist_ok=True)
                        out_path.write_bytes(tar.extractfile(member).read())
        stamp.write_text(asset.spec)
    return dest
