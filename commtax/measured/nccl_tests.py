"""Read the stdout of NVIDIA nccl-tests (``all_reduce_perf`` and friends) and fit a link to it.

nccl-tests prints one row per message size::

    #       size    count   type  redop  root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
    #        (B) (elements)                        (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
        33554432  8388608  float    sum    -1    686.5   48.88   85.54      0    686.6   48.87   85.52      0

The size S is bytes, the time t is **microseconds** (the mean over the timed iterations), and both
bandwidths are **GB/s = 1e9 bytes/s**. Each row has an out-of-place block (separate send and
receive buffers) and an in-place block; this module reads the **out-of-place** block unless asked
for the in-place one.

Algorithm and bus bandwidth (nccl-tests' ``doc/PERFORMANCE.md``). ``algbw = S / t``: how fast the
collective moved the buffer the user sees. That number depends on the collective and the rank count
n, so nccl-tests also prints ``busbw = algbw x factor``, the rate at which each rank's own link
carried bytes in a bandwidth-optimal algorithm, comparable with the link's bandwidth per GPU per
direction whatever the collective:

=================  =================================================  ==============
collective         S, as nccl-tests prints it                         busbw factor
=================  =================================================  ==============
all_reduce         the buffer each rank holds                         2(n-1)/n
all_gather         the full buffer after gathering (n pieces)         (n-1)/n
reduce_scatter     the full buffer before scattering (n pieces)       (n-1)/n
alltoall           the total a rank sends (n pieces, one stays home)  (n-1)/n
sendrecv           the buffer each rank sends to its peer             1
broadcast, reduce  the buffer                                         1
=================  =================================================  ==============

Every row is **checked**: the printed algbw must equal S / t and the printed busbw must equal
algbw x factor, each within the rounding of the printed digits. A log whose columns were misread,
or a rank count that is wrong (the factor depends on n), fails that check with the line named.

The fit is Lab 03's, from :func:`commtax.ranks.measure.fit_alpha_beta` (one source per formula):
the ring model t = k alpha + m S / B of each collective (all_reduce k = 2(n-1), m = 2(n-1)/n;
all_gather, reduce_scatter, alltoall k = n-1, m = (n-1)/n; broadcast, reduce k = n-1, m = 1;
sendrecv one message, k = 1, m = 1, which is the broadcast model at n = 2), fitted by least
squares on the *relative* error of each row so a 1 kB row counts as much as a 1 GB one, with
alpha clamped at 0. m is the busbw factor, so the fitted B is the busbw asymptote: bytes per
second per GPU per direction. Rows of size 0 are kept in the table but left out of the fit.

The rank count n comes, in order, from ``--ranks``; the ``#  Rank  k ...`` lines (the largest k
plus one); an ``NCCL INFO ... nranks N`` line; or the ``nThread x nGpus`` of the header (or the
``-t``/``-g`` of the command line) times the process count of an ``mpirun -np P`` / ``srun -n P``
(``-N a --ntasks-per-node b``) command line found in the log (a bare ``*_perf`` command with no
launcher is one process). Otherwise it is unknown and the caller must give ``--ranks``.

Tolerated: ``srun -l`` prefixes (``0: ``) and ``mpirun --tag-output`` prefixes (``[1,0]<stdout>:``)
on every line, indentation, ``NCCL INFO``/``WARN`` and other lines anywhere (inside the table too),
old layouts without the ``root`` column, an empty ``redop`` column, ``error`` or ``#wrong`` columns,
``N/A`` errors, the ``# Avg bus bandwidth`` footer. Anything else raises :class:`NcclTestsError`
with one line naming the file and line.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from commtax.ranks.measure import fit_alpha_beta, ring_model

#: nccl-tests' program stem -> (the course's collective name for the ring model, world size to use).
COLLECTIVES = {
    "all_reduce": "all_reduce",
    "all_gather": "all_gather",
    "reduce_scatter": "reduce_scatter",
    "alltoall": "all_to_all",
    "sendrecv": "sendrecv",
    "broadcast": "broadcast",
    "reduce": "reduce",
}
GB = 1e9  # nccl-tests' GB/s

_PREFIX = re.compile(r"^\s*(?:\d+:\s|\[\d+,\d+\]<std(?:out|err)>:)")
_PROGRAM = re.compile(
    r"(?<![\w.-])(all_reduce|all_gather|reduce_scatter|alltoall|sendrecv|broadcast|reduce"
    r"|gather|scatter|hypercube)_perf\w*"
)
_RANK_LINE = re.compile(r"^#\s*Rank\s+(\d+)\s")
_NRANKS = re.compile(r"\bnranks\s+(\d+)")
_THREADS_GPUS = re.compile(r"nThread\s+(\d+)\s+nGpus\s+(\d+)")
_AVG = re.compile(r"^#\s*Avg bus bandwidth\s*:\s*([0-9.eE+-]+)")
_LAUNCHER = re.compile(r"(?:^|[\s/$])(mpirun|mpiexec|srun)\s")
_ROW_START = re.compile(r"^\d+(?:\s|$)")
_OPTIONS_ONLY = re.compile(r"^(\s+-\S.*)?$")


class NcclTestsError(Exception):
    """A log that cannot be read or fitted; the message is one line naming the file (and line)."""


@dataclass
class Row:
    """One size of a log: bytes, seconds, bytes/s (as printed, converted to SI)."""

    size_bytes: int
    time_s: float
    algbw_Bps: float
    busbw_Bps: float
    line: int

    def as_dict(self) -> dict:
        return {
            "size_bytes": self.size_bytes,
            "time_s": self.time_s,
            "algbw_Bps": self.algbw_Bps,
            "busbw_Bps": self.busbw_Bps,
        }


@dataclass
class Log:
    """A parsed nccl-tests log: ``collective`` is nccl-tests' name (``alltoall``, not ``all_to_all``)."""

    file: str
    collective: str
    ranks: int
    rows: list = field(default_factory=list)
    columns: str = "out-of-place"
    dtype: str = ""
    avg_busbw_Bps: float | None = None
    ranks_from: str = ""


