"""The exception a lesson's calculator shows when it needs a lab function the learner has not written.

A leaf of commtax's imports (it imports no commtax module: ``tests/test_layers.py`` checks):
:mod:`commtax.learner` raises it, :mod:`commtax.ui.powered` shows it, and neither has to import the
other for it.
"""

from __future__ import annotations

from pathlib import Path

# The course's lab folders, the folder commtax.labs.LABS_DIR names: read here with a glob, so that a
# calculator's message does not pull the lab loader (and the boundary under it) into every ui module.
_LABS_DIR = Path(__file__).resolve().parents[1] / "labs"


class Unlit(NotImplementedError):
    """A calculator needs a lab function the learner has not written yet (or that does not load)."""

    def __init__(self, lab: str, name: str, why: str = ""):
        self.lab, self.name, self.why = _number(lab), name, why
        where = _where(self.lab)
        detail = f" ({why})" if why else ""
        super().__init__(f"implement Lab {self.lab}'s `{name}` ({where}) to light this calculator{detail}")


def _number(lab: str) -> str:
    """ "01" from "lab-01", "01", "1" or 1."""
    text = str(lab).removeprefix("lab-")[:2].rstrip("-")
    return f"{int(text):02d}"


def _where(number: str) -> str:
    """Where Lab ``number``'s starter is, as the learner's tree names it (``labs/lab-01-alpha-beta/starter.py``)."""
    found = sorted(p.name for p in _LABS_DIR.glob(f"lab-{number}-*") if p.is_dir())
    return f"labs/{found[0]}/starter.py" if found else f"Lab {number}'s starter.py"


class Unavailable(Unlit):
    """A calculator needs a reference the release does not ship, and the lab's function cannot stand in for it."""

    def __init__(self, lab: str, name: str):
        NotImplementedError.__init__(
            self,
            f"this calculator runs on the course's reference for Lab {_number(lab)}'s `{name}` (its "
            f"signature differs from the lab's), which the student release does not ship: run it in the "
            f"course's public repository",
        )
        self.lab, self.name, self.why = _number(lab), name, "reference only"
