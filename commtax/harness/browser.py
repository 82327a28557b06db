"""The Chromium the repository's browser tests drive."""

from __future__ import annotations

import os
import shutil


def find_chromium() -> str | None:
    """The Chromium (or Chrome) the browser tests drive: COMMTAX_CHROMIUM, else Debian's, else on PATH."""
    candidates = [
        os.environ.get("COMMTAX_CHROMIUM"),
        "/usr/bin/chromium",
        shutil.which("chromium"),
        shutil.which("chromium-browser"),
        shutil.which("google-chrome"),
    ]
    return next((c for c in candidates if c and os.path.exists(c)), None)
