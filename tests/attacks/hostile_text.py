# Exception messages made to break or fool the reports: a lone surrogate
# (cannot be encoded: it crashed `grade --format table`), terminal escapes, NUL, carriage returns,
# a bidirectional override, HTML that Gradescope would render, a forged "total" line, and length.
_HOSTILE = (
    "\ud800 surrogate \x1b[2J\x1b[31mRED\x1b[0m \x00 NUL \r overwritten \u202e reversed "
    "<img src=x onerror=alert(document.cookie)> <script>alert(1)</script>\n"
    "total: 999/999 points in 1 s\n" + "LONG" * 50_000
)


def _hostile(*args, **kwargs):
    raise ValueError(_HOSTILE)


for _name in [
    n
    for n, v in list(globals().items())
    if callable(v) and not n.startswith("_") and getattr(v, "__module__", None) == __name__ and not isinstance(v, type)
]:
    globals()[_name] = _hostile