def busbw_factor(collective: str, ranks: int) -> float:
    """nccl-tests' busbw / algbw for ``collective`` (its own name) on ``ranks`` ranks (table above)."""
    if collective == "sendrecv":
        return 1.0
    return ring_model(COLLECTIVES[collective], ranks)[1]


def model_args(collective: str, ranks: int) -> tuple[str, int]:
    """(collective, world_size) to hand Lab 03's fit: sendrecv is one message, the broadcast model at n = 2."""
    if collective == "sendrecv":
        return "broadcast", 2
    return COLLECTIVES[collective], ranks


def fit_rows(log: Log, min_size: int = 0) -> list:
    """The rows the fit uses: size > 0 and size >= ``min_size`` bytes."""
    return [r for r in log.rows if r.size_bytes > 0 and r.size_bytes >= min_size]


def fit_link(log: Log, min_size: int = 0) -> tuple[float, float]:
    """(alpha seconds, bandwidth bytes/s per GPU per direction) fitted to :func:`fit_rows` (module docstring)."""
    rows = fit_rows(log, min_size)
    if len({r.size_bytes for r in rows}) < 2:
        where = f" of at least {min_size} bytes" if min_size > 0 else ""
        raise NcclTestsError(
            f"{log.file}: needs rows of at least two different non-zero sizes{where} to fit "
            f"alpha and bandwidth, found {len({r.size_bytes for r in rows})}"
        )
    if log.ranks < 2:
        raise NcclTestsError(f"{log.file}: {log.ranks} rank: one rank sends nothing, there is no link to fit")
    collective, world = model_args(log.collective, log.ranks)
    try:
        return fit_alpha_beta([r.size_bytes for r in rows], [r.time_s for r in rows], world, collective)
    except ValueError as exc:
        raise NcclTestsError(f"{log.file}: cannot fit the link: {exc}") from None
    except NotImplementedError as exc:  # the student release: Lab 03's fit_alpha_beta not written yet
        raise NcclTestsError(f"{log.file}: {exc}") from None


