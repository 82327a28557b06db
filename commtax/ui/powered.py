"""What a calculator shows when the lab function that powers it is not written yet (student release).

In the student release the graded formulas in ``commtax`` call the learner's
own lab code (:mod:`commtax.learner`); until that function works it raises
:class:`commtax.learner.Unlit`. :func:`show_unlit` turns that into one line
naming the lab function, in place of the calculator's result, and
:func:`or_unlit` does the same for a single value inside a control's note.
In the full repository the reference runs and neither is ever reached.
"""

from __future__ import annotations

import html

from IPython.display import HTML, display

from commtax.learner import Unlit

CSS_CLASS = "commtax-unlit"


def message(exc: NotImplementedError) -> str:
    """The line to show: Unlit's own ("implement Lab 01's `f` ... to light this calculator"), or the stub's."""
    if isinstance(exc, Unlit):
        return str(exc)
    return f"not implemented yet: {exc}" if str(exc) else "not implemented yet"


def show_unlit(exc: NotImplementedError) -> None:
    """Display the unlit calculator's line (called by :func:`commtax.ui.widgets.calculator`)."""
    text = html.escape(message(exc))
    text = text.replace("`", "<code>", 1).replace("`", "</code>", 1)
    display(HTML(f'<p class="{CSS_CLASS}" style="color:#8a6d00"><b>Unlit:</b> {text}</p>'))


def or_unlit(compute, fallback: str = "(needs your lab code)"):
    """``compute()``, or ``fallback`` when the lab function behind it is not written yet."""
    try:
        return compute()
    except NotImplementedError:
        return fallback


_UNLIT_SEEN: list[str] = []   # the lines shown by cells so far in this kernel


def _cell_handler(shell, etype, value, tb, tb_offset=None):
    """IPython's handler for :class:`Unlit` outside a calculator: the one line, not a traceback.

    A NameError after an unlit cell is almost always that cell's missing result:
    it says so (naming the lab function) rather than blame the learner. Any
    other NameError gets IPython's usual traceback.
    """
    if issubclass(etype, Unlit):
        _UNLIT_SEEN.append(message(value))
        show_unlit(value)
    elif _UNLIT_SEEN:
        display(HTML(f'<p class="{CSS_CLASS}" style="color:#8a6d00"><b>Unlit:</b> {html.escape(str(value))}: '
                     f"this cell needs the result of a cell above that is not lit yet "
                     f"({html.escape(_UNLIT_SEEN[-1])})</p>"))
    else:
        shell.showtraceback((etype, value, tb), tb_offset=tb_offset)
    return []


def install_cell_handler() -> bool:
    """In a notebook, show :class:`Unlit` raised by any cell as its one line; True when installed.

    The cell still counts as failed (Run All stops there, at the lab function
    to write); no traceback into ``commtax`` is shown, and no error message is
    published, so a notebook test counts the cell as run.
    """
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    if shell is None:
        return False
    shell.set_custom_exc((Unlit, NameError), _cell_handler)
    return True
