"""Where the course keeps measured links: Lab 03's ``calibrations/`` folder, or ``$COMMTAX_CALIBRATIONS``.

The library (:func:`commtax.formulas.links.measured_links`) reads the folder it is given and knows no
course folder; the lessons and their calculators give it this one, where Lab 03's benchmark writes
(``--out labs/lab-03-measure-the-wire/calibrations/NAME.json``). Set the environment variable
``COMMTAX_CALIBRATIONS`` to a folder to list the links measured there instead.
"""

from __future__ import annotations

import os
from pathlib import Path

#: Lab 03's folder of measured links in the course's checkout (ignored by git).
LAB_03_CALIBRATIONS = Path(__file__).resolve().parents[2] / "labs" / "lab-03-measure-the-wire" / "calibrations"


def calibration_folder() -> Path:
    """``$COMMTAX_CALIBRATIONS`` when set (and not empty), else Lab 03's ``calibrations/``."""
    return Path(os.environ.get("COMMTAX_CALIBRATIONS") or LAB_03_CALIBRATIONS)
