"""Lab 13 tests: the zigzag layout and the bytes of context parallelism by hand, attention in blocks on
one process, then ring attention and all-to-all attention on 2 and 4 real gloo ranks: exact against
single-process attention (outputs and gradients, causal and not, GQA, logits near 1000), every byte
counted against the formulas, every transfer waited for, the overlap measured, and the load balance
of causal attention without and with the zigzag split.

Grader isolation: workers (top-level functions below) run inside the ranks and return plain data;
every expected value is computed here, in the pytest process, by code that does not come from the lab.
The attention cases' inputs are made here too, from a seed that is secret under the grader, and each
rank is handed only its own share of them (``rank_args``): no rank can compute the whole attention
without the other ranks' K and V. (The timing parts, overlap and load balance, still make their
inputs inside the ranks from fixed seeds: they measure time, not values.)
"""

import contextlib
import functools
import math
import statistics
import time
import traceback
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from commtax.ranks.launch import rank_device
from commtax.ranks.traffic import record_traffic
from commtax.recorded import Expected
from commtax.testing import BACKENDS, SharedRuns, check, expect_close, expect_value_error, fail, input_seed, stream_seed

RUNS = SharedRuns()
SEED = input_seed(0)   # the attention cases' inputs: secret under the grader, never sent to a rank
# commtax.formulas.context on this file's inputs (expected.py; expected.json in the release)
EXPECTED = Expected(Path(__file__).resolve().parent)
DTYPE = torch.float64
REL = ABS = 1e-10                       # "equal to single-process attention to 1e-10"
SEQ, HEAD_DIM = 32, 8                   # 32 tokens: 2cp chunks of 4 (cp 4) or 8 (cp 2) tokens

# The attention cases every world size runs: (heads, kv_heads, causal, zigzag, logit scale).
CASES = {
    "causal_gqa": (8, 4, True, True, 1.0),          # the main case: causal, zigzag, 2 query heads per K/V head
    "noncausal_mha": (4, 4, False, True, 1.0),      # every query sees every key
    "causal_contiguous": (8, 4, True, False, 1.0),  # the unbalanced split
    "large_logits": (8, 4, True, True, 300.0),      # scores near 1000: exp() overflows without the running max
    "ring_mqa": (8, 1, True, True, 1.0),            # one K/V head: fine for the ring, impossible for all-to-all
}
A2A_CASES = ("causal_gqa", "noncausal_mha", "causal_contiguous", "large_logits")

# Overlap (2 ranks): long blocks, so each step's compute (~10 ms) outlasts its transfer (<1 ms).
OVERLAP = dict(seq=2 * 384, heads=4, kv_heads=4, head_dim=32, repeats=5)
# Load balance (4 ranks): causal, forward only, contiguous vs zigzag.
BALANCE = dict(seq=4 * 256, heads=4, kv_heads=4, head_dim=64, repeats=5)
MIN_CPU_SHARE = 0.6     # below this share of a core per rank, other processes set the timings


# -- inputs and the reference, here, independently of the lab ------------------------------------------

def _inputs(heads, kv_heads, scale, seed, seq=SEQ, head_dim=HEAD_DIM):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(seq, heads, head_dim, generator=gen, dtype=DTYPE) * scale
    k = torch.randn(seq, kv_heads, head_dim, generator=gen, dtype=DTYPE)
    v = torch.randn(seq, kv_heads, head_dim, generator=gen, dtype=DTYPE)
    up = torch.randn(seq, heads, head_dim, generator=gen, dtype=DTYPE)
    return q, k, v, up


@functools.cache
def _case_inputs(name):
    """(q, k, v, up) of a case, each token's rows from a stream of its own (``stream_seed``): a rank is handed
    some tokens, and they must say nothing of the others'."""
    heads, kv_heads, causal, zigzag, scale = CASES[name]
    tokens = [_inputs(heads, kv_heads, scale, stream_seed(SEED, name, position), seq=1) for position in range(SEQ)]
    return tuple(torch.cat(parts) for parts in zip(*tokens))


def _case_shares(rank, cp):
    """{case: (q, k, v, up) of the tokens ``rank`` holds}: what the test hands that rank, and nothing else."""
    shares = {}
    for name, (_heads, _kv_heads, _causal, zigzag, _scale) in CASES.items():
        shares[name] = tuple(_share(x, rank, cp, zigzag) for x in _case_inputs(name))
    return shares


