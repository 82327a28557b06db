"""Lab 13's rank side: what every rank runs, and the wrapper that sees whether each transfer is waited for.

``test_lab.py`` reads as the spec; this file holds what its ranks execute (``cp_worker`` and its parts).
Workers return plain data; every expected value is computed in the test process, by code that does not
come from the lab (``_reference.py``). The attention parts run on the shares the test hands each rank
(``rank_args``); the timing parts, overlap and load balance, make their inputs here from fixed seeds
(they measure time, not values).
"""

import contextlib
import time
import traceback
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from commtax.boundary.byfile import load_module_from_file
from commtax.ranks.launch import rank_device
from commtax.ranks.traffic import record_traffic

# the cases and their inputs (_inputs.py beside this file, loaded by path: lab folders are not packages)
load_module_from_file("lab_13_inputs", str(Path(__file__).resolve().parent / "_inputs.py"))
from lab_13_inputs import A2A_CASES, CASES, DTYPE, _case_shares, _inputs, _share  # noqa: E402  (loaded just above)

# Overlap (2 ranks): long blocks, so each step's compute (~10 ms) outlasts its transfer (<1 ms).
OVERLAP = dict(seq=2 * 384, heads=4, kv_heads=4, head_dim=32, repeats=5)
# Load balance (4 ranks): causal, forward only, contiguous vs zigzag.
BALANCE = dict(seq=4 * 256, heads=4, kv_heads=4, head_dim=64, repeats=5)


# -- checking that every isend/irecv is waited for ---------------------------------------------------


class _TrackedWork:
    """A Work that remembers whether ``wait()`` was called on it."""

    def __init__(self, work):
        self._work, self.waited = work, False

    def wait(self, *args, **kwargs):
        self.waited = True
        return self._work.wait(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._work, name)


@contextlib.contextmanager
def track_waits():
    """Wrap dist.isend/irecv (both namespaces, as the byte counter does); yields the list of their works."""
    works, saved = [], {}
    for name in ("isend", "irecv"):
        original = getattr(c10d, name)
        saved[name] = original

        def wrapper(*args, _original=original, _name=name, **kwargs):
            work = _original(*args, **kwargs)
            if work is None:
                return None
            tracked = _TrackedWork(work)
            works.append((_name, tracked))
            return tracked

        setattr(c10d, name, wrapper)
        setattr(dist, name, wrapper)
    try:
        yield works
    finally:
        for name, original in saved.items():
            setattr(c10d, name, original)
            setattr(dist, name, original)


# -- workers: run inside the ranks, return plain data ----------------------------------------------


def _section(fn):
    """One part of the checks; a learner's exception there becomes a message for that part's tests only."""
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 - reported by the tests that read this part
        return {"failed": "".join(traceback.format_exception(exc))[-4000:]}


def _attention_run(lab, method, name, rank, cp, device, shares):
    heads, kv_heads, causal, zigzag, scale = CASES[name]
    q, k, v, up = (x.to(device) for x in shares[name])
    q, k, v = (x.clone().requires_grad_() for x in (q, k, v))
    fn = lab.ring_attention if method == "ring" else lab.all_to_all_attention
    with track_waits() as works:
        with record_traffic() as forward:
            out = fn(q, k, v, causal=causal, zigzag=zigzag)
        with record_traffic() as backward:
            (out * up).sum().backward()
    return {
        "out": out.detach().cpu(),
        "dq": q.grad.cpu(),
        "dk": k.grad.cpu(),
        "dv": v.grad.cpu(),
        "forward_sent": forward.bytes_sent,
        "backward_sent": backward.bytes_sent,
        "forward_collectives": forward.collectives,
        "backward_collectives": backward.collectives,
        "works": len(works),
        "unwaited": [n for n, w in works if not w.waited],
    }


def _errors(lab, cp):
    """What the attention functions raise for shapes cp cannot split."""
    out = {}
    heads = cp + 1  # not divisible by cp
    for label, (h, g) in (("heads", (heads, 1)), ("kv_heads", (cp, 1 if cp > 1 else 2))):
        q = torch.zeros(2 * cp, h, 4, dtype=DTYPE)
        k = torch.zeros(2 * cp, g, 4, dtype=DTYPE)
        try:
            lab.all_to_all_attention(q, k, k.clone())
            out[label] = "no error"
        except Exception as exc:  # noqa: BLE001
            out[label] = f"{type(exc).__name__}: {exc}"
    return out


