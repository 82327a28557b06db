"""How fast, and in how much memory, ``commtax.trace`` reads a large trace (a benchmark, not a test).

    python3 -m commtax.trace_bench [--mb 200] [--keep PATH] [--gz]

Writes a synthetic NCCL-style trace of about ``--mb`` megabytes (10^6 bytes) shaped like a real
one (CPU ops with shapes, ``cudaLaunchKernel`` runtime events, compute kernels on one stream, every
40th op an all-reduce: a ``record_param_comms`` event and an ``ncclDevKernel`` on another stream,
partly overlapping compute), then times ``python3 -m commtax.trace FILE --json`` in a child process
and reads the child's CPU time and peak resident memory (``getrusage(RUSAGE_CHILDREN)``). It does
the same for a file a quarter the size, so the two points give the cost per MB and the fixed part,
and prints the straight-line extrapolation to 1 GB (the issue's target: < 60 s and < 1 GB RSS on 2
cores). The reader is single-threaded, so on an idle machine the wall time is about the CPU time;
on a shared one the wall time also counts the waits for a core (the load average is printed).
"""

from __future__ import annotations

import argparse
import gzip
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

_ROW = (
    '{{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 4242, "tid": 4242, "ts": {t:.3f}, "dur": 12.5, '
    '"args": {{"External id": {e}, "Record function id": 0, "Concrete Inputs": ["", ""], '
    '"Input type": ["float", "float"], "Input Strides": [[4096, 1], [4096, 1]], '
    '"Input Dims": [[4096, 4096], [4096, 4096]], "Ev Idx": {e}}}}},\n'
    '{{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 4242, "tid": 4242, '
    '"ts": {t1:.3f}, "dur": 4.2, "args": {{"External id": {e}, "cbid": 211, "correlation": {c}}}}},\n'
    '{{"ph": "X", "cat": "kernel", "name": "sm90_xmma_gemm_f32f32_tf32f32_f32_nn_n_tilesize128x128x32", '
    '"pid": 0, "tid": 7, "ts": {g:.3f}, "dur": 30.0, "args": {{"External id": {e}, "queued": 0, '
    '"device": 0, "context": 1, "stream": 7, "correlation": {c}, "registers per thread": 168, '
    '"shared memory": 98304, "blocks per SM": 1.2, "grid": [132, 1, 1], "block": [384, 1, 1]}}}}'
)
_COMM = (
    '{{"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": 4242, "tid": 4242, "ts": {t:.3f}, '
    '"dur": 20.0, "args": {{"External id": {e}, "Collective name": "allreduce", "dtype": "Float", '
    '"In msg nelems": 1048576, "Out msg nelems": 1048576, "Group size": 8, '
    '"Process Group Name": "0", "Process Group Ranks": "[0, 1, 2, 3, 4, 5, 6, 7]"}}}},\n'
    '{{"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL", "pid": 0, "tid": 20, '
    '"ts": {g:.3f}, "dur": 55.0, "args": {{"External id": {e}, "device": 0, "stream": 20, '
    '"correlation": {c}}}}}'
)


def write_synthetic(path: str, megabytes: float) -> int:
    """Write a trace of about ``megabytes`` x 10^6 bytes to ``path``; returns its number of events."""
    if not megabytes > 0:
        raise ValueError(f"megabytes must be > 0, got {megabytes!r}")
    target, events, t = megabytes * 1e6, 0, 1.0e6
    with open(path, "w") as f:
        f.write(
            '{"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 8}, '
            '"baseTimeNanoseconds": 1790000000000000000, "traceEvents": [\n'
        )
        written, i, block = 0, 0, []
        while written < target:
            if i % 40 == 39:
                block.append(_COMM.format(t=t, e=i, g=t + 5.0, c=i))
            block.append(_ROW.format(t=t, t1=t + 3.0, e=i, c=i, g=t + 10.0))
            i += 1
            t += 35.0
            if len(block) >= 2000:
                text = ",\n".join(block) + ",\n"
                f.write(text)
                written += len(text)
                block = []
        block.append(f'{{"ph": "i", "name": "end", "pid": 4242, "tid": 4242, "ts": {t:.3f}, "s": "t"}}')
        f.write(",\n".join(block) + '\n], "traceName": "synthetic"}\n')
        events = i * 3 + i // 40 * 2 + 1
    return events


