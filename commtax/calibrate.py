"""Turn measurements into a link calibration: ``python3 -m commtax.calibrate nccl-tests LOG... [--json] [--out FILE]``.

``nccl-tests`` reads the stdout of NVIDIA nccl-tests (``all_reduce_perf``, ``all_gather_perf``,
``reduce_scatter_perf``, ``alltoall_perf``, ``sendrecv_perf``, ``broadcast_perf``, ``reduce_perf``)
and fits each log's alpha (seconds per message) and bandwidth (bytes/s per GPU per direction, the
busbw asymptote) with Lab 03's fit. How the log is read, what algbw and busbw mean for each
collective, the check of every row and the fit are in :mod:`commtax.measured.nccl_tests`.

Output:

* default: a short table per log (size, time, algbw, busbw, all from the out-of-place columns unless
  ``--in-place``), the fitted alpha and bandwidth, and the log's own ``# Avg bus bandwidth``;
* ``--json``: exactly ``{"logs": [{"file", "collective", "ranks", "rows": [{"size_bytes", "time_s",
  "algbw_Bps", "busbw_Bps"}, ...], "alpha_s", "bandwidth_Bps"}]}`` (SI units; ``collective`` is
  nccl-tests' name, e.g. ``alltoall``);
* ``--out FILE`` (one log): the calibration JSON Lab 03's ``measure.py`` writes, through
  :func:`commtax.formulas.links.save_calibration`, so ``load_calibration`` and every calculator read
  it. Keys: ``name``, ``alpha_s``, ``bandwidth_bytes_per_s``, ``source``, ``collective`` (the
  course's name, ``all_to_all`` for alltoall), ``world_size``, ``backend`` (``nccl``), ``dtype``,
  ``statistic``, ``sizes`` and ``seconds`` (the rows fitted), ``fit_error_median``, ``fit_error_max``,
  ``log_file``, ``columns``, ``fit_from_bytes``.

``--fit-from SIZE`` fits only the rows of at least SIZE bytes: NCCL changes algorithm and protocol
with the size, so one alpha-beta line through 8 B .. 128 MB bends (on the 8-GPU GH200 log in
``tests/data/nccl-tests`` the median row is off by 30%); from 8M up the same log fits within 3%.

A log that cannot be read gives one line on stderr naming the file (and line) and exit status 1;
bad arguments give argparse's usage and status 2. Never a traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from commtax.measured.nccl_tests import NcclTestsError, fit_link, fit_rows, model_args, parse_log
from commtax.units import format_bytes, format_rate, format_seconds, parse_bytes


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}")
    return value


def _size(text: str) -> int:
    try:
        return parse_bytes(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python3 -m commtax.calibrate", description="Fit a link (alpha, bandwidth) to measurements."
    )
    sub = parser.add_subparsers(dest="source", required=True, metavar="SOURCE")
    nccl = sub.add_parser(
        "nccl-tests",
        help="read nccl-tests stdout logs (all_reduce_perf, ...)",
        description="Read nccl-tests logs and fit alpha (s) and bandwidth (bytes/s per GPU "
        "per direction) to each, from the out-of-place columns by default.",
    )
    nccl.add_argument("logs", nargs="+", metavar="LOG", help="a file holding an nccl-tests program's stdout")
    nccl.add_argument("--json", action="store_true", help="print the parsed rows and fits as JSON")
    nccl.add_argument(
        "--out", type=Path, metavar="FILE", help="write the fitted link as a calibration file (one LOG only)"
    )
    nccl.add_argument("--name", help="the link's name in the calibration file (default from the log)")
    nccl.add_argument(
        "--ranks",
        type=_positive_int,
        metavar="N",
        help="GPUs in the run, when the log does not say (no '# Rank' lines)",
    )
    nccl.add_argument(
        "--collective",
        choices=("all_reduce", "all_gather", "reduce_scatter", "alltoall", "sendrecv", "broadcast", "reduce"),
        help="which test ran, when the log does not name its *_perf program",
    )
    nccl.add_argument("--in-place", action="store_true", help="read the in-place columns instead")
    nccl.add_argument(
        "--fit-from",
        type=_size,
        default=0,
        metavar="SIZE",
        help="fit only the rows of at least SIZE bytes (1K = 1024, as nccl-tests), e.g. to "
        "calibrate the bandwidth regime of large gradient buckets; default: every row > 0",
    )
    return parser


def _errors(log, alpha, bandwidth, min_size) -> np.ndarray:
    """|model - t| / t on each fitted row."""
    from commtax.ranks.measure import predict_time

    collective, world = model_args(log.collective, log.ranks)
    rows = fit_rows(log, min_size)
    times = np.array([r.time_s for r in rows])
    model = predict_time(np.array([float(r.size_bytes) for r in rows]), world, alpha, bandwidth, collective)
    return np.abs(model - times) / times


#: A fit worse than this on some row (relative error) bends through NCCL's protocol changes: say so.
BENT_FIT = 0.25


def _table(log, alpha, bandwidth, min_size, out) -> None:
    print(
        f"# {log.file}: {log.collective}, {log.ranks} ranks (from {log.ranks_from}), "
        f"{log.columns} columns{', ' + log.dtype if log.dtype else ''}",
        file=out,
    )
    print(f"#{'size':>12} {'time':>10} {'algbw':>10} {'busbw':>10}", file=out)
    for r in log.rows:
        print(
            f" {format_bytes(r.size_bytes):>12} {format_seconds(r.time_s):>10} "
            f"{format_rate(r.algbw_Bps):>10} {format_rate(r.busbw_Bps):>10}",
            file=out,
        )
    errors = _errors(log, alpha, bandwidth, min_size)
    used = f"size >= {format_bytes(min_size)}" if min_size > 0 else "size > 0"
    print(
        f"# fit ({len(fit_rows(log, min_size))} rows of {used}): alpha = {format_seconds(alpha)} "
        f"per message, bandwidth = {format_rate(bandwidth)} per GPU per direction; "
        f"error median {np.median(errors):.1%}, max {errors.max():.1%}",
        file=out,
    )
    best = max((r.busbw_Bps for r in log.rows if r.size_bytes > 0), default=0.0)
    if errors.max() > BENT_FIT or bandwidth < 0.9 * best:  # the asymptote below what a row reached
        print(
            f"# note: one line fits these rows badly (the largest row's busbw is {format_rate(best)}, above "
            f"the fitted bandwidth): NCCL changes protocol across sizes; fit the large rows with "
            f"--fit-from 8M (see --help)",
            file=out,
        )
    if log.avg_busbw_Bps is not None:
        print(
            f"# the log's own '# Avg bus bandwidth': {format_rate(log.avg_busbw_Bps)} "
            "(the mean busbw over every size, small ones included: not the link's bandwidth)",
            file=out,
        )


def _save(path, log, alpha, bandwidth, name, min_size) -> None:
    from commtax.formulas.links import save_calibration

    collective, _ = model_args(log.collective, log.ranks)
    rows = fit_rows(log, min_size)
    errors = _errors(log, alpha, bandwidth, min_size)
    save_calibration(
        path,
        alpha=alpha,
        bandwidth=bandwidth,
        name=name or f"nccl-tests {log.collective} x{log.ranks} ({Path(log.file).name})",
        collective=collective if log.collective != "sendrecv" else "sendrecv",
        world_size=log.ranks,
        backend="nccl",
        dtype=log.dtype,
        statistic="mean (nccl-tests' time column)",
        sizes=[r.size_bytes for r in rows],
        seconds=[r.time_s for r in rows],
        fit_error_median=float(np.median(errors)),
        fit_error_max=float(errors.max()),
        log_file=str(log.file),
        columns=log.columns,
        fit_from_bytes=int(min_size),
        source=f"nccl-tests log {Path(log.file).name}, {log.columns} columns, "
        "fitted by python3 -m commtax.calibrate nccl-tests",
    )


def main(argv=None) -> int:
    """Run the command line; returns the exit status (0 ok, 1 a log or file problem, 2 bad arguments)."""
    args = _parser().parse_args(argv)
    if args.out is not None and len(args.logs) != 1:
        print(
            f"calibrate: --out writes one link, from one LOG; got {len(args.logs)} logs (run once per log)",
            file=sys.stderr,
        )
        return 2
    columns = "in-place" if args.in_place else "out-of-place"
    results = []
    try:
        for path in args.logs:
            log = parse_log(path, ranks=args.ranks, collective=args.collective, columns=columns)
            alpha, bandwidth = fit_link(log, args.fit_from)
            results.append((log, alpha, bandwidth))
        if args.out is not None:
            log, alpha, bandwidth = results[0]
            try:
                _save(args.out, log, alpha, bandwidth, args.name, args.fit_from)
            except OSError as exc:
                raise NcclTestsError(f"{args.out}: cannot write the calibration ({exc.strerror or exc})") from None
    except NcclTestsError as exc:
        print(f"calibrate: {exc}", file=sys.stderr)
        return 1
    if args.json:
        document = {
            "logs": [
                {
                    "file": log.file,
                    "collective": log.collective,
                    "ranks": log.ranks,
                    "rows": [r.as_dict() for r in log.rows],
                    "alpha_s": alpha,
                    "bandwidth_Bps": bandwidth,
                }
                for log, alpha, bandwidth in results
            ]
        }
        print(json.dumps(document, indent=2))
    else:
        for i, (log, alpha, bandwidth) in enumerate(results):
            if i:
                print()
            _table(log, alpha, bandwidth, args.fit_from, sys.stdout)
    if args.out is not None and not args.json:
        print(f"# wrote {args.out}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BrokenPipeError:  # the reader went away (| head): not an error of ours
        sys.stderr.close()
        sys.exit(0)