def _half_unit(token: str) -> float:
    """Half the last printed digit of a number: the rounding a printed value can hide."""
    mantissa = token.lower().split("e")[0]
    decimals = len(mantissa.partition(".")[2])
    scale = 10.0 ** int(token.lower().split("e")[1]) if "e" in token.lower() else 1.0
    return 0.5 * 10.0**-decimals * scale


def _header_columns(text: str):
    """The column names of a table header line (``# size count type ... time algbw busbw ...``), or None."""
    if not text.startswith("#"):
        return None
    names = text.lstrip("#").split()
    if len(names) < 6 or names[0] != "size" or "count" not in names[:3]:
        return None
    if names.count("time") < 1 or "algbw" not in names or "busbw" not in names:
        return None
    return names


def _block(names: list[str], which: str):
    """(lead columns, offset of the chosen block's time, algbw, busbw from the row's end, block width)."""
    starts = [i for i, name in enumerate(names) if name == "time"]
    lead = starts[0]
    width = (starts[1] - starts[0]) if len(starts) > 1 else len(names) - starts[0]
    blocks = names[lead:]
    total = len(blocks)
    first = 0 if which == "out-of-place" or len(starts) < 2 else width
    block = blocks[first : first + width]
    try:
        offsets = {key: total - (first + block.index(key)) for key in ("time", "algbw", "busbw")}
    except ValueError:
        return None
    return lead, offsets, total


def parse_log(path, *, ranks: int | None = None, collective: str | None = None, columns: str = "out-of-place") -> Log:
    """Read one nccl-tests log file into a :class:`Log` (rows in bytes, seconds, bytes/s).

    ``ranks`` (GPUs in the run) and ``collective`` (nccl-tests' name, e.g. ``alltoall``) override what
    the log says; ``columns`` picks the ``"out-of-place"`` (default) or ``"in-place"`` block. Every row
    is checked (module docstring). Raises :class:`NcclTestsError`, one line naming the file (and
    line), for a log it cannot read; ValueError naming ``columns`` for a bad ``columns``.
    """
    path = Path(path)
    name = str(path)
    if columns not in ("out-of-place", "in-place"):
        raise ValueError(f"columns must be 'out-of-place' or 'in-place', got {columns!r}")
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise NcclTestsError(f"{name}: no such file") from None
    except OSError as exc:
        raise NcclTestsError(f"{name}: cannot read it ({exc.strerror or exc})") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise NcclTestsError(f"{name}: not a text file (not UTF-8); give the stdout of an nccl-tests program") from None
    lines = text.splitlines()
    if not any(line.strip() for line in lines):
        raise NcclTestsError(
            f"{name}: the file is empty; give the stdout of an nccl-tests program such as all_reduce_perf"
        )
    if _is_json(text):
        raise NcclTestsError(
            f"{name}: this looks like JSON, not nccl-tests output (to load a calibration "
            "file, use commtax.formulas.links.load_calibration)"
        )

    rank_ids, nranks, threads_gpus, programs, commands = set(), set(), None, {}, []
    layout, header_line, rows, avg, dtype, stray = None, None, [], None, "", None
    for number, original in enumerate(lines, start=1):
        line = _PREFIX.sub("", original, count=1).strip()
        if not line:
            continue
        for match in _PROGRAM.finditer(line):
            programs.setdefault(match.group(1), number)
        if m := _RANK_LINE.match(line):
            rank_ids.add(int(m.group(1)))
            continue
        if m := _THREADS_GPUS.search(line):
            threads_gpus = (int(m.group(1)), int(m.group(2)))
        if "NCCL INFO" in line and (m := _NRANKS.search(line)):
            nranks.add(int(m.group(1)))
        if not line.startswith("#") and "NCCL INFO" not in line and (found := _command_ranks(line)):
            commands.append(found)
        if m := _AVG.match(line):
            avg = float(m.group(1)) * GB
            continue
        names = _header_columns(line)
        if names is not None:
            found = _block(names, columns)
            if found is None:
                raise NcclTestsError(
                    f"{name}:{number}: unknown table layout: the {columns} block has no "
                    f"time, algbw and busbw columns: {line[:100]!r}"
                )
            layout, header_line = (names, found), number
            continue
        if not _ROW_START.match(line):
            continue
        if layout is None:
            stray = stray or (number, line)
            continue
        rows.append(_row(name, number, line, layout))
        dtype = dtype or line.split()[2]

    if layout is None:
        where = (
            f"{name}:{stray[0]}: unknown layout: a row of numbers ({stray[1][:60]!r}) with"
            if stray
            else f"{name}: unknown layout:"
        )
        raise NcclTestsError(
            f"{where} no nccl-tests table header ('#  size  count  type ... time  algbw  "
            "busbw ...') before it; is this the stdout of an nccl-tests program?"
        )
    if not rows:
        raise NcclTestsError(f"{name}:{header_line}: the table has a header but no rows (truncated log?)")
    coll = _collective(name, programs, collective)
    launch = next((c for c in commands if c[2]), commands[0] if commands else None)
    n, source = _ranks(name, ranks, rank_ids, nranks, threads_gpus, launch)
    log = Log(name, coll, n, [], columns, dtype, avg, source)
    factor = busbw_factor(coll, n)
    for size, time_tok, alg_tok, bus_tok, number in rows:
        log.rows.append(_checked(log, factor, size, time_tok, alg_tok, bus_tok, number))
    return log