def measure_once(path: str) -> tuple[float, float, float]:
    """``(wall seconds, CPU seconds, peak RSS bytes)`` of ``python3 -m commtax.trace PATH --json`` in a fresh child."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    before, cpu0 = usage.ru_maxrss, usage.ru_utime + usage.ru_stime
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "commtax.trace", path, "--json"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"commtax.trace failed: {done.stderr.strip()}")
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    peak, cpu = usage.ru_maxrss, usage.ru_utime + usage.ru_stime - cpu0
    if peak < before:
        raise RuntimeError("peak RSS went down between children: cannot attribute it")
    return seconds, cpu, peak * 1024.0  # Linux reports kilobytes


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m commtax.trace_bench", description=__doc__.splitlines()[0])
    p.add_argument("--mb", type=float, default=200.0, help="size of the large trace, in MB (10^6 bytes)")
    p.add_argument("--keep", default=None, help="folder to keep the synthetic traces in (default: a temporary one)")
    p.add_argument(
        "--gz", action="store_true", help="gzip the traces first (what export_chrome_trace('x.json.gz') writes)"
    )
    args = p.parse_args(argv)
    if not args.mb >= 4:
        p.error(f"--mb must be >= 4, got {args.mb}")
    folder = args.keep or tempfile.mkdtemp(prefix="commtax-trace-bench-")
    os.makedirs(folder, exist_ok=True)
    rows = []
    # The small file first: RUSAGE_CHILDREN keeps the largest child's peak, so it must come before the large one.
    for mb in (args.mb / 4, args.mb):
        path = os.path.join(folder, f"synthetic-{mb:.0f}MB.json")
        events = write_synthetic(path, mb)
        size = os.path.getsize(path)  # the JSON's size, also when it is read gzipped
        if args.gz:
            with open(path, "rb") as src, gzip.open(path + ".gz", "wb", compresslevel=6) as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
            os.remove(path)
            path += ".gz"
        seconds, cpu, rss = measure_once(path)
        rows.append((size, events, seconds, cpu, rss))
        gz = f" ({os.path.getsize(path) / 1e6:.1f} MB gzipped)" if args.gz else ""
        print(
            f"{size / 1e6:8.1f} MB{gz}  {events:>10,d} events  {seconds:7.2f} s ({cpu:.2f} s CPU)  "
            f"{size / 1e6 / seconds:6.1f} MB/s  peak RSS {rss / 1e6:7.1f} MB",
            flush=True,
        )
        if not args.keep:
            os.remove(path)
    (s1, _, t1, c1, r1), (s2, _, t2, c2, r2) = rows
    per_byte_t, per_byte_c, per_byte_r = (t2 - t1) / (s2 - s1), (c2 - c1) / (s2 - s1), (r2 - r1) / (s2 - s1)
    print(
        f"extrapolated to 1 GB (straight line through the two points): {t2 + per_byte_t * (1e9 - s2):.0f} s "
        f"({c2 + per_byte_c * (1e9 - s2):.0f} s CPU), "
        f"peak RSS {(r2 + per_byte_r * (1e9 - s2)) / 1e6:.0f} MB "
        f"(fixed part ~{(r1 - per_byte_r * s1) / 1e6:.0f} MB, {per_byte_r:.3f} bytes of RSS per byte of trace)"
    )
    print(f"load average while measuring: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    if not args.keep:
        os.rmdir(folder)
    return 0


if __name__ == "__main__":
    sys.exit(main())