def _positions(rank, cp, length, zigzag):
    """The token positions a rank holds: chunk r and 2cp-1-r of 2cp (zigzag), or slice r of cp."""
    if zigzag:
        c = length // (2 * cp)
        return list(range(rank * c, (rank + 1) * c)) + list(range((2 * cp - 1 - rank) * c, (2 * cp - rank) * c))
    c = length // cp
    return list(range(rank * c, (rank + 1) * c))


def _share(x, rank, cp, zigzag, dim=0):
    return x.index_select(dim, torch.tensor(_positions(rank, cp, x.shape[dim], zigzag)))


def _reference(q, k, v, up, causal):
    """softmax(q k^T / sqrt(d) + mask) v with K/V heads repeated for their query heads; and its gradients."""
    q, k, v = (x.clone().requires_grad_() for x in (q, k, v))
    group = q.shape[1] // k.shape[1]
    k2, v2 = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    scores = torch.einsum("qhd,khd->hqk", q, k2) / math.sqrt(q.shape[2])
    if causal:
        n = q.shape[0]
        scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    out = torch.einsum("hqk,khd->qhd", torch.softmax(scores, dim=-1), v2)
    (out * up).sum().backward()
    return {"out": out.detach(), "dq": q.grad, "dk": k.grad, "dv": v.grad}


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
    return {"out": out.detach().cpu(), "dq": q.grad.cpu(), "dk": k.grad.cpu(), "dv": v.grad.cpu(),
            "forward_sent": forward.bytes_sent, "backward_sent": backward.bytes_sent,
            "forward_collectives": forward.collectives, "backward_collectives": backward.collectives,
            "works": len(works), "unwaited": [n for n, w in works if not w.waited]}


def _errors(lab, cp):
    """What the attention functions raise for shapes cp cannot split."""
    out = {}
    heads = cp + 1                                        # not divisible by cp
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
    q, k, v, up = (_share(x, rank, 2, True) for x in _inputs(cfg["heads"], cfg["kv_heads"], 1.0, 7, cfg["seq"],
                                                             cfg["head_dim"]))
    runs = []
    for _ in range(cfg["repeats"] + 1):                   # the first is a warm-up
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
            computes = sorted((r for r in timeline if r.get("event") == "compute" and r.get("phase") == "forward"),
                              key=lambda r: r.get("step", -1))
            steps.append([r["cpu"] for r in computes])
        best = [min(values) for values in zip(*steps)] if all(len(s) == len(steps[0]) for s in steps) else []
        out["zigzag" if zigzag else "contiguous"] = {"steps": best}
    return out


def cp_worker(rank, world_size, lab, with_timing, shares=None):
    """All checks of one world size in one start-up. ``shares``: this rank's inputs (:func:`_case_shares`),
    handed to it by the test; None (a job started without them): made here from the default seed."""
    device = rank_device()
    shares = shares if shares is not None else _case_shares(rank, world_size)
    out = {"ring": _section(lambda: {name: _attention_run(lab, "ring", name, rank, world_size, device, shares)
                                     for name in CASES}),
           "a2a": _section(lambda: {name: _attention_run(lab, "a2a", name, rank, world_size, device, shares)
                                    for name in A2A_CASES}),
           "errors": _section(lambda: _errors(lab, world_size))}
    if with_timing and world_size == 2:
        out["overlap"] = _section(lambda: _overlap_run(lab, rank))
    if with_timing and world_size == 4:
        out["balance"] = _section(lambda: _balance_run(lab, rank, world_size))
    return out


def _results(lab, world_size, backend="gloo"):
    needs = [lab.block_forward, lab.block_backward, lab.RingAttention.forward, lab.RingAttention.backward,
             lab.zigzag_shard, lab.zigzag_unshard]
    return RUNS.get((world_size, backend), cp_worker, world_size, (lab, backend == "gloo"), backend=backend,
                    timeout=150, needs=needs, rank_args=[(_case_shares(r, world_size),) for r in range(world_size)])


def _part(result, rank, key, name=None):
    """One part of a rank's results; if the learner's code raised there, fail with its traceback."""
    part = result.get(key)
    if part is None:
        fail(f"rank {rank}: no {key} results")
    if isinstance(part, dict) and "failed" in part:
        last = part["failed"].strip().splitlines()[-1]
        if last.startswith("NotImplementedError"):
            fail(f"rank {rank}: {last}")              # a starter stub: one line is enough
        fail(f"rank {rank}: the {key} checks raised in your code:\n{part['failed']}")
    return part if name is None else part[name]


def _expected_shares(name, cp):
    heads, kv_heads, causal, zigzag, scale = CASES[name]
    ref = _reference(*_case_inputs(name), causal)
    return [{key: _share(value, rank, cp, zigzag) for key, value in ref.items()} for rank in range(cp)]


