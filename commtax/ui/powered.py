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
import re
import traceback

from IPython.display import HTML, display

from commtax.unlit import Unlit

CSS_CLASS = "commtax-unlit"


_STARTER = re.compile(r"labs/lab-(\d\d)-[^/]+/starter\.py$")


def _from_starter(frames) -> Unlit | None:
    """Unlit for the innermost frame in a lab's starter.py ([file, line, function] innermost first)."""
    for file, _line, function in frames:
        found = _STARTER.search(str(file).replace("\\", "/"))
        if found:
            return Unlit(found.group(1), function, "not implemented yet")
    return None


def unlit_of(error):
    """The :class:`Unlit` behind ``error``, or None: ``error`` itself; a stub of a lab's starter.py that
    raised NotImplementedError (a demo that loads the lab's module itself); or what a rank raised (a
    lesson's demo on real ranks: the launcher's DistributedRunError, whose first failing rank raised
    Unlit, or NotImplementedError in a starter.py)."""
    if isinstance(error, Unlit):
        return error
    if isinstance(error, NotImplementedError):
        frames = [[f.filename, f.lineno, f.name] for f in traceback.extract_tb(error.__traceback__)][::-1]
        return _from_starter(frames)
    failures = getattr(error, "failures", None)
    if type(error).__name__ == "DistributedRunError" and failures:
        first = failures[0]
        kind = getattr(first, "exception_type", "")
        if kind in ("Unlit", "Unavailable"):
            return _RankUnlit(str(getattr(first, "summary", "")).split(": ", 1)[-1])
        if kind == "NotImplementedError":
            return _from_starter(getattr(first, "frames", None) or [])
    return None


class _RankUnlit(Unlit):
    """A rank's Unlit, seen in the notebook's process (its line as the rank said it)."""

    def __init__(self, text: str):
        NotImplementedError.__init__(self, text)
        self.lab, self.name, self.why = "", "", text


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


_UNLIT_SEEN: list[str] = []  # the lines shown by cells so far in this kernel


def _cell_handler(shell, etype, value, tb, tb_offset=None):
    """IPython's handler for :class:`Unlit` outside a calculator: the one line, not a traceback.

    A NameError after an unlit cell is almost always that cell's missing result:
    it says so (naming the lab function) rather than blame the learner. Any
    other NameError gets IPython's usual traceback.
    """
    unlit = unlit_of(value)
    if unlit is not None:
        _UNLIT_SEEN.append(message(unlit))
        show_unlit(unlit)
    elif issubclass(etype, NameError) and _UNLIT_SEEN:
        display(
            HTML(
                f'<p class="{CSS_CLASS}" style="color:#8a6d00"><b>Unlit:</b> {html.escape(str(value))}: '
                f"this cell needs the result of a cell above that is not lit yet "
                f"({html.escape(_UNLIT_SEEN[-1])})</p>"
            )
        )
    else:
        shell.showtraceback((etype, value, tb), tb_offset=tb_offset)
    return []


def _unlit_only(error) -> bool:
    """Whether a cell's error is only a lab function not written yet: Unlit itself, or a NameError for
    a result an unlit cell above did not make (what :func:`_cell_handler` shows as one line)."""
    return unlit_of(error) is not None or (isinstance(error, NameError) and bool(_UNLIT_SEEN))


def _let_run_all_go_on(result) -> None:
    """IPython's ``post_run_cell`` hook: a cell whose only error is an unlit lab function succeeds.

    Its line is shown (the calculator's "implement Lab NN's `f` ..." note); the kernel then replies "ok",
    so Run All, nbclient and nbval go on to the next cell instead of stopping at the first calculator
    that needs a lab function the learner has not written yet. Any other error still stops Run All.
    """
    if result is not None and result.error_before_exec is None and _unlit_only(result.error_in_exec):
        result.error_in_exec = None


def install_cell_handler() -> bool:
    """In a notebook, show :class:`Unlit` raised by any cell as its one line; True when installed.

    The cell then counts as run (:func:`_let_run_all_go_on`): Run All goes on to the next cell, the
    lab function to write named where its calculator would be; no traceback into ``commtax`` is shown.
    """
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    if shell is None:
        return False
    # NotImplementedError: Unlit, or a starter's stub; AssertionError: the launcher's DistributedRunError (a
    # rank's); any other of these gets its usual traceback.
    shell.set_custom_exc((NotImplementedError, NameError, AssertionError), _cell_handler)
    try:
        shell.events.unregister("post_run_cell", _let_run_all_go_on)
    except ValueError:
        pass  # not registered yet
    shell.events.register("post_run_cell", _let_run_all_go_on)
    return True


# In a notebook, from the moment the lessons' widgets load (commtax.ui.widgets imports this module): the first
# cell to need a lab function may run it on real ranks, where the notebook's own process never calls
# commtax.learner (which also installs it). Outside IPython this does nothing.
install_cell_handler()
