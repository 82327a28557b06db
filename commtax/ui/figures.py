"""Show a figure built as an explicit ``matplotlib.figure.Figure`` (no pyplot state).

A calculator's callback may run while JupyterLab syncs a widget on another
thread; pyplot's global "current figure" and the inline backend's flush on
``plt.show()`` can then draw half a figure, or none (issue 20). A ``Figure``
made with ``Figure(figsize=...)`` belongs to no global state: render it to
PNG here and display the image.
"""

from __future__ import annotations

import io

from IPython.display import Image, display


def png(fig, dpi: int = 100) -> bytes:
    """The figure as PNG bytes, at ``dpi`` dots per inch, trimmed to what is drawn."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi, bbox_inches="tight", facecolor="white")
    return buffer.getvalue()


def show(fig, dpi: int = 100) -> None:
    """Display ``fig`` (a ``matplotlib.figure.Figure``) as a PNG image in the notebook."""
    display(Image(data=png(fig, dpi), format="png"))