# -- part 1: the layout and the bill, by hand ------------------------------------------------------------

@pytest.mark.points(2)
def test_zigzag_shard_gives_rank_r_the_chunks_r_and_2cp_minus_1_minus_r(lab):
    x = torch.arange(8)
    expect_close(lab.zigzag_shard(x, 0, 2), torch.tensor([0, 1, 6, 7]), what="zigzag_shard(arange(8), 0, 2)")
    expect_close(lab.zigzag_shard(x, 1, 2), torch.tensor([2, 3, 4, 5]), what="zigzag_shard(arange(8), 1, 2)")
    expect_close(lab.zigzag_shard(torch.arange(16), 3, 4), torch.tensor([6, 7, 8, 9]),
                 what="rank 3 of 4 holds chunks 3 and 4: the middle of the sequence")
    expect_close(lab.zigzag_shard(x, 0, 1), x, what="one rank holds everything, in order")
    y = torch.arange(24.0).reshape(2, 12)
    expect_close(lab.zigzag_shard(y, 2, 3, dim=1), y[:, [4, 5, 6, 7]], what="zigzag_shard along dim 1")


def test_zigzag_unshard_inverts_zigzag_shard_on_any_dim(lab):
    gen = torch.Generator().manual_seed(5)
    for cp, dim, shape in ((1, 0, (6, 3)), (2, 0, (8, 3)), (4, 0, (16, 2, 3)), (3, 1, (2, 12, 5)), (4, 2, (2, 3, 8))):
        x = torch.randn(*shape, generator=gen, dtype=DTYPE)
        shards = [_share(x, r, cp, True, dim) for r in range(cp)]
        expect_close(lab.zigzag_unshard(shards, dim), x, what=f"zigzag_unshard of {cp} shards along dim {dim}")
        for r in range(cp):
            expect_close(lab.zigzag_shard(x, r, cp, dim), shards[r], what=f"zigzag_shard rank {r} of {cp}, dim {dim}")


def test_zigzag_shard_refuses_bad_input_naming_the_argument(lab):
    for args, name in (((torch.arange(6), 0, 2), "x"), ((torch.arange(8), 2, 2), "cp_rank"),
                       ((torch.arange(8), -1, 2), "cp_rank"), ((torch.arange(8), 0, 0), "cp")):
        expect_value_error(lambda: lab.zigzag_shard(*args), name, function=lab.zigzag_shard)


@pytest.mark.points(3)
def test_ring_bytes_are_two_blocks_per_step_forward_and_six_with_the_backward(lab):
    # 001's case: 128K tokens on 64 ranks, 64 K/V heads of 128 (H = 8192), FP8. One step sends its
    # K and V blocks: 2 x 2048 x 8192 x 1 B = 32 MiB, 001's "2 S/N H"; 63 steps per layer forward.
    step = 2 * 2048 * 8192
    expect_close(lab.ring_attention_bytes_per_rank(131072, 64, 128, 64, 1, backward=False), 63 * step,
                 what="forward bytes, 128K tokens, cp 64, MHA, FP8")
    expect_close(lab.ring_attention_bytes_per_rank(131072, 64, 128, 64, 1), 3 * 63 * step,
                 what="forward + backward (K, V again and dK, dV back)",
                 hints={2 / 3: "the backward sends K, V round again AND dK, dV: twice the forward"})
    # GQA (Llama-3-70B-like: 8 K/V heads of 128), bf16, 131072 tokens on 16 ranks
    expect_close(lab.ring_attention_bytes_per_rank(131072, 8, 128, 16, 2), 6 * 15 * 8192 * 8 * 128 * 2,
                 what="forward + backward, GQA 8 x 128, cp 16, bf16")
    expect_close(lab.ring_attention_bytes_per_rank(4096, 8, 128, 1, 2), 0, what="one rank sends nothing")
    expect_close(lab.ring_attention_bytes_per_rank(32, 4, 8, 2, 8, backward=False), 2 * 16 * 4 * 8 * 8,
                 what="the lab's own run: 32 tokens, 4 K/V heads of 8, cp 2, float64, forward")


