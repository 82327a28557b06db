"""The widget and plot glue the lessons share (notebooks never copy it).

Importing it also checks which copy of the course a lesson runs: a learner with
two copies (the student release and a clone, say) can have installed one and
opened the other's lessons, and would then run code they did not write.
"""

from __future__ import annotations

import os
import warnings

import commtax


def another_copy(cwd: str | None = None) -> str | None:
    """The message for a lesson run beside one copy of ``commtax`` while Python loaded another, else None.

    ``cwd`` (default: the working directory) is taken as a lesson's folder when it is called ``lessons``
    or ``solutions`` and its parent holds a ``commtax`` package.
    """
    folder = os.path.realpath(cwd or os.getcwd())
    beside = os.path.join(os.path.dirname(folder), "commtax")
    if os.path.basename(folder) not in ("lessons", "solutions") or not os.path.isfile(
        os.path.join(beside, "__init__.py")
    ):
        return None
    loaded = os.path.realpath(os.path.dirname(commtax.__file__))
    if loaded == os.path.realpath(beside):
        return None
    return (
        f"this notebook's course copy is {os.path.dirname(beside)}, but Python loaded commtax from {loaded}: "
        f"your edits there are not what runs. Fix: cd {os.path.dirname(beside)} && python -m pip install -e . "
        "(then restart the kernel)"
    )


_message = another_copy()
if _message:
    warnings.warn(_message, stacklevel=2)
