"""Read a Chrome-trace JSON file (PyTorch profiler / Kineto) event by event, in bounded memory.

A profiler trace of a long run is gigabytes of one JSON object, ``{"schemaVersion": 1,
"distributedInfo": {...}, "traceEvents": [{...}, {...}, ...], ...}``. :class:`TraceReader` never
holds the file: it reads text in chunks (``open`` or ``gzip.open``) into a sliding buffer and
decodes one value at a time with :meth:`json.JSONDecoder.raw_decode`, yielding the elements of
``traceEvents`` as they are decoded and keeping the other top-level values (small: the rank's
``distributedInfo``, ``deviceProperties``, ...) in :attr:`TraceReader.meta`. Memory is the chunk
plus the largest single event. The bare-array form of the Chrome format (``[{...}, ...]``) is read
too.

Errors are :class:`TraceError`, one line each, saying what is wrong with which file.
"""

from __future__ import annotations

import gzip
import json
import os
import zlib

CHUNK_CHARS = 1 << 20  # characters read per refill
MAX_VALUE_CHARS = 64 << 20  # one event (or metadata value) larger than this is taken as malformed
_WHITESPACE = " \t\n\r"


class TraceError(Exception):
    """A trace that cannot be read or used; the message is one line, naming the file."""


class TraceReader:
    """Stream the events of one trace file.

    ``for event in TraceReader(path).events(): ...`` yields each element of ``traceEvents`` (a dict);
    once the loop ends, :attr:`meta` holds every other top-level key of the file (values decoded
    whole). ``chunk_chars`` sets the refill size, in characters (tests use tiny ones).
    """

    def __init__(self, path, chunk_chars: int = CHUNK_CHARS):
        if not isinstance(chunk_chars, int) or chunk_chars < 1:
            raise ValueError(f"chunk_chars must be an integer >= 1, got {chunk_chars!r}")
        self.path = os.fspath(path)
        self.chunk_chars = chunk_chars
        self.meta: dict = {}
        self.event_count = 0
        self._decoder = json.JSONDecoder()
        self._buf = ""
        self._pos = 0
        self._eof = False
        self._file = None

    # -- the buffer ---------------------------------------------------------

    def _open(self):
        if not os.path.exists(self.path):
            raise TraceError(f"{self.path}: no such file")
        if os.path.isdir(self.path):
            raise TraceError(f"{self.path}: is a folder, not a trace file")
        with open(self.path, "rb") as probe:
            gzipped = probe.read(2) == b"\x1f\x8b"
        opener = gzip.open if gzipped else open
        return opener(self.path, "rt", encoding="utf-8", errors="strict")

    def _fill(self) -> bool:
        """Read one more chunk (dropping what was consumed); False at the end of the file."""
        if self._eof:
            return False
        try:
            chunk = self._file.read(self.chunk_chars)
        except (OSError, EOFError, zlib.error) as exc:  # a cut or corrupt .gz
            raise TraceError(f"{self.path}: cannot read ({exc}); is the file complete?") from None
        except UnicodeDecodeError:
            raise TraceError(f"{self.path}: not a trace (not UTF-8 text)") from None
        if not chunk:
            self._eof = True
            return False
        self._buf = self._buf[self._pos :] + chunk
        self._pos = 0
        return True

    def _skip_ws(self) -> str:
        """Skip whitespace; return the next character ('' at the end of the file)."""
        while True:
            buf, pos = self._buf, self._pos
            while pos < len(buf) and buf[pos] in _WHITESPACE:
                pos += 1
            self._pos = pos
            if pos < len(buf):
                return buf[pos]
            if not self._fill():
                return ""

    def _expect(self, chars: str, where: str) -> str:
        c = self._skip_ws()
        if c == "":
            raise TraceError(f"{self.path}: truncated JSON (the file ends {where}); was it written completely?")
        if c not in chars:
            raise TraceError(
                f"{self.path}: malformed JSON {where}: expected {' or '.join(map(repr, chars))}, found {c!r}"
            )
        self._pos += 1
        return c

    def _value(self, where: str):
        """Decode the next JSON value, reading more until it is complete (and known to end)."""
        self._skip_ws()
        while True:
            try:
                value, end = self._decoder.raw_decode(self._buf, self._pos)
            except json.JSONDecodeError as exc:
                if len(self._buf) - self._pos > MAX_VALUE_CHARS:
                    raise TraceError(f"{self.path}: malformed JSON {where} ({exc.msg})") from None
                if not self._fill():  # the whole rest of the file is in the buffer: cut short, or bad?
                    rest = self._buf[self._pos :].strip()
                    if not rest or exc.pos >= len(self._buf.rstrip()) or exc.msg.startswith("Unterminated"):
                        raise TraceError(
                            f"{self.path}: truncated JSON (the file ends inside {where}); was it written completely?"
                        ) from None
                    raise TraceError(f"{self.path}: malformed JSON {where} ({exc.msg})") from None
                continue
            # A number (or true/false/null) at the buffer's end may continue in the next chunk.
            if end >= len(self._buf) and not isinstance(value, (dict, list, str)) and self._fill():
                continue
            self._pos = end
            return value

    # -- the document -------------------------------------------------------

    def events(self):
        """Yield the trace's events (dicts) in file order; fills :attr:`meta` along the way."""
        self._file = self._open()
        try:
            first = self._skip_ws()
            if first == "":
                raise TraceError(f"{self.path}: empty file, not a trace")
            if first == "[":
                self._pos += 1
                yield from self._array("traceEvents")
            elif first == "{":
                self._pos += 1
                found = False
                if self._skip_ws() == "}":
                    self._pos += 1
                else:
                    while True:
                        key = self._value("a top-level key")
                        if not isinstance(key, str):
                            raise TraceError(f"{self.path}: not a trace (a top-level key is not a string)")
                        self._expect(":", f"after the top-level key {key!r}")
                        if key == "traceEvents":
                            self._expect("[", "at traceEvents")
                            found = True
                            yield from self._array("traceEvents")
                        else:
                            self.meta[key] = self._value(f"the top-level value {key!r}")
                        if self._expect(",}", "after a top-level value") == "}":
                            break
                if not found:
                    raise TraceError(
                        f"{self.path}: not a trace (no traceEvents array; "
                        "expected torch.profiler's export_chrome_trace output)"
                    )
            else:
                raise TraceError(f"{self.path}: not a trace (JSON object or array expected, found {first!r} first)")
            if self._skip_ws() != "":
                raise TraceError(f"{self.path}: malformed JSON (text after the end of the trace)")
        finally:
            self._file.close()

    def _array(self, name: str):
        if self._skip_ws() == "]":
            self._pos += 1
            return
        while True:
            event = self._value(f"the {name} array")
            if not isinstance(event, dict):
                raise TraceError(
                    f"{self.path}: not a trace (an element of {name} is a {type(event).__name__}, not an event object)"
                )
            self.event_count += 1
            yield event
            if self._expect(",]", f"in the {name} array") == "]":
                return