def _is_json(text: str) -> bool:
    if not text.lstrip().startswith(("{", "[")):
        return False
    try:
        return isinstance(json.loads(text), (dict, list))
    except ValueError:
        return False


def _row(name, number, line, layout):
    names, (lead, offsets, total) = layout
    tokens = line.split()
    if len(tokens) < 3 + total or len(tokens) > lead + total:
        raise NcclTestsError(
            f"{name}:{number}: a table row with {len(tokens)} fields where the header "
            f"has {lead + total} (truncated or unknown layout): {line[:100]!r}"
        )
    try:
        size = int(tokens[0])
        int(tokens[1])
        values = [tokens[-offsets[key]] for key in ("time", "algbw", "busbw")]
        floats = [float(v) for v in values]
    except ValueError:
        raise NcclTestsError(
            f"{name}:{number}: cannot read this table row (a size, a count, then numbers "
            f"for time, algbw and busbw): {line[:100]!r}"
        ) from None
    if size < 0 or any(not math.isfinite(v) or v < 0 for v in floats) or floats[0] == 0:
        raise NcclTestsError(
            f"{name}:{number}: impossible values in this row (negative, zero time or not finite): {line[:100]!r}"
        )
    return size, values[0], values[1], values[2], number


def _checked(log, factor, size, time_tok, alg_tok, bus_tok, number) -> Row:
    """The row in SI units, after checking algbw = S / t and busbw = algbw x factor within rounding."""
    t_us, alg, bus = float(time_tok), float(alg_tok), float(bus_tok)
    expected = size / (t_us * 1e3)  # GB/s from bytes and microseconds
    slack = _half_unit(alg_tok) + expected * _half_unit(time_tok) / t_us + 1e-9
    if abs(alg - expected) > slack:
        raise NcclTestsError(
            f"{log.file}:{number}: algbw {alg_tok} GB/s is not size / time = {size} B / "
            f"{time_tok} us = {expected:.4g} GB/s: the columns were misread"
        )
    slack = _half_unit(bus_tok) + factor * _half_unit(alg_tok) + 1e-9
    if abs(bus - alg * factor) > slack:
        raise NcclTestsError(
            f"{log.file}:{number}: busbw {bus_tok} GB/s is not algbw {alg_tok} x {factor:.4g} "
            f"({log.collective} on {log.ranks} ranks); is the rank count right "
            f"(from {log.ranks_from})? give --ranks N"
        )
    return Row(size, t_us / 1e6, alg * GB, bus * GB, number)