@pytest.mark.points(3)
def test_all_to_all_bytes_are_q_k_v_and_the_output_less_the_share_a_rank_keeps(lab):
    # (cp-1)/cp x seq/cp x head_dim x B x (2 heads + 2 kv_heads), twice with the backward
    expect_close(lab.all_to_all_attention_bytes_per_rank(131072, 64, 8, 128, 8, 2, backward=False),
                 7 / 8 * 16384 * 128 * 2 * (2 * 64 + 2 * 8), what="forward, 64 heads, 8 K/V heads, cp 8, bf16")
    expect_close(lab.all_to_all_attention_bytes_per_rank(131072, 64, 8, 128, 8, 2),
                 2 * 7 / 8 * 16384 * 128 * 2 * 144, what="forward + backward",
                 hints={0.5: "the backward runs the same four all-to-alls on the gradients"})
    expect_close(lab.all_to_all_attention_bytes_per_rank(32, 8, 4, 8, 4, 8, backward=False),
                 3 / 4 * 8 * 8 * 8 * 24, what="the lab's own run: 32 tokens, 8 heads, 4 K/V heads, cp 4, float64")
    expect_close(lab.all_to_all_attention_bytes_per_rank(64, 8, 8, 16, 1, 2), 0, what="one rank sends nothing")


def test_with_8_query_heads_per_kv_head_all_to_all_sends_6_over_cp_of_the_rings_bytes(lab):
    # ring: 6 (cp-1) seq/cp kv d B; all-to-all: 4 (cp-1)/cp seq/cp d B (h + kv). With h = 8 kv the ratio is
    # 6/cp over forward and backward (9/cp forward only): the ring sends fewer bytes below cp = 6 (9).
    for cp in (2, 4, 8):
        ratios = []
        for backward in (True, False):
            ring = lab.ring_attention_bytes_per_rank(65536, 8, 128, cp, 2, backward)
            a2a = lab.all_to_all_attention_bytes_per_rank(65536, 64, 8, 128, cp, 2, backward)
            check(isinstance(ring, (int, float)) and isinstance(a2a, (int, float)) and ring > 0 and a2a > 0,
                  f"cp {cp}: ring {ring!r}, all-to-all {a2a!r}: expected positive numbers")
            ratios.append(a2a / ring)
        expect_close(ratios, [6 / cp, 9 / cp], what=f"all-to-all / ring bytes at cp {cp} (with, without backward), "
                                                     "64 heads, 8 K/V heads")


def test_bytes_functions_refuse_bad_input_naming_the_argument(lab):
    ring = lab.ring_attention_bytes_per_rank
    a2a = lab.all_to_all_attention_bytes_per_rank
    for fn, args, name in ((ring, (100, 8, 128, 8), "seq"), (ring, (128, 0, 128, 8), "kv_heads"),
                           (ring, (128, 8, 0, 8), "head_dim"), (ring, (128, 8, 128, 0), "cp"),
                           (ring, (128, 8, 128, 8, 0), "dtype_bytes"),
                           (a2a, (128, 12, 4, 64, 8), "heads"), (a2a, (128, 16, 4, 64, 8), "kv_heads"),
                           (a2a, (100, 8, 8, 64, 8), "seq"), (a2a, (128, 8, 8, 64, 0), "cp"),
                           (a2a, (128, 8, 8, 64, 2, -1), "dtype_bytes")):
        expect_value_error(lambda: fn(*args), name, function=fn)


def _random_shapes(count=100, seed=13):
    """(seq, heads, kv_heads, head_dim, cp, dtype_bytes) drawn once, with a fixed seed: the same 100 shapes always."""
    import random
    rng = random.Random(seed)
    shapes = []
    for _ in range(count):
        cp = rng.choice([1, 2, 4, 8, 16])
        kv = cp * rng.choice([1, 2])
        heads = kv * rng.choice([1, 2, 8])
        seq, d, b = cp * rng.randint(1, 4096), rng.choice([64, 128]), rng.choice([1, 2, 4])
        shapes.append((seq, heads, kv, d, cp, b))
    return shapes


RANDOM_SHAPES = _random_shapes()


def test_bytes_equal_the_course_formulas_on_random_shapes(lab):
    """The course's formulas (commtax.formulas.context) on 100 shapes drawn with a fixed seed: a fixed set, whose
    expected bytes the student release has recorded (EXPECTED)."""
    for seq, heads, kv, d, cp, b in RANDOM_SHAPES:
        for backward in (False, True):
            expect_close(lab.ring_attention_bytes_per_rank(seq, kv, d, cp, b, backward),
                         EXPECTED("ring_attention_bytes_per_rank", seq, kv, d, cp, b, backward),
                         what=f"ring bytes for seq {seq}, kv {kv}, d {d}, cp {cp}, {b} B, backward={backward}")
            expect_close(lab.all_to_all_attention_bytes_per_rank(seq, heads, kv, d, cp, b, backward),
                         EXPECTED("all_to_all_attention_bytes_per_rank", seq, heads, kv, d, cp, b, backward),
                         what=f"all-to-all bytes for seq {seq}, heads {heads}, kv {kv}, cp {cp}, backward={backward}")