def _exchange_time(shape, repeats):
    """Seconds to swap one tensor of ``shape`` with the other rank (isend + irecv, both at once): the best of
    ``repeats`` (the slower ones measure the scheduler of a shared machine, not the link)."""
    rank = dist.get_rank()
    peer = 1 - rank
    x, y = torch.randn(shape, dtype=DTYPE), torch.empty(shape, dtype=DTYPE)
    times = []
    for _ in range(repeats + 1):
        dist.barrier()
        start = time.perf_counter()
        works = [c10d.isend(x, peer), c10d.irecv(y, peer)]
        for work in works:
            work.wait()
        times.append(time.perf_counter() - start)
    return min(times[1:])


def _overlap_run(lab, rank):
    """Ring attention on long blocks, 2 ranks: timelines of forward and backward, and the link alone."""
    cfg = OVERLAP
    q, k, v, up = (
        _share(x, rank, 2, True) for x in _inputs(cfg["heads"], cfg["kv_heads"], 1.0, 7, cfg["seq"], cfg["head_dim"])
    )
    runs = []
    for _ in range(cfg["repeats"] + 1):  # the first is a warm-up
        qq, kk, vv = (x.clone().requires_grad_() for x in (q, k, v))
        timeline = []
        dist.barrier()
        start = time.perf_counter()
        out = lab.ring_attention(qq, kk, vv, causal=True, zigzag=True, timeline=timeline)
        middle = time.perf_counter()
        (out * up).sum().backward()
        end = time.perf_counter()
        runs.append({"timeline": timeline, "start": start, "forward_end": middle, "backward_end": end})
    kv_shape = (2, cfg["seq"] // 2, cfg["kv_heads"], cfg["head_dim"])
    return {"runs": runs[1:], "transfer": _exchange_time(kv_shape, 7)}


def _balance_run(lab, rank, cp):
    """Causal ring attention forward on long blocks, contiguous and zigzag: this rank's compute CPU time
    per ring step, the best of the repeats for each step."""
    cfg = BALANCE
    full = _inputs(cfg["heads"], cfg["kv_heads"], 1.0, 11, cfg["seq"], cfg["head_dim"])
    out = {}
    for zigzag in (False, True):
        q, k, v, _ = (_share(x, rank, cp, zigzag) for x in full)
        steps = []
        for _ in range(cfg["repeats"]):
            timeline = []
            with torch.no_grad():
                lab.ring_attention(q, k, v, causal=True, zigzag=zigzag, timeline=timeline)
            computes = sorted(
                (r for r in timeline if r.get("event") == "compute" and r.get("phase") == "forward"),
                key=lambda r: r.get("step", -1),
            )
            steps.append([r["cpu"] for r in computes])
        best = [min(values) for values in zip(*steps)] if all(len(s) == len(steps[0]) for s in steps) else []
        out["zigzag" if zigzag else "contiguous"] = {"steps": best}
    return out


def cp_worker(rank, world_size, lab, with_timing, shares=None):
    """All checks of one world size in one start-up. ``shares``: this rank's inputs (:func:`_case_shares`),
    handed to it by the test; None (a job started without them): made here from the default seed."""
    device = rank_device()
    shares = shares if shares is not None else _case_shares(rank, world_size)
    out = {
        "ring": _section(
            lambda: {name: _attention_run(lab, "ring", name, rank, world_size, device, shares) for name in CASES}
        ),
        "a2a": _section(
            lambda: {name: _attention_run(lab, "a2a", name, rank, world_size, device, shares) for name in A2A_CASES}
        ),
        "errors": _section(lambda: _errors(lab, world_size)),
    }
    if with_timing and world_size == 2:
        out["overlap"] = _section(lambda: _overlap_run(lab, rank))
    if with_timing and world_size == 4:
        out["balance"] = _section(lambda: _balance_run(lab, rank, world_size))
    return out
