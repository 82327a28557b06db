"""Learner text made safe to show: in a terminal, in results.json, in Gradescope and Classroom.

A failure message can quote the learner's exception message, which the
learner controls entirely: a lone surrogate (which cannot be encoded and
crashed ``grade --format table``), terminal escapes, NUL, carriage returns
that overwrite a line, bidirectional overrides that reorder it, HTML, or
pages of text. :func:`clean` keeps printable text, newlines and tabs, and
caps the length; the reports also declare their text as plain text
(Gradescope's ``output_format``), so HTML is shown, never rendered.
"""

from __future__ import annotations

import re
import unicodedata

MESSAGE_LIMIT = 1500  # characters of one message shown
LINE_LIMIT = 40  # lines of one message shown

_ESCAPES = re.compile(r"\x1b(\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(\x07|\x1b\\)?|[@-Z\\-_])")
_BIDI = {chr(c) for c in (*range(0x202A, 0x202F), *range(0x2066, 0x206A), 0x200E, 0x200F, 0x061C)}


def _shown(ch: str) -> str:
    if ch in "\n\t":
        return ch
    if ch in "\r\x0b\x0c\u2028\u2029\x85":
        return "\n"
    if ch in _BIDI or unicodedata.category(ch) in ("Cc", "Cs", "Co", "Cn"):
        return "\ufffd" if unicodedata.category(ch) in ("Cs", "Co", "Cn") else ""
    return ch


def clean(text, limit: int = MESSAGE_LIMIT, lines: int = LINE_LIMIT) -> str:
    """``text`` with only printable characters, newlines and tabs; at most ``limit`` characters and
    ``lines`` lines (what is cut is counted at the end)."""
    text = text if isinstance(text, str) else str(text)
    text = text.encode("utf-8", "surrogatepass").decode("utf-8", "replace")  # lone surrogates -> U+FFFD
    text = "".join(_shown(ch) for ch in _ESCAPES.sub("", text.replace("\r\n", "\n")))
    kept = text.split("\n")
    if len(kept) > lines:
        text = "\n".join(kept[:lines]) + f"\n[{len(kept) - lines} more lines not shown]"
    if len(text) > limit:
        text = text[:limit] + f" [{len(text) - limit} more characters not shown]"
    return text


def one_line(text: str, width: int) -> str:
    """The first line of ``text`` in at most ``width`` characters, cut at a word boundary with an
    ellipsis when it is longer (a table cell: "... Failed: all_r" reads as a word that is not there)."""
    line = text.strip().split("\n", 1)[0].strip()
    if len(line) <= width:
        return line
    cut = line[: width - 1]
    space = cut.rfind(" ")
    if space >= width // 2:  # a word boundary not too far back; else cut inside a very long word
        cut = cut[:space]
    return cut.rstrip(" ,;:-(") + "\u2026"