# -- part 2: attention in blocks, one process ----------------------------------------------------------

def _online(lab, q, k, v, blocks, diagonal_last):
    """Fold ``blocks`` key ranges into the lab's online softmax; returns (output, log-sum-exp)."""
    rows, heads, _ = q.shape
    m = torch.full((rows, heads), float("-inf"), dtype=DTYPE)
    l = torch.zeros(rows, heads, dtype=DTYPE)
    acc = torch.zeros_like(q)
    for i, (a, b) in enumerate(blocks):
        got = lab.block_forward(q, k[a:b], v[a:b], m, l, acc, diagonal_last and i == len(blocks) - 1,
                                q.shape[2] ** -0.5)
        check(isinstance(got, (tuple, list)) and len(got) == 3,
              f"block_forward must return (m, l, acc), got {type(got).__name__}")
        m, l, acc = got
    return acc / l[..., None], m + torch.log(l)


@pytest.mark.points(2)
@pytest.mark.parametrize("scale", [1.0, 300.0], ids=["normal_logits", "logits_near_1000_need_the_running_max"])
def test_block_forward_folds_blocks_into_the_exact_softmax(lab, scale):
    q, k, v, _ = _inputs(4, 2, scale, seed=3, seq=12)
    rows = q[8:12]                        # the last 4 queries see keys 0..11: blocks [0,4) [4,8) and the diagonal
    ref = _reference(q, k, v, torch.zeros_like(q), causal=True)["out"][8:12]
    out, lse = _online(lab, rows, k, v, [(0, 4), (4, 8), (8, 12)], diagonal_last=True)
    expect_close(out, ref, rel=REL, abs=ABS, what=f"output after three blocks (logits x{scale:g})")
    scores = torch.einsum("qhd,khd->hqk", rows, k.repeat_interleave(2, 1)) / math.sqrt(HEAD_DIM)
    scores = scores.masked_fill(torch.arange(12)[None, None, :] > torch.arange(8, 12)[None, :, None], float("-inf"))
    expect_close(lse, torch.logsumexp(scores, -1).t(), rel=REL, abs=ABS, what="m + log(l): the log-sum-exp")


@pytest.mark.points(2)
def test_block_forward_masks_only_the_future_keys_of_a_diagonal_block(lab):
    q, k, v, _ = _inputs(2, 2, 1.0, seed=4, seq=6)
    out, _ = _online(lab, q, k, v, [(0, 6)], diagonal_last=True)
    expect_close(out, _reference(q, k, v, torch.zeros_like(q), causal=True)["out"], rel=REL, abs=ABS,
                 what="one diagonal block = causal attention (query i sees keys 0..i, itself included)")
    out, _ = _online(lab, q, k, v, [(0, 6)], diagonal_last=False)
    expect_close(out, _reference(q, k, v, torch.zeros_like(q), causal=False)["out"], rel=REL, abs=ABS,
                 what="one non-diagonal block = attention without a mask")


@pytest.mark.points(2)
def test_block_backward_equals_autograd_of_one_blocks_share(lab):
    """Gradients of sum(up * out) where out = sum over blocks; block [0,5) of keys, all queries, GQA."""
    q, k, v, up = _inputs(6, 2, 1.0, seed=6, seq=10)
    ref = _reference(q, k, v, up, causal=False)
    out = ref["out"]
    scores = torch.einsum("qhd,khd->hqk", q, k.repeat_interleave(3, 1)) / math.sqrt(HEAD_DIM)
    lse = torch.logsumexp(scores, -1).t().contiguous()
    delta = (up * out).sum(-1)
    parts = [lab.block_backward(q, k[a:b], v[a:b], up, lse, delta, False, HEAD_DIM ** -0.5)
             for a, b in ((0, 5), (5, 10))]
    for p in parts:
        check(isinstance(p, (tuple, list)) and len(p) == 3, "block_backward must return (dq, dk, dv)")
    expect_close(parts[0][0] + parts[1][0], ref["dq"], rel=REL, abs=ABS, what="dq summed over the two blocks")
    expect_close(torch.cat([parts[0][1], parts[1][1]]), ref["dk"], rel=REL, abs=ABS, what="dk of each block")
    expect_close(torch.cat([parts[0][2], parts[1][2]]), ref["dv"], rel=REL, abs=ABS, what="dv of each block")


# -- part 3: on real ranks ---------------------------------------------------------------------------------