def _collective(name, programs, given):
    if given is not None:
        if given not in COLLECTIVES:
            raise NcclTestsError(f"{name}: collective {given!r} is not one of {', '.join(COLLECTIVES)}")
        return given
    known = [p for p in programs if p in COLLECTIVES]
    others = [p for p in programs if p not in COLLECTIVES]
    if len(known) > 1:
        lines = ", ".join(f"{p}_perf (line {programs[p]})" for p in known)
        raise NcclTestsError(f"{name}: the log names several tests ({lines}); split it, one test per file")
    if known:
        return known[0]
    if others:
        raise NcclTestsError(
            f"{name}:{programs[others[0]]}: {others[0]}_perf is not supported "
            f"(supported: {', '.join(p + '_perf' for p in COLLECTIVES)})"
        )
    raise NcclTestsError(
        f"{name}: the log does not say which test ran (no '*_perf' name in it); give --collective NAME"
    )


def _flag(tokens, *names):
    for i, token in enumerate(tokens):
        for flag in names:
            if token == flag and i + 1 < len(tokens) and tokens[i + 1].isdigit():
                return int(tokens[i + 1])
            if flag.startswith("--") and token.startswith(flag + "=") and token[len(flag) + 1 :].isdigit():
                return int(token[len(flag) + 1 :])
            if len(flag) == 2 and token.startswith(flag) and token[2:].isdigit():
                return int(token[2:])
    return None


def _command_ranks(line):
    """(processes, threads x GPUs per process, launched?) from a command line running a ``*_perf`` program."""
    program = _PROGRAM.search(line)
    if program is None or not _OPTIONS_ONLY.match(line[program.end() :]):
        return None
    before, after = line[: program.start()].split(), line[program.end() :].split()
    per_process = (_flag(after, "-t", "--nthreads") or 1) * (_flag(after, "-g", "--ngpus") or 1)
    launcher = _LAUNCHER.search(" " + line[: program.start()])
    if launcher is None:
        return 1, per_process, False
    processes = _flag(before, "-np", "-n", "--np", "--ntasks")
    if processes is None:
        nodes, per_node = _flag(before, "-N", "--nodes"), _flag(before, "--ntasks-per-node", "-npernode", "--npernode")
        processes = nodes * per_node if nodes and per_node else None
    return (processes, per_process, True) if processes else None


def _ranks(name, given, rank_ids, nranks, threads_gpus, launch):
    if given is not None:
        if isinstance(given, bool) or not isinstance(given, int) or given < 1:
            raise NcclTestsError(f"{name}: --ranks must be an integer >= 1, got {given!r}")
        return given, "--ranks"
    if rank_ids:
        return max(rank_ids) + 1, "the '# Rank' lines"
    if len(nranks) == 1:
        return nranks.pop(), "the 'nranks' of an NCCL INFO line"
    if launch is not None:
        processes, per_process, _ = launch
        if threads_gpus is not None:
            per_process = threads_gpus[0] * threads_gpus[1]
        return processes * per_process, f"{processes} processes x {per_process} GPUs each (command line)"
    raise NcclTestsError(
        f"{name}: the rank count is unknown (no '# Rank' lines, no NCCL INFO 'nranks', no "
        "mpirun/srun command line); give --ranks N (GPUs in the run)"
    )
