"""Generate each lab's ``starter.py`` from its ``solution.py``.

A solution marks what the learner writes, nbgrader-style::

    def p2p_time(nbytes, alpha, bandwidth):
        \"\"\"Docstring, kept.\"\"\"
        # BEGIN SOLUTION
        # HINT: a fixed start-up cost plus the bytes divided by the bandwidth.
        return alpha + nbytes / bandwidth
        # END SOLUTION

Inside a function, the marked block becomes ``raise NotImplementedError(
"p2p_time: not implemented yet. Hint: ...")`` built from its ``# HINT:``
lines. A marked block at the top level of the file (a helper only the
solution needs) is dropped. Everything else (imports, docstrings, signatures,
helpers the learner may use) is copied unchanged, so the starter has the
solution's public names and signatures by construction.

``python -m grading starters`` rewrites every ``starter.py``; the test suite
checks that doing so would change nothing.
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

BEGIN = "# BEGIN SOLUTION"
END = "# END SOLUTION"
HINT = "# HINT:"
_DEF_RE = re.compile(r"^(\s*)(?:async\s+)?def\s+(\w+)\s*\(")
_CLASS_RE = re.compile(r"^(\s*)class\s+(\w+)")


class MarkerError(ValueError):
    """A solution file's markers are unbalanced or misplaced."""


def _enclosing_name(lines: list[str], index: int, indent: int) -> str | None:
    """Name of the def that contains line ``index`` (``Class.method`` for a method)."""
    name, def_indent = None, 0
    for j in range(index - 1, -1, -1):
        line = lines[j]
        if not line.strip():
            continue
        current = len(line) - len(line.lstrip())
        if name is None:
            match = _DEF_RE.match(line)
            if match and current < indent:
                name, def_indent = match.group(2), current
        elif current < def_indent:
            match = _CLASS_RE.match(line)
            return f"{match.group(2)}.{name}" if match else name
    return name


def _raise_lines(indent: str, name: str, hints: list[str]) -> list[str]:
    message = f"{name}: not implemented yet."
    if hints:
        message += " Hint: " + " ".join(hints)
    width = max(40, 96 - len(indent) - 8)
    parts = textwrap.wrap(
        message, width=width, drop_whitespace=False, break_on_hyphens=False, break_long_words=False
    ) or [message]
    quoted = ['"' + part.replace("\\", "\\\\").replace('"', '\\"') + '"' for part in parts]
    if len(quoted) == 1:
        return [f"{indent}raise NotImplementedError({quoted[0]})"]
    body = [f"{indent}    {part}" for part in quoted]
    return [f"{indent}raise NotImplementedError(", *body, f"{indent})"]


def make_starter(solution_text: str, filename: str = "solution.py") -> str:
    """Return the starter text for a solution text (see the module docstring)."""
    lines = solution_text.splitlines()
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        stripped = line.strip()
        if stripped == END:
            raise MarkerError(f"{filename}:{i + 1}: {END} without {BEGIN}")
        if stripped != BEGIN:
            out.append(line)
            i += 1
            continue
        indent = line[: len(line) - len(line.lstrip())]
        start = i
        hints = []
        i += 1
        while i < len(lines) and lines[i].strip() != END:
            if lines[i].strip() == BEGIN:
                raise MarkerError(f"{filename}:{i + 1}: nested {BEGIN}")
            if lines[i].strip().startswith(HINT):
                hints.append(lines[i].strip()[len(HINT) :].strip())
            i += 1
        if i == len(lines):
            raise MarkerError(f"{filename}:{start + 1}: {BEGIN} is never closed by {END}")
        i += 1  # skip END
        if not indent:
            continue  # a top-level block only the solution needs
        name = _enclosing_name(lines, start, len(indent))
        if name is None:
            raise MarkerError(f"{filename}:{start + 1}: an indented {BEGIN} must sit inside a function")
        out.extend(_raise_lines(indent, name, hints))
    text = "\n".join(out) + "\n"
    # A dropped top-level block can leave three blank lines in a row; keep PEP 8's two.
    return re.sub(r"\n{4,}", "\n\n\n", text)


def starter_path(solution_path: Path) -> Path:
    return Path(solution_path).with_name("starter.py")


def regenerate(labs_dir: Path, check_only: bool = False) -> list[Path]:
    """Rewrite (or, with ``check_only``, list) every starter.py that differs from its solution."""
    stale = []
    for solution in sorted(Path(labs_dir).glob("lab-*/solution.py")):
        wanted = make_starter(solution.read_text(), str(solution))
        target = starter_path(solution)
        if not target.exists() or target.read_text() != wanted:
            stale.append(target)
            if not check_only:
                target.write_text(wanted)
    return stale