def _check_attention(lab, world_size, method, name, keys):
    expected = _expected_shares(name, world_size)
    for rank, result in enumerate(_results(lab, world_size)):
        got = _part(result, rank, method, name)
        for key in keys:
            expect_close(got[key], expected[rank][key], rel=REL, abs=ABS,
                         what=f"{method} {name}, cp {world_size}, rank {rank}: {key}")


@pytest.mark.points(3)
@pytest.mark.parametrize("world_size", [2, 4])
@pytest.mark.parametrize("name", ["causal_gqa", "noncausal_mha", "ring_mqa"])
def test_ring_attention_output_equals_single_process_attention(lab, world_size, name):
    _check_attention(lab, world_size, "ring", name, ["out"])


@pytest.mark.points(3)
@pytest.mark.parametrize("world_size", [2, 4])
@pytest.mark.parametrize("name", ["causal_gqa", "noncausal_mha", "ring_mqa"])
def test_ring_attention_gradients_equal_single_process_attention(lab, world_size, name):
    _check_attention(lab, world_size, "ring", name, ["dq", "dk", "dv"])


@pytest.mark.parametrize("world_size", [2, 4])
def test_ring_attention_is_exact_on_the_contiguous_split_too(lab, world_size):
    _check_attention(lab, world_size, "ring", "causal_contiguous", ["out", "dq", "dk", "dv"])


@pytest.mark.points(2)
@pytest.mark.parametrize("world_size", [2, 4])
def test_ring_attention_stays_exact_with_logits_near_1000_thanks_to_the_running_max(lab, world_size):
    _check_attention(lab, world_size, "ring", "large_logits", ["out", "dq", "dk", "dv"])


@pytest.mark.points(3)
@pytest.mark.parametrize("world_size", [2, 4])
def test_ring_sends_its_kv_block_cp_minus_1_times_and_dkv_back_point_to_point_only(lab, world_size):
    """Counted bytes = the formula (no all-reduce anywhere: 001's 'KV-cache all-reduce' does not exist)."""
    for name in ("causal_gqa", "ring_mqa", "causal_contiguous"):
        heads, kv_heads, *_ = CASES[name]
        forward = EXPECTED("ring_attention_bytes_per_rank", SEQ, kv_heads, HEAD_DIM, world_size, 8, False)
        total = EXPECTED("ring_attention_bytes_per_rank", SEQ, kv_heads, HEAD_DIM, world_size, 8, True)
        expect_close(lab.ring_attention_bytes_per_rank(SEQ, kv_heads, HEAD_DIM, world_size, 8), total,
                     what=f"your ring_attention_bytes_per_rank for the {name} run")
        for rank, result in enumerate(_results(lab, world_size)):
            got = _part(result, rank, "ring", name)
            check(got["forward_collectives"] == [] and got["backward_collectives"] == [],
                  f"rank {rank}, {name}: ring attention called collectives "
                  f"{got['forward_collectives'] + got['backward_collectives']}; it needs only isend/irecv")
            expect_close(got["forward_sent"], forward, what=f"rank {rank}, {name}: bytes sent in the forward",
                         hints={0.5: "K and V both travel", 2.0: "each block is sent once per step"})
            expect_close(got["forward_sent"] + got["backward_sent"], total,
                         what=f"rank {rank}, {name}: bytes sent forward + backward")


@pytest.mark.points(2)
@pytest.mark.parametrize("world_size", [2, 4])
def test_every_isend_and_irecv_of_the_ring_is_waited_for(lab, world_size):
    """A transfer never waited for may still be in flight when its buffer is read or reused."""
    for rank, result in enumerate(_results(lab, world_size)):
        for name in CASES:
            got = _part(result, rank, "ring", name)
            check(got["works"] > 0, f"rank {rank}, {name}: no dist.isend/dist.irecv seen (call them through dist)")
            check(got["unwaited"] == [], f"rank {rank}, {name}: {len(got['unwaited'])} of {got['works']} "
                                          f"transfers ({', '.join(got['unwaited'][:4])} ...) were never waited for")


@pytest.mark.points(3)
@pytest.mark.parametrize("world_size", [2, 4])
@pytest.mark.parametrize("name", A2A_CASES)
def test_all_to_all_attention_equals_single_process_attention(lab, world_size, name):
    _check_attention(lab, world_size, "a2a", name, ["out", "dq", "dk", "dv"])


