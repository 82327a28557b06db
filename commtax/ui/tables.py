"""The lessons' result tables and headlines: HTML a calculator's render displays.

A table inside a calculator's render also tells the calculator how wide it wants to be
(:data:`_result_width`), so a wide table wraps below the controls instead of being squeezed beside them.
"""

from __future__ import annotations

import contextvars
import html

from IPython.display import HTML

_CHAR_PX, _CELL_PAD_PX, _CELL_CHARS = 7.5, 20, 28  # ~13-px sans-serif; td padding 2 x 10 px; a cell wraps past 28 chars
_result_width = contextvars.ContextVar("commtax_result_width", default=None)  # [px] of the render under way


def readable(value) -> str:
    """A table cell for a learner: bools as yes/no, the rest as str."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


def result_table(
    header: list[str], rows: list[list], highlight: int | None = None, css_class: str = "commtax-result"
) -> HTML:
    """An HTML table; row ``highlight`` (an index) is bold on a yellow background."""
    cell = "text-align:left;padding:2px 10px;vertical-align:top"  # headers and cells aligned alike
    widths = _result_width.get()
    if widths is not None:  # inside a calculator's render: tell it how wide this table wants to be
        widths.append(table_width_px(header, rows))
    head = "".join(f"<th style='{cell}'>{html.escape(readable(h))}</th>" for h in header)
    body = []
    for i, row in enumerate(rows):
        style = " style='background:#fff3b0;font-weight:bold'" if i == highlight else ""
        # a long cell (a "why" column) keeps a readable width where the table must scroll (a phone, the book's
        # column), instead of one word per line
        cells = "".join(
            f"<td style='{cell}{_LONG if len(readable(c)) > _CELL_CHARS else ''}'>{_unbroken(readable(c))}</td>"
            for c in row
        )
        body.append(f"<tr{style}>{cells}</tr>")
    return HTML(f"<table class='{css_class}'><tr>{head}</tr>{''.join(body)}</table>")


_LONG = ";min-width:14em"  # 14 em of 13-px text: about _CELL_CHARS characters a line
_UNBROKEN_CHARS = 12  # a cell this short ("7.000 n", "1.23 ms", "6.93 / s") never wraps between number and unit


def _unbroken(text: str) -> str:
    """A cell's HTML: a short one held on one line (a narrow phone column split "7.000" from its "n")."""
    if " " in text and len(text) <= _UNBROKEN_CHARS:
        return f"<span style='white-space:nowrap'>{html.escape(text)}</span>"
    return html.escape(text)


def table_width_px(header: list[str], rows: list[list]) -> float:
    """The width [px] at which a result table reads without squeezing: per column, its longest cell
    (at most _CELL_CHARS characters, past which a cell may wrap) or its header's longest word."""
    total = 0.0
    for j, title in enumerate(header):
        cells = [len(readable(row[j])) for row in rows if j < len(row)]
        words = [len(word) for word in readable(title).split()] or [0]
        total += _CHAR_PX * max(min(max(cells, default=0), _CELL_CHARS), max(words)) + _CELL_PAD_PX
    return total


def headline(text: str, css_class: str = "commtax-headline") -> HTML:
    """One line of result, bold, with a class the browser test can find."""
    return HTML(f"<p class='{css_class}'><b>{html.escape(text)}</b></p>")