@pytest.mark.points(2)
@pytest.mark.parametrize("world_size", [2, 4])
def test_all_to_all_attention_sends_what_the_formula_says(lab, world_size):
    for name in A2A_CASES:
        heads, kv_heads, *_ = CASES[name]
        expected = {"forward": EXPECTED("all_to_all_attention_bytes_per_rank", SEQ, heads, kv_heads, HEAD_DIM,
                                        world_size, 8, False)}
        expected["backward"] = expected["forward"]
        for rank, result in enumerate(_results(lab, world_size)):
            got = _part(result, rank, "a2a", name)
            for phase in ("forward", "backward"):
                others = [c for c in got[f"{phase}_collectives"] if not c[0].startswith("all_to_all")]
                check(not others, f"rank {rank}, {name}: {phase} called {others}; all-to-all attention needs "
                                  "only all-to-alls")
                # an all-to-all's recorded payload is the whole buffer; a rank keeps 1/cp of it
                sent = got[f"{phase}_sent"] + sum((world_size - 1) / world_size * b
                                                  for _, b in got[f"{phase}_collectives"])
                expect_close(sent, expected[phase], what=f"rank {rank}, {name}: bytes sent in the {phase}")


def test_all_to_all_attention_refuses_heads_cp_cannot_split_naming_them(lab):
    for world_size in (2, 4):
        for rank, result in enumerate(_results(lab, world_size)):
            errors = _part(result, rank, "errors")
            for label in ("heads", "kv_heads"):
                message = errors[label]
                check(message.startswith("ValueError") and label in message.split(":", 1)[1],
                      f"cp {world_size}, rank {rank}: {label} not divisible by cp gave {message!r}; "
                      f"expected a ValueError naming {label}")


# -- the overlap, measured -------------------------------------------------------------------------

def _records(run, phase, event):
    return sorted((r for r in run["timeline"] if r.get("phase") == phase and r.get("event") == event),
                  key=lambda r: (r.get("step", -1), r["start"]))


def _overlap(lab):
    results = _results(lab, 2)
    return [_part(r, rank, "overlap") for rank, r in enumerate(results)]


@pytest.mark.points(2)
def test_the_timeline_has_one_compute_per_ring_step_in_order_and_waits_between(lab):
    for rank, result in enumerate(_overlap(lab)):
        for run in result["runs"]:
            for phase in ("forward", "backward"):
                computes = _records(run, phase, "compute")
                check([r.get("step") for r in computes] == [0, 1],
                      f"rank {rank}, {phase}: compute records for steps {[r.get('step') for r in computes]}, "
                      "expected one per ring step, 0 and 1 (record them with timed(timeline, ...))")
                check(all(a["end"] <= b["start"] for a, b in zip(computes, computes[1:])),
                      f"rank {rank}, {phase}: step computes overlap or go backwards in time")
                waits = _records(run, phase, "wait")
                check(waits, f"rank {rank}, {phase}: no wait records (time your waits with event='wait')")
                within = run["start"] <= computes[0]["start"] and computes[-1]["end"] <= run["backward_end"]
                check(within, f"rank {rank}, {phase}: records outside the call's own time")


@pytest.mark.points(2)
def test_transfers_hide_behind_block_compute_when_the_blocks_are_long(lab):
    """Forward, 2 ranks, 384-token blocks: compute ~10x the transfer. Prediction: exposed = max(0, t - c)
    per step with c the measured step compute and t the K+V block swapped alone. Measured: the time spent
    waiting. Checked when each rank got at least 60% of a core (else other processes set the timings)."""
    results = _overlap(lab)
    transfer = max(r["transfer"] for r in results)
    rows = []
    for rank, result in enumerate(results):
        for run in result["runs"]:
            computes = _records(run, "forward", "compute")
            check(len(computes) == 2, f"rank {rank}: {len(computes)} forward compute records, expected 2")
            waits = sum(r["end"] - r["start"] for r in _records(run, "forward", "wait"))
            cpu = sum(r["cpu"] for r in computes) / sum(r["end"] - r["start"] for r in computes)
            rows.append((max(0.0, transfer - computes[0]["end"] + computes[0]["start"]), waits, cpu,
                         computes[0]["end"] - computes[0]["start"]))
    predicted = statistics.median(r[0] for r in rows)
    measured = statistics.median(r[1] for r in rows)
    share = statistics.median(r[2] for r in rows)
    detail = (f"transfer alone {transfer * 1e3:.2f} ms, step compute {statistics.median(r[3] for r in rows) * 1e3:.1f} "
              f"ms; exposed predicted {predicted * 1e3:.2f} ms, measured {measured * 1e3:.2f} ms; "
              f"compute got {share:.0%} of a core")
    print(detail)
    if share >= MIN_CPU_SHARE:     # else other processes set the timings: the numbers are printed, not judged
        check(predicted < 0.5 * transfer, f"the test's blocks should be compute-bound: {detail}")
        # Judged on the best run: load only lengthens waits (a slow peer), while code that does not overlap
        # waits about a whole transfer in every run (a median failed correct code under a loaded grader).
        best = min(r[1] - r[0] for r in rows)
        check(best <= 0.5 * transfer, f"less than half of the transfer was hidden, in every run: {detail}")


@pytest.mark.points(2)
def test_the_last_dkv_hop_of_the_backward_cannot_hide(lab):
    """After the last step's compute nothing is left to hide the last dK, dV hop to its owner: the rank
    that finishes first waits at least about one transfer. Measured: backward end minus last compute end,
    the larger of the two ranks, median of the runs; it cannot be below a third of the transfer alone."""
    results = _overlap(lab)
    transfer = max(r["transfer"] for r in results)
    tails = []
    for j in range(len(results[0]["runs"])):
        per_rank = []
        for rank, result in enumerate(results):
            run = result["runs"][j]
            computes = _records(run, "backward", "compute")
            check(computes, f"rank {rank}: no backward compute records")
            per_rank.append(run["backward_end"] - computes[-1]["end"])
        tails.append(max(per_rank))
    tail = statistics.median(tails)
    detail = f"measured tail {tail * 1e3:.2f} ms, one K+V-sized transfer alone {transfer * 1e3:.2f} ms"
    print(detail)
    check(tail >= transfer / 3, f"the backward ended sooner than its last transfer allows: {detail}")


@pytest.mark.points(3)
def test_zigzag_balances_causal_work_that_the_contiguous_split_gives_to_the_last_rank(lab):
    """Per-rank compute CPU time of causal ring attention on 4 ranks, per ring step, best of 5 runs.
    Block model (commtax.formulas.context.causal_work_per_rank): contiguous, rank r computes in r + 1 of
    its 4 steps (the others' keys are all in its future: skipped), zigzag every rank in all 4, the same
    9/4 blocks. Checked: which steps compute (a step "computes" when it takes over a quarter of the
    median busy step: a skipped step costs microseconds, a block milliseconds), then the totals:
    zigzag max/min <= 1.5, contiguous max/min >= 1.4 and above zigzag's. The totals are loose because
    a diagonal block costs d whole ones (its mask: 1.6 in the reference), and on a shared machine a
    rank's CPU time per FLOP varies by tens of percent with what else runs."""
    results = [_part(r, rank, "balance") for rank, r in enumerate(_results(lab, 4))]
    totals = {}
    for layout in ("contiguous", "zigzag"):
        steps = [r[layout]["steps"] for r in results]
        check(all(len(s) == 4 for s in steps), f"{layout}: compute records per rank {[len(s) for s in steps]}, "
              "expected one per ring step (4): record each with timed(timeline, phase='forward', step=i, "
              "event='compute')")
        positive = [c for s in steps for c in s if c > 0]
        check(positive, f"{layout}: every compute record took 0 s of CPU time")
        busy_median = statistics.median(positive)
        busy = [sum(c > 0.25 * busy_median for c in s) for s in steps]
        expected = [r + 1 for r in range(4)] if layout == "contiguous" else [4] * 4
        totals[layout] = [sum(s) for s in steps]
        detail = (f"{layout}: steps that computed per rank {busy}, expected {expected}; CPU ms per step "
                  f"{[[round(c * 1e3, 1) for c in s] for s in steps]}")
        print(detail)
        hint = (" (blocks whose keys are all in the queries' future must be skipped, not masked)"
                if layout == "contiguous" else "")
        check(busy == expected, detail + hint)
    ratio = {layout: max(t) / min(t) for layout, t in totals.items()}
    summary = (f"per-rank totals (ms) contiguous {[round(t * 1e3, 1) for t in totals['contiguous']]}, max/min "
               f"{ratio['contiguous']:.2f} (block model 4); zigzag {[round(t * 1e3, 1) for t in totals['zigzag']]}, "
               f"max/min {ratio['zigzag']:.2f} (model 1)")
    print(summary)
    check(ratio["zigzag"] <= 1.5, "zigzag should give every rank about the same work: " + summary)
    check(ratio["contiguous"] >= 1.4 and ratio["contiguous"] > ratio["zigzag"],
          "the contiguous split should load the last rank most: " + summary)


@pytest.mark.parametrize("backend", BACKENDS)
def test_ring_attention_runs_on_each_backend(lab, backend):
    expected = _expected_shares("causal_gqa", 2)
    for rank, result in enumerate(_results(lab, 2, backend)):
        got = _part(result, rank, "ring", "causal_gqa")
        expect_close(got["out"], expected[rank]["out"], rel=1e-9, abs=1e-9, what=f"rank {rank} on {backend}")
