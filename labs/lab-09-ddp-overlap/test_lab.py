"""Lab 09 tests: the bucket plan and the overlapped finish time on hand-checked cases, then a real
bucketed DDP on 2 and 4 gloo ranks, used as PyTorch's is (an nn.Module around the caller's model,
ranks that start from different parameters, a subgroup), against PyTorch's DistributedDataParallel,
the single-process gradient, the byte counter, no_sync, the order of events on the timeline, and a
measured timeline against the prediction.

Grader isolation: rank workers return plain data (tensors, lists of floats); every expected value
and every assertion is computed here, in the pytest process. The data is made here too, from a seed
that is secret under the grader, and each rank is handed only its own rows of each batch
(``rank_args``): the single-process gradient of the global batch can only be matched by really
averaging the ranks' gradients. (The models' initial parameters come from fixed seeds: the wrapper
must broadcast rank 0's, which every rank can build.) ``--tb=short`` reads well here.
"""

import contextlib
import os
import random
import statistics
import threading
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from commtax.formulas import ddp as reference
from commtax.ranks.traffic import record_traffic
from commtax.recorded import Expected
from commtax.testing import (
    SharedRuns,
    expect_close,
    expect_value_error,
    fail,
    input_seed,
    known_ratios,
    stream_seed,
    subgroup_failure,
)

RUNS = SharedRuns()
SEED = input_seed(0)   # the batches: secret under the grader, drawn here and never sent to a rank
# commtax.formulas.ddp's bucket plans (expected.py; expected.json in the release, recorded for these inputs)
EXPECTED = Expected(Path(__file__).resolve().parent)


# -- the bucket plan -------------------------------------------------------------------------------

def _walk(sizes, cap, order, closes_at_cap=True, close_before=False):
    """A bucket plan made by walking ``order``: the rule (closes_at_cap, add then close) and its classic slips."""
    buckets, current, size = [], [], 0
    for index in order:
        if close_before and current and size + sizes[index] > cap:   # "a bucket never exceeds the cap"
            buckets.append(current)
            current, size = [], 0
        current.append(index)
        size += sizes[index]
        if (size >= cap) if closes_at_cap else (size > cap):
            buckets.append(current)
            current, size = [], 0
    return buckets + ([current] if current else [])


def bucket_mistake(got, sizes, cap):
    """What a wrong plan ``got`` suggests (the classic slips, each made here), or "" if none fits."""
    n, backward = len(sizes), list(reversed(range(len(sizes))))
    right = _walk(sizes, cap, backward)
    slips = (
        (_walk(sizes, cap, range(n)), "the buckets were filled from the FIRST parameter: backward produces the last "
         "parameters' gradients first, so walk from the last parameter to the first (reversed(range(n)))"),
        ([list(reversed(b)) for b in reversed(_walk(sizes, cap, range(n)))],
         "the forward-order plan, turned around: fill the buckets walking from the last parameter, so that each "
         "bucket closes when the gradients it waits for are the next ones backward produces"),
        (list(reversed(right)), "the right buckets in the wrong order: list them in the order backward fills them "
         "(the bucket of the last parameters first: it is ready first)"),
        ([sorted(b) for b in right], "each bucket's indices in forward order: list them in the order their gradients "
         "arrive, from the last parameter down"),
        (_walk(sizes, cap, backward, closes_at_cap=False), "a bucket closed only once its bytes EXCEED the cap: close "
         "it as soon as they reach it (>=)"),
        (_walk(sizes, cap, backward, close_before=True), "a parameter that would take the bucket past the cap was put "
         "in a new bucket: add it first, then close the bucket once its bytes reach the cap (a bucket may pass it)"),
    )
    for plan, why in slips:
        if plan != right and got == plan:
            return f" - {why}"
    return ""


def _plan(lab, sizes, cap, want):
    got = lab.bucket_assignment(sizes, cap)
    hint = bucket_mistake(got, sizes, cap) if isinstance(got, list) and got != want else ""
    if hint:
        fail(f"bucket_assignment({sizes}, {cap}): got {got}, expected {want}{hint}")
    expect_close(got, want, what=f"bucket_assignment({sizes}, {cap})")


def test_buckets_fill_from_the_last_parameter_and_close_on_reaching_the_cap(lab):
    _plan(lab, [4, 4, 4, 4], 8, [[3, 2], [1, 0]])           # 8 reaches 8: closes
    _plan(lab, [4, 4, 4, 4], 5, [[3, 2], [1, 0]])           # 8 exceeds 5: closes
    _plan(lab, [4, 4, 4, 4], 9, [[3, 2, 1], [0]])           # the last bucket is short
    _plan(lab, [4, 4, 4, 4], 4, [[3], [2], [1], [0]])
    _plan(lab, [4, 4, 4, 4], 10**9, [[3, 2, 1, 0]])         # one bucket: no overlap
    _plan(lab, [10, 1, 1, 30, 2], 12, [[4, 3], [2, 1, 0]])


def test_a_parameter_past_the_cap_closes_its_bucket_at_once(lab):
    _plan(lab, [1, 100, 1], 10, [[2, 1], [0]])
    _plan(lab, [100, 1], 10, [[1, 0]])
    _plan(lab, [100, 100, 100], 10, [[2], [1], [0]])


def _random_plans(count=200, seed=9):
    """(parameter sizes, cap) drawn once with a fixed seed: the same 200 plans always."""
    rng = random.Random(seed)
    plans = []
    for _ in range(count):
        sizes = [rng.choice([0, 1, 4, 64, 4096, 10**6]) for _ in range(rng.randint(1, 30))]
        plans.append((sizes, rng.choice([1, 64, 5000, 10**6, 10**9])))
    return plans


RANDOM_PLANS = _random_plans()


def test_random_plans_keep_every_parameter_once_and_every_full_bucket_minimal(lab):
    """200 plans drawn with a fixed seed (a fixed set: the student release has the course's plan of each
    recorded, EXPECTED)."""
    for sizes, cap in RANDOM_PLANS:
        plan = lab.bucket_assignment(sizes, cap)
        what = f"bucket_assignment({sizes}, {cap}) = {plan}"
        if isinstance(plan, list) and plan != _walk(sizes, cap, list(reversed(range(len(sizes))))) and \
                bucket_mistake(plan, sizes, cap):
            fail(f"{what}{bucket_mistake(plan, sizes, cap)}")
        if not isinstance(plan, list) or not all(isinstance(b, list) and b for b in plan):
            fail(f"{what}: expected a list of non-empty lists of indices")
        if [i for bucket in plan for i in bucket] != list(reversed(range(len(sizes)))):
            fail(f"{what}: every index once, from the last to the first")
        for bucket in plan[:-1]:
            total = sum(sizes[i] for i in bucket)
            if not (total >= cap and total - sizes[bucket[-1]] < cap):
                fail(f"{what}: bucket {bucket} holds {total} bytes; a closed bucket reaches the cap, and would not "
                     "without its last parameter")
        expect_close(plan, EXPECTED("bucket_assignment", sizes, cap), what=what + " against commtax.formulas.ddp")


# -- the overlapped finish time ----------------------------------------------------------------------

def _finish(lab, ready, comm, want):
    expect_close(lab.overlapped_allreduce_finish(ready, comm), float(want),
                 what=f"overlapped_allreduce_finish({ready}, {comm})",
                 hints={sum(comm) / want if want else 0.0: "the all-reduce times summed: the ready times ignored?",
                        (max(ready, default=0) + comm[-1]) / want if want and comm else 0.0:
                        "the last bucket's start taken as its ready time: the queue behind it ignored?",
                        max((r + c for r, c in zip(ready, comm)), default=0) / want if want else 0.0:
                        "each all-reduce started at its own ready time, side by side: they share one link and run "
                        "one at a time (a bucket starts when it is ready AND the previous one has finished)"})


def test_finish_time_on_hand_checked_timelines(lab):
    _finish(lab, [1, 2, 3], [2, 2, 0.5], 5.5)      # starts 1, 3, 5
    _finish(lab, [0, 10, 20], [1, 1, 1], 21)       # the link idles: a tail of 1
    _finish(lab, [0, 0, 0], [1, 2, 3], 6)          # all ready at once: serial
    _finish(lab, [5], [0], 5)
    expect_close(lab.overlapped_allreduce_finish([], []), 0.0, what="overlapped_allreduce_finish([], [])")


def _tick_simulation(ready, comm):
    """Brute force, in whole ticks: each tick the link works on the first unfinished bucket, if it is ready."""
    left, t = list(comm), 0
    while any(left):
        current = next(i for i, x in enumerate(left) if x)
        if ready[current] <= t:
            left[current] -= 1
        t += 1
    return max([t] + list(ready[-1:]))


def test_finish_time_equals_a_tick_by_tick_simulation(lab):
    rng = random.Random(4)
    for _ in range(300):
        k = rng.randint(1, 8)
        ready = sorted(rng.randint(0, 30) for _ in range(k))
        comm = [rng.randint(1, 9) for _ in range(k)]
        expect_close(lab.overlapped_allreduce_finish(ready, comm), float(_tick_simulation(ready, comm)),
                     what=f"overlapped_allreduce_finish({ready}, {comm}) against a tick-by-tick simulation")


@pytest.mark.parametrize("k", [1, 2, 4, 8, 32])
@pytest.mark.parametrize("comm_total", [0.2, 1.0, 3.0])
def test_k_equal_buckets_finish_at_max_of_T_plus_c_and_T_over_k_plus_k_c(lab, k, comm_total):
    """Lesson 08's closed form: gradients produced at a constant rate over T = 1 s, k buckets, alpha 1 ms."""
    T, a = 1.0, 1e-3
    c = a + comm_total / k
    ready = [T * (i + 1) / k for i in range(k)]
    expect_close(lab.overlapped_allreduce_finish(ready, [c] * k), float(max(T + c, T / k + k * c)), what='lab.overlapped_allreduce_finish(ready, [c] * k)')


def test_bad_arguments_raise_value_error_naming_them(lab):
    expect_value_error(lambda: lab.bucket_assignment([4, 4], 0), "bucket_cap_bytes", function=lab.bucket_assignment)
    expect_value_error(lambda: lab.bucket_assignment([4, 4], -8), "bucket_cap_bytes", function=lab.bucket_assignment)
    expect_value_error(lambda: lab.bucket_assignment([4, -4], 8), "param_bytes", function=lab.bucket_assignment)
    expect_value_error(lambda: lab.bucket_assignment([4, -1], 8), "param_bytes", function=lab.bucket_assignment)  # the edge: < 0, not < -1
    expect_value_error(lambda: lab.bucket_assignment([], 8), "param_bytes", function=lab.bucket_assignment)
    expect_value_error(lambda: lab.overlapped_allreduce_finish([2, 1], [1, 1]), "ready_times", function=lab.overlapped_allreduce_finish)       # must not go backwards
    expect_value_error(lambda: lab.overlapped_allreduce_finish([1, 2], [1, -1]), "comm_times", function=lab.overlapped_allreduce_finish)
    expect_value_error(lambda: lab.overlapped_allreduce_finish([1, 2], [1]), ("ready_times", "comm_times"), function=lab.overlapped_allreduce_finish)
    expect_value_error(lambda: lab.overlapped_allreduce_finish(1.0, [1.0]), "ready_times", function=lab.overlapped_allreduce_finish)    # a number, not a list
    # r23j (round 10): a check of "< 0" alone passed these; a byte count is whole
    for ready, comm, name in (([1.0, float("nan")], [1, 1], "ready_times"), ([1, float("inf")], [1, 1], "ready_times"),
                              ([1, 2], [float("inf"), 1], "comm_times"), ([1, 2], [1, float("nan")], "comm_times")):
        expect_value_error(lambda: lab.overlapped_allreduce_finish(ready, comm), name, function=lab.overlapped_allreduce_finish)
    expect_value_error(lambda: lab.bucket_assignment([4.5, 4], 8), "param_bytes", function=lab.bucket_assignment)
    expect_value_error(lambda: lab.bucket_assignment(4, 8), "param_bytes", function=lab.bucket_assignment)   # a list


# -- a real bucketed DDP: gradients, bytes, no_sync -----------------------------------------------------

WIDTHS = [16, 32, 32, 24, 8]          # four Linear layers, float64: 8 trainable parameters
LOCAL_BATCH, MICROBATCHES = 6, 3
CAP = 1200                            # bytes: several buckets of one or two parameters each
HOLD_BACK = 10.0                      # seconds rank 1 waits for rank 0's backward to return (it takes ms)


class Net(nn.Module):
    """The test's model: four float64 Linear layers with tanh, a frozen input scale and a buffer.

    ``seed`` sets everything, the frozen parameter and the buffer included, so that ranks built with
    different seeds differ in all three kinds of state: the wrapper must broadcast them all and
    bucket only the trainable parameters.
    """

    def __init__(self, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        layers = []
        for i, (a, b) in enumerate(zip(WIDTHS, WIDTHS[1:])):
            layers += [nn.Linear(a, b, dtype=torch.float64)] + ([nn.Tanh()] if i < len(WIDTHS) - 2 else [])
        self.layers = nn.Sequential(*layers)
        self.input_scale = nn.Parameter(torch.full((WIDTHS[0],), 1.0 + 0.1 * seed, dtype=torch.float64),
                                        requires_grad=False)
        self.register_buffer("shift", torch.full((WIDTHS[0],), 0.01 * seed, dtype=torch.float64))

    def forward(self, x):
        return self.layers(x * self.input_scale + self.shift)


def build_model(seed=0):
    """The test's own model (the pytest process rebuilds it for the expected values)."""
    return Net(seed)


def global_batch(world_size, tag=0):
    """The global batch of ``world_size`` ranks; rank r takes rows [r b, (r+1) b).

    Each rank's rows come from a stream of their own (``stream_seed``): one rank's rows say nothing
    of another's."""
    parts = []
    for rank in range(world_size):
        gen = torch.Generator().manual_seed(stream_seed(SEED, "batch", world_size, tag, rank))
        parts.append((torch.randn(LOCAL_BATCH, WIDTHS[0], dtype=torch.float64, generator=gen),
                      torch.randn(LOCAL_BATCH, WIDTHS[-1], dtype=torch.float64, generator=gen)))
    return tuple(torch.cat(column) for column in zip(*parts))


def _mine(batch, rank):
    return tuple(t[rank * LOCAL_BATCH:(rank + 1) * LOCAL_BATCH] for t in batch)


# Inside a rank: the rows this rank was handed, {(world size, tag): (x, y)}; the workers set it. Without
# it (a job started without rank_args, as tests/test_lab09_planted_bugs.py does) a rank makes its own.
_OWN = {}


def _my_rows(world_size, tag, rank):
    """Rank ``rank``'s rows of ``global_batch(world_size, tag)``: handed to it, or made here."""
    own = _OWN.get("rows")
    return own[(world_size, tag)] if own is not None else _mine(global_batch(world_size, tag), rank)


def learner_rows(rank, world_size):
    """Every batch's rows rank ``rank`` uses in learner_ddp_worker, made here: {(world size, tag): (x, y)}."""
    keys = [(world_size, tag) for tag in range(MICROBATCHES + 1)]
    rows = {key: _mine(global_batch(*key), rank) for key in keys}
    if world_size == 2:
        rows[(2, 7)] = _mine(global_batch(2, tag=7), rank)
    if world_size == 4:
        rows[(2, 20 + rank // 2)] = _mine(global_batch(2, tag=20 + rank // 2), rank % 2)
    return rows


def pytorch_rows(rank, world_size):
    """The rows rank ``rank`` uses in pytorch_ddp_worker: on all ranks, and (ranks 0, 1) on the pair."""
    rows = {(world_size, 0): _mine(global_batch(world_size), rank)}
    if rank < 2:
        rows[(2, 0)] = _mine(global_batch(2), rank)
    return rows


def _grads(model):
    return [p.grad.clone() if p.grad is not None else None for p in model.parameters() if p.requires_grad]


def _state(model):
    return {name: t.detach().clone() for name, t in model.state_dict().items()}


def learner_ddp_worker(rank, world_size, lab, rows=None):
    """Runs on every rank: the learner's BucketedDDP around a model built with this rank's own seed,
    one step, a no_sync accumulation; on 2 ranks the hold-back run, on 4 the subgroup run.
    ``rows``: this rank's data (:func:`learner_rows`), handed to it by the test."""
    if rows is not None:
        _OWN["rows"] = rows
    groups = [dist.new_group([0, 1]), dist.new_group([2, 3])] if world_size == 4 else None
    model = build_model(seed=rank)            # unequal initial state: the wrapper must broadcast rank 0's
    ddp = lab.BucketedDDP(model, CAP)
    step = {"state": _state(model), "is_module": isinstance(ddp, nn.Module),
            "names": [name for name, _ in ddp.named_parameters()]}
    x, y = _my_rows(world_size, 0, rank)
    with record_traffic() as traffic, _launch_snapshots() as (launched, launch_times), \
            _gradient_times(model) as grad_times:
        _backward(F.mse_loss(ddp(x), y))
        timeline = ddp.finish_gradient_synchronization()
    step.update(grads=_grads(model), collectives=list(traffic.collectives), timeline=[dict(r) for r in timeline],
                launched=launched, launch_times=launch_times, grad_times=sorted(grad_times.items()))
    kept = [(name, p.grad) for name, p in model.named_parameters() if p.grad is not None]   # a caller may keep them
    kept_values = [g.clone() for _, g in kept]
    model.zero_grad()
    counts = []
    for k in range(MICROBATCHES):
        x, y = _my_rows(world_size, k + 1, rank)
        with record_traffic() as traffic:
            if k == MICROBATCHES - 1:
                try:   # a no_sync block left by an exception must not leave the wrapper holding back the last one
                    with ddp.no_sync():
                        raise _LeftByException
                except _LeftByException:
                    pass
                F.mse_loss(ddp(x), y).backward()
                try:   # (a wrapper stuck in no_sync may refuse to finish: said in the no_sync test, not a crash here)
                    ddp.finish_gradient_synchronization()
                except Exception as exc:  # noqa: BLE001
                    step["finish_error"] = f"{type(exc).__name__}: {exc}"[:300]
            else:
                with ddp.no_sync():
                    F.mse_loss(ddp(x), y).backward()
        counts.append(list(traffic.collectives))
    step["accumulated"] = _grads(model)
    step["kept_changed"] = [name for (name, g), value in zip(kept, kept_values) if not torch.equal(g, value)]
    # The first step's timeline, as the object returned then reads now: a wrapper that reuses its records
    # would have written the later step's times into it.
    step["timeline_later"] = [dict(r) for r in timeline] if isinstance(timeline, list) else None
    step["per_microbatch"] = counts
    step["unlaunched"] = _unlaunched_step(model, ddp)
    if world_size == 2:
        step["hold_back"] = _attempt(lambda: hold_back_worker(rank, lab))
    if world_size == 4:
        step["subgroup"] = _attempt(lambda: subgroup_worker(rank, lab, groups[rank // 2]))
    return step


class _LeftByException(Exception):
    """Raised inside a no_sync() block by the test (a learner's loop that fails mid-accumulation)."""


CALLBACK_DELAY = 0.02   # seconds the test holds back the callbacks chained on a bucket's future


class _LateFuture:
    """A Work whose future completes CALLBACK_DELAY s after the all-reduce: what a busy callback thread does.
    A wrapper that waits only on the work (not on its future) then returns before its callback has recorded
    'finish'; one that waits on the future, as the docstring asks, sees no difference."""

    def __init__(self, work):
        self._work, self._future = work, None

    def get_future(self):
        if self._future is None:   # completed from another thread, a while after the real one (gloo runs
            late = self._future = torch.futures.Future()   # callbacks before work.wait() returns: no race there)

            def complete(real):
                threading.Timer(CALLBACK_DELAY, lambda: late.set_result(real.value())).start()
            self._work.get_future().add_done_callback(complete)
        return self._future

    def __getattr__(self, name):
        return getattr(self._work, name)


@contextlib.contextmanager
def _launch_snapshots():
    """A copy of each tensor handed to dist.all_reduce, taken as it is launched (what the bucket held then),
    and the perf_counter() time of each launch; an async all-reduce's future completes a little late
    (:class:`_LateFuture`)."""
    launched, times, original = [], [], dist.all_reduce

    def all_reduce(tensor, *args, **kwargs):
        times.append(time.perf_counter())
        launched.append(tensor.detach().clone())
        work = original(tensor, *args, **kwargs)
        return _LateFuture(work) if kwargs.get("async_op") and work is not None else work

    dist.all_reduce = all_reduce
    try:
        yield launched, times
    finally:
        dist.all_reduce = original


@contextlib.contextmanager
def _gradient_times(model):
    """The perf_counter() time at which each parameter's gradient was accumulated in the backward, by the
    parameter's index (hooks of the test's own, removed afterwards)."""
    times = {}
    params = [p for p in model.parameters() if p.requires_grad]
    def hook(index):
        def note(_):
            times.setdefault(index, time.perf_counter())   # returns nothing: a hook's return would replace .grad
        return note

    handles = [p.register_post_accumulate_grad_hook(hook(i)) for i, p in enumerate(params)]
    try:
        yield times
    finally:
        for handle in handles:
            handle.remove()


def _backward(loss):
    """``loss.backward()``; a hook that found ``p.grad`` still None says what that usually means."""
    try:
        loss.backward()
    except (AttributeError, TypeError) as exc:
        if "NoneType" not in str(exc):
            raise
        raise type(exc)(f"{exc} - was p.grad None in your gradient hook? A hook from register_hook runs before "
                        "the gradient is added into .grad (it receives the gradient as its argument); "
                        "register_post_accumulate_grad_hook runs after, with .grad filled in") from exc


def _unlaunched_step(model, ddp):
    """A third step in which only the first layer's weight gets a gradient: the other buckets never launch,
    and finish_gradient_synchronization must raise RuntimeError (its docstring). After two full steps, a
    wrapper that kept the last step's works would wait on those and carry on. (The weight, 4 kB, fills a
    bucket of its own: its all-reduce runs on every rank alike.) Returns None, or what it raised."""
    model.zero_grad()
    (model.layers[0].weight ** 2).sum().backward()
    try:
        ddp.finish_gradient_synchronization()
    except Exception as exc:  # noqa: BLE001 - read by the test
        return (type(exc).__name__, str(exc)[:300])
    return None


def _attempt(part):
    try:
        return part()
    except Exception as exc:  # noqa: BLE001 - reported by the test that reads this part
        return {"error": f"{type(exc).__name__}: {exc}"}


def hold_back_worker(rank, lab):
    """Rank 1 holds back its backward until rank 0's backward has returned (at most HOLD_BACK s).

    While rank 1 holds back, none of rank 0's all-reduces can complete. With hooks that launch them
    asynchronously, rank 0's backward returns anyway, every bucket launched and none finished.
    A hook that waits for its all-reduce blocks rank 0's backward until rank 1 gives up waiting.
    Then both ranks enter a barrier, which with gloo returns only once every collective launched
    before it on the group has completed (and its future's callbacks have run): a finish time
    recorded at completion is before the moment rank 0 then calls finish_gradient_synchronization().
    Nothing here depends on how fast the machine is: only on what must come before what.
    """
    model = build_model(seed=0)
    ddp = lab.BucketedDDP(model, CAP)
    x, y = _my_rows(2, 7, rank)
    loss = F.mse_loss(ddp(x), y)
    # The signal goes through the process group's store (a key rank 1 polls), not a file: under the
    # grader each rank has a sandbox of its own and no file is shared.
    store, flag = dist.distributed_c10d._get_default_store(), "rank-0-backward-returned"
    if rank == 0:
        start = time.perf_counter()
        loss.backward()
        end = time.perf_counter()
        store.set(flag, "1")
        dist.barrier()
        called = time.perf_counter()
        timeline = ddp.finish_gradient_synchronization()
        return {"backward_start": start, "backward_end": end, "finish_called": called,
                "timeline": [dict(r) for r in timeline]}
    deadline = time.perf_counter() + HOLD_BACK
    while not store.check([flag]) and time.perf_counter() < deadline:
        time.sleep(0.005)     # polled, not waited on: the run's deadlock detector must not see a wait here
    arrived = store.check([flag])
    loss.backward()
    dist.barrier()
    ddp.finish_gradient_synchronization()
    return {"signal_arrived": arrived}


def subgroup_worker(rank, lab, group):
    """4 ranks, groups {0, 1} and {2, 3}: each group wraps its own model (seeded by its rank) and data."""
    model = build_model(seed=10 + rank)
    ddp = lab.BucketedDDP(model, CAP, group=group)
    state = _state(model)
    x, y = _my_rows(2, 20 + rank // 2, rank % 2)
    F.mse_loss(ddp(x), y).backward()
    ddp.finish_gradient_synchronization()
    return {"state": state, "grads": _grads(model)}


def pytorch_ddp_worker(rank, world_size, cap_mib, rows=None):
    """Runs on 4 ranks, no learner code: PyTorch's DDP on all 4 and on a group of ranks 0 and 1."""
    if rows is not None:
        _OWN["rows"] = rows
    pair = dist.new_group([0, 1])
    out = {}
    for size, group in ((world_size, None), (2, pair)):
        if rank >= size:
            continue
        model = build_model(seed=rank)
        ddp = nn.parallel.DistributedDataParallel(model, process_group=group, bucket_cap_mb=cap_mib)
        x, y = _my_rows(size, 0, rank)
        for _ in range(3):   # DDP rebuilds its buckets in gradient order after the first iteration
            model.zero_grad()
            F.mse_loss(ddp(x), y).backward()
        logged = ddp._get_ddp_logging_data()
        out[size] = {"grads": _grads(model), "rebuilt": logged.get("rebuilt_per_bucket_param_indices", "")}
    dist.barrier()
    return out


DDP_METHODS = ("BucketedDDP.broadcast_module_state", "BucketedDDP._grad_ready",
               "BucketedDDP.finish_gradient_synchronization", "BucketedDDP.no_sync")


def _needs(lab):
    return [lab.bucket_assignment] + [getattr(lab.BucketedDDP, name.split(".")[1]) for name in DDP_METHODS]


def _learner(lab, world_size):
    return RUNS.get(("learner", world_size), learner_ddp_worker, world_size, (lab,), timeout=60 + HOLD_BACK,
                    needs=_needs(lab), rank_args=[(learner_rows(r, world_size),) for r in range(world_size)])


def _pytorch():
    return RUNS.get("pytorch", pytorch_ddp_worker, 4, (CAP / 2**20,), timeout=60,
                    rank_args=[(pytorch_rows(r, 4),) for r in range(4)])


def _param_bytes():
    return [p.numel() * p.element_size() for p in build_model().parameters() if p.requires_grad]


def _single_process_grads(world_size, tag=0, seed=0):
    model = build_model(seed)
    x, y = global_batch(world_size, tag)
    F.mse_loss(model(x), y).backward()
    return _grads(model)


def check_grads(got, want, what, group_size, world_size=None):
    """``got`` equals ``want`` (lists of gradients, float64, to 1e-12); a wrong scale is named (``world_size``: of
    the default group, when ``group_size`` is a subgroup's)."""
    if isinstance(got, list) and len(got) == len(want) and all(
            torch.is_tensor(g) and g.shape == w.shape for g, w in zip(got, want)):
        ratio = float(torch.median(torch.cat([(g / w).reshape(-1) for g, w in zip(got, want)])))
        hints = {float(group_size): "gradients summed, not averaged over the d ranks?", 1 / group_size: "divided by d "
                 "twice?"}
        if world_size and world_size != group_size:   # on a subgroup d is the group's size, not the world's
            key = group_size / world_size
            text = (f"divided by the world's size ({world_size}, dist.get_world_size()) instead of the group's "
                    f"({group_size}, dist.get_world_size(self.group))?")
            hints[key] = f"{text}; or {hints[key]}" if key in hints else text
        if abs(ratio - 1) > 1e-6 and not any(abs(ratio / r - 1) < 1e-6 for r in hints):
            fail(f"{what}: the gradients differ by no clean factor (median ratio {ratio:.4g}): a bucket read before its "
                 "all-reduce completed (every bucket's work waited for in finish_gradient_synchronization()?), or "
                 "gradients copied to or from the wrong slice of a bucket?")
        if abs(ratio - 1) > 1e-6:
            expect_close(ratio, 1.0, rel=1e-6, what=f"{what}: the gradients, as a multiple of the expected ones "
                         "(median ratio)", hints=hints)
        for i, (g, w) in enumerate(zip(got, want)):   # most right, one wrong: a race shows in that one
            mask = w != 0
            if (g - w).abs().max() <= 1e-12 or not mask.any():
                continue
            ratios = g[mask] / w[mask]
            low, high = float(ratios.min()), float(ratios.max())
            # A wrong scale is one factor for every element, float32 rounding a spread of about 1e-7: a spread
            # over 0.1% is neither (values from before the all-reduce, or another slice).
            if high - low > 1e-3 * max(abs(low), abs(high), 1.0):
                fail(f"{what}: item {i} ({g.numel()} elements) is off by no single factor (got / expected from "
                     f"{low:.4g} to {high:.4g}){' while the items before it are right' if i else ''}: its bucket "
                     "read or divided before its all-reduce completed (wait on each bucket's work first, then "
                     "divide and copy back), or copied to or from the wrong slice of the bucket?")
            break
    expect_close(got, want, rel=0.0, abs=1e-12, what=what)


@pytest.mark.points(3)
@pytest.mark.parametrize("world_size", [2, 4])
def test_every_rank_starts_from_rank_0s_parameters_and_buffers(lab, world_size):
    # Each rank built its model with its own seed (parameters, a frozen parameter, a buffer): as
    # DistributedDataParallel does, the wrapper broadcasts rank 0's state at construction.
    want = _state(build_model(seed=0))
    for rank, result in enumerate(_learner(lab, world_size)):
        if not result["is_module"]:
            fail(f"rank {rank}: BucketedDDP is not an nn.Module: it must wrap the model like DistributedDataParallel")
        if not result["names"] or not all(name.startswith("module.") for name in result["names"]):
            fail(f"rank {rank}: the wrapper's parameters are {result['names'][:3]}..., expected the model's under "
                 "'module.' (keep the model as self.module)")
        for name, value in want.items():
            got = result["state"].get(name)
            if rank and got is not None and torch.equal(got, _state(build_model(seed=rank))[name]):
                fail(f"rank {rank}: {name} is still this rank's own initial value after construction: broadcast "
                     "rank 0's parameters and buffers (the frozen ones too) in __init__")
            expect_close(got, value, rel=0.0, abs=0.0, what=f"rank {rank}: {name} after construction (rank 0's)")


@pytest.mark.points(3)
@pytest.mark.parametrize("world_size", [2, 4])
def test_gradients_after_a_step_equal_pytorch_ddp(lab, world_size):
    mine = _learner(lab, world_size)
    theirs = _pytorch()
    for rank in range(world_size):
        check_launches(mine[rank]["launched"], rank, world_size)   # a bucket launched early: say so, not just "differ"
        check_grads(mine[rank]["grads"], theirs[rank][world_size]["grads"],
                    f"rank {rank}: gradients against DistributedDataParallel's", world_size)


@pytest.mark.parametrize("world_size", [2, 4])
def test_gradients_equal_the_single_process_gradient_of_the_global_batch(lab, world_size):
    expected = _single_process_grads(world_size)
    for rank, result in enumerate(_learner(lab, world_size)):
        check_launches(result["launched"], rank, world_size)
        check_grads(result["grads"], expected, f"rank {rank}: gradients against one process on the global batch",
                    world_size)


def test_pytorch_ddp_buckets_equal_the_plan_with_the_same_cap(lab):
    """DistributedDataParallel's rebuilt buckets (bucket_cap_mb = CAP / 2**20 MiB) are this plan."""
    yours = lab.bucket_assignment(_param_bytes(), CAP)   # first: a starter fails before DDP's 4-rank run
    logged = _pytorch()[0][4]["rebuilt"]
    theirs = [[int(i) for i in bucket.split()] for bucket in logged.split(",")]
    expect_close(yours, theirs,
                 what=f"bucket_assignment of the test model at cap {CAP} against DDP's rebuilt buckets")


@pytest.mark.points(3)
@pytest.mark.parametrize("world_size", [2, 4])
def test_one_allreduce_per_bucket_per_step_with_the_planned_bytes(lab, world_size):
    plan = EXPECTED("bucket_assignment", _param_bytes(), CAP)
    expected = [["all_reduce", b] for b in reference.bucket_bytes(_param_bytes(), plan)]
    for rank, result in enumerate(_learner(lab, world_size)):
        got = [list(c) for c in result["collectives"]]
        what = f"rank {rank}: the collectives of one step (name, bytes), against the plan"
        if len(got) != len(expected):   # show both lists: the count alone does not say which buckets differ
            same_total = sum(b for _, b in expected) == sum(c[1] for c in got if len(c) == 2 and
                                                            isinstance(c[1], (int, float)))
            fail(f"{what}: {len(got)} all-reduces {got}, the plan's {len(expected)} {expected}" + (
                 ": the same bytes in other buckets: the plan's sizes and its cap are in bytes (param_bytes: numel x "
                 "8 for float64), not elements?" if same_total else ""))
        expect_close(got, expected, what=what, causes=known_ratios(element_bytes=8))   # the model is float64


@pytest.mark.parametrize("world_size", [2, 4])
def test_timeline_has_each_bucket_ready_then_launched_then_finished(lab, world_size):
    plan = EXPECTED("bucket_assignment", _param_bytes(), CAP)
    sizes = reference.bucket_bytes(_param_bytes(), plan)
    for rank, result in enumerate(_learner(lab, world_size)):
        timeline = result["timeline"]
        expect_close([r.get("bucket") for r in timeline], list(range(len(plan))), what=f"rank {rank}: timeline buckets")
        expect_close([r.get("bytes") for r in timeline], sizes, what=f"rank {rank}: timeline bytes",
                     causes=known_ratios(element_bytes=8))   # the model is float64
        for r in timeline:
            if all(isinstance(r.get(k), float) for k in ("ready", "start")) and r.get("finish") is None:
                fail(f"rank {rank}, bucket {r.get('bucket')}: no 'finish' in its record when "
                     f"finish_gradient_synchronization() returned ({r}). The test completes each bucket's future "
                     f"{CALLBACK_DELAY * 1e3:g} ms after its all-reduce, as a busy callback thread may: wait on each "
                     "bucket's future too (work.wait() returns before the callback that records 'finish' has run)")
            if not all(isinstance(r.get(k), float) for k in ("ready", "start", "finish")):
                fail(f"rank {rank}, bucket {r.get('bucket')}: ready, start and finish must be perf_counter() "
                     f"seconds, got {r}")
            if not r["ready"] <= r["start"] <= r["finish"]:
                fail(f"rank {rank}, bucket {r['bucket']}: expected ready <= start <= finish, got {r}")
        readies = [r["ready"] for r in timeline]
        if readies != sorted(readies):
            fail(f"rank {rank}: buckets became ready out of order: {readies}")
        arrivals = {int(i): t for i, t in result["grad_times"]}
        for r, bucket in zip(timeline, plan):
            times = sorted(arrivals[i] for i in bucket if i in arrivals)
            if len(times) >= 2 and r["ready"] < times[-2]:   # all but the bucket's last gradient came before it
                fail(f"rank {rank}, bucket {r['bucket']}: 'ready' was recorded {times[-2] - r['ready']:.6f} s before "
                     f"the bucket's second-to-last gradient arrived (its parameters {bucket} reach their .grad one "
                     "by one in the backward): record 'ready' when the bucket's LAST gradient is in, where its count "
                     "of missing gradients reaches 0, not when the first one arrives")
        launches = result["launch_times"]
        if len(launches) == len(timeline):       # one all-reduce per bucket (else the collectives test says so)
            for r, launched in zip(timeline, launches):
                late = ("'ready'", r["ready"] - launched) if launched < r["ready"] else ("'start'", launched - r["start"])
                if not r["ready"] <= launched <= r["start"]:
                    which = "after" if late[0] == "'ready'" else "before"
                    fail(f"rank {rank}, bucket {r['bucket']}: its all-reduce was launched {late[1]:.6f} s "
                         f"{'before' if which == 'after' else 'after'} its {late[0]} time ({late[0]} taken {which} "
                         "the launch): record 'ready' when the bucket's last gradient is in, BEFORE "
                         "dist.all_reduce(..., async_op=True), and 'start' right after that call returns")


def test_a_returned_timeline_is_not_rewritten_by_the_next_step(lab):
    """finish_gradient_synchronization returns step 1's timeline; after the next step (a no_sync accumulation
    then a synchronised backward) the records returned for step 1 must still hold step 1's times (Lesson 08
    plots several steps' timelines side by side)."""
    for rank, result in enumerate(_learner(lab, 2)):
        if not result["timeline"]:
            fail(f"rank {rank}: finish_gradient_synchronization returned an empty timeline {result['timeline']!r}")
        if result["timeline_later"] != result["timeline"]:
            fail(f"rank {rank}: the timeline returned after step 1 changed during the next step: "
                 "finish_gradient_synchronization must start fresh records for the next step (new dicts), not "
                 f"reuse the ones it returned. Step 1's records: {result['timeline']}; after step 2 they read: "
                 f"{result['timeline_later']}")


def test_the_gradients_of_a_step_are_not_rewritten_by_the_next_step(lab):
    """After step 1 the caller keeps the p.grad tensors (zero_grad then sets p.grad to None); the next step's
    all-reduces must not write into them: finish_gradient_synchronization copies the averages into each
    p.grad, and a p.grad that is a view of a bucket buffer is rewritten by the next step (r23l)."""
    for rank, result in enumerate(_learner(lab, 2)):
        if result["kept_changed"]:
            fail(f"rank {rank}: the gradients step 1 left in p.grad of {', '.join(result['kept_changed'])} changed "
                 "during the next step: they share memory with a bucket buffer the next all-reduce reuses. Copy "
                 "each slice of the averaged buffer into p.grad (p.grad.copy_(...)) instead of making p.grad a view of it")


@pytest.mark.parametrize("world_size", [2, 4])
def test_a_step_whose_buckets_never_all_launch_raises_runtime_error(lab, world_size):
    """The docstring's promise: finish_gradient_synchronization raises RuntimeError when a bucket was never
    launched in this backward (a parameter got no gradient), also after earlier steps went well."""
    for rank, result in enumerate(_learner(lab, world_size)):
        raised = result["unlaunched"]
        if raised is None:
            fail(f"rank {rank}: after two full steps, a backward that gave only layers[0].weight a gradient "
                 "launched one bucket of several, and finish_gradient_synchronization() raised nothing: it "
                 "must raise RuntimeError naming the buckets never launched. Are the last step's works still "
                 "there (reset them to None at the end of finish, as the counters)?")
        if raised[0] != "RuntimeError":
            fail(f"rank {rank}: after two full steps, a backward that gave only layers[0].weight a gradient "
                 f"made finish_gradient_synchronization() raise {raised[0]}: {raised[1]} - expected RuntimeError "
                 "naming the buckets never launched (check for them before waiting: the last step's works, "
                 "if kept, are not this step's)")


def check_launches(launched, rank, world_size):
    """Each bucket's all-reduce starts once every gradient of the bucket is in its buffer (zeros tell)."""
    model = build_model(seed=0)               # every rank holds rank 0's parameters after construction
    x, y = _mine(global_batch(world_size), rank)
    F.mse_loss(model(x), y).backward()
    grads = _grads(model)
    plan = EXPECTED("bucket_assignment", _param_bytes(), CAP)
    for k, got in enumerate(launched):
        fits = [b for b, bucket in enumerate(plan) if sum(grads[i].numel() for i in bucket) == got.numel()]
        if not fits or got.dtype != torch.float64:
            continue                           # not a bucket of the plan: the bytes test names it
        zeros = int((got == 0).sum())
        want = min(int(sum((grads[i] == 0).sum() for i in plan[b])) for b in fits)
        if zeros > want:
            b = fits[0]
            sizes = sorted({grads[i].numel() for i in plan[b]})
            fail(f"rank {rank}: all-reduce {k} (a bucket of {got.numel()} elements, e.g. bucket {b} = parameters "
                 f"{plan[b]}) was launched while {zeros - want} of its elements were still zero: the bucket was "
                 f"all-reduced before all its gradients were copied in (its parameters have {sizes} elements). "
                 "Launch a bucket's all-reduce from the hook of its LAST gradient: when its count of missing "
                 "gradients reaches 0, not 1 (and not on the first gradient)")


@pytest.mark.parametrize("world_size", [2, 4])
def test_each_bucket_is_all_reduced_only_once_all_its_gradients_are_in(lab, world_size):
    for rank, result in enumerate(_learner(lab, world_size)):
        check_launches(result["launched"], rank, world_size)


@pytest.mark.points(2)
def test_no_sync_sends_nothing_until_the_last_microbatch(lab):
    plan = EXPECTED("bucket_assignment", _param_bytes(), CAP)
    # Expected: the gradients of the MICROBATCHES losses, summed, averaged over ranks.
    expected = [sum(g) for g in zip(*(_single_process_grads(2, k + 1) for k in range(MICROBATCHES)))]
    for rank, result in enumerate(_learner(lab, 2)):
        calls = [len(c) for c in result["per_microbatch"]]
        if result.get("finish_error") and calls[-1]:
            fail(f"rank {rank}: finish_gradient_synchronization after the last micro-batch raised {result['finish_error']}")
        if plan and calls[-1] == 0 and not any(calls[:-1]):
            raised = f" (and finish_gradient_synchronization raised {result['finish_error']})" \
                if result.get("finish_error") else ""
            fail(f"rank {rank}: the last micro-batch all-reduced nothing{raised} (collectives per micro-batch {calls}). Just "
                 "before it the test left a no_sync() block by an exception: the wrapper stayed in no_sync. Set the flag "
                 "back in a finally block (try: yield / finally: ...), so an exception inside the block cannot keep it")
        expect_close(calls, [0] * (MICROBATCHES - 1) + [len(plan)],
                     what=f"rank {rank}: collectives per micro-batch (none under no_sync, then one per bucket)")
        check_grads(result["accumulated"], expected, f"rank {rank}: gradients accumulated over {MICROBATCHES} "
                    "micro-batches", 2)


@pytest.mark.points(3)
def test_hooks_launch_every_allreduce_during_backward_without_waiting_for_it(lab):
    # Rank 1 holds back its backward until rank 0's backward returns: none of rank 0's all-reduces can
    # finish before then. Order of events, not timing: a correct wrapper's backward returns at once,
    # every bucket launched, none finished; a hook that waits blocks the backward until rank 1 gives up.
    # A barrier then completes every all-reduce before rank 0 calls finish_gradient_synchronization().
    results = _learner(lab, 2)
    zero, one = results[0]["hold_back"], results[1]["hold_back"]
    for rank, part in enumerate((zero, one)):
        if "error" in part:
            fail(f"rank {rank}: {part['error']}")
    if not one["signal_arrived"]:
        fail(f"rank 0's backward did not return while rank 1 held its gradients back ({HOLD_BACK:g} s): a hook waits "
             "for its all-reduce (work.wait() in _grad_ready?). Launch with async_op=True and wait only in "
             "finish_gradient_synchronization()")
    # One record per bucket first: an empty timeline (nothing launched) would pass every check below.
    plan = EXPECTED("bucket_assignment", _param_bytes(), CAP)
    expect_close([r.get("bucket") for r in zero["timeline"]], list(range(len(plan))),
                 what="rank 0: the timeline's buckets (one record per bucket, each launched from its hook)")
    end = zero["backward_end"]
    for r in zero["timeline"]:
        if not isinstance(r.get("start"), float) or not isinstance(r.get("finish"), float):
            fail(f"rank 0, bucket {r.get('bucket')}: no start or finish time in the timeline: {r}")
        if r["start"] > end:
            fail(f"rank 0: bucket {r['bucket']} was launched {(r['start'] - end) * 1e3:.1f} ms after its backward "
                 "returned: launch each bucket's all-reduce from the hook, the moment the bucket is full")
        if r["finish"] < end:
            fail(f"rank 0: bucket {r['bucket']} 'finished' {(end - r['finish']) * 1e3:.1f} ms before its backward "
                 "returned, while rank 1 had sent nothing: record finish when the all-reduce completes (a callback "
                 "on work.get_future())")
        if r["finish"] > zero["finish_called"]:
            fail(f"rank 0: bucket {r['bucket']} 'finished' {(r['finish'] - zero['finish_called']) * 1e6:.0f} us after "
                 "finish_gradient_synchronization() was called, though every all-reduce had completed before (a "
                 "barrier waited for them): record finish when the all-reduce completes (a callback on "
                 "work.get_future()), not when you wait for it")


@pytest.mark.points(3)
def test_ddp_on_a_subgroup_talks_only_to_its_group(lab):
    # 4 ranks in groups {0, 1} and {2, 3}; each rank seeds its own model; each group has its own data.
    check_subgroup(_learner(lab, 4))


def check_subgroup(results):
    """Each group of two starts from its first rank's state and averages over its own ranks only."""
    for rank, result in enumerate(results):
        if "error" in result["subgroup"]:
            group = [2 * (rank // 2), 2 * (rank // 2) + 1]
            fail(f"rank {rank}: BucketedDDP(model, cap, group=<ranks {group[0]}, {group[1]}>) raised "
                 f"{subgroup_failure(result['subgroup']['error'], group, world=4)}")
    group_grads = {g: _single_process_grads(2, tag=20 + g, seed=10 + 2 * g) for g in (0, 1)}
    # An all-reduce on the default group sums all 4 ranks: divided by the group's 2, G0 + G1; by 4, half that.
    default_group = [[a + b for a, b in zip(group_grads[0], group_grads[1])],
                     [(a + b) / 2 for a, b in zip(group_grads[0], group_grads[1])]]
    for rank, result in enumerate(results):
        g, first = rank // 2, 2 * (rank // 2)
        part = result["subgroup"]
        want_state = _state(build_model(seed=10 + first))
        for name, value in want_state.items():
            got = part["state"].get(name)
            if g and got is not None and torch.equal(got, _state(build_model(seed=10))[name]):
                fail(f"rank {rank} (group [{first}, {first + 1}]): after construction {name} is global rank 0's, "
                     f"not its group's first rank's ({first}): broadcast on self.group from group rank 0 "
                     "(group_src=0, group=self.group)")
            expect_close(got, value, rel=0.0, abs=0.0, what=f"rank {rank} (group [{first}, {first + 1}]): {name} "
                         f"after construction (rank {first}'s)")
        grads = part["grads"]
        if any(all(torch.is_tensor(a) for a in grads) and len(grads) == len(wrong) and all(
                torch.allclose(a, b, rtol=0, atol=1e-12) for a, b in zip(grads, wrong)) for wrong in default_group):
            fail(f"rank {rank} (group [{first}, {first + 1}]): the gradients mix both groups' (all 4 ranks summed): "
                 "the all-reduce ran on the default group; pass group=self.group")
        check_grads(grads, group_grads[g], f"rank {rank} (group [{first}, {first + 1}]): gradients against one "
                    "process on the group's batch", 2, world_size=4)


# -- overlap, measured -------------------------------------------------------------------------------

BIG_WIDTHS = [1024] * 9               # eight 1024 x 1024 float32 layers: 4 MiB of weights each
BIG_BATCH, BIG_CAP, STEPS = 16, 4_500_000, 5   # two layers per bucket: four 8.4 MB all-reduces
FACTOR = 3.0                          # measured exposed time within 3x of the prediction (shared CPUs)
MIN_CPU_SHARE = 0.7                   # below this, other processes set the timings: only the lower side is checked


def big_model():
    torch.manual_seed(0)
    layers = []
    for i, (a, b) in enumerate(zip(BIG_WIDTHS, BIG_WIDTHS[1:])):
        layers += [nn.Linear(a, b)] + ([nn.ReLU()] if i < len(BIG_WIDTHS) - 2 else [])
    return nn.Sequential(*layers)


def overlap_worker(rank, world_size, lab):
    """Runs on every rank: measured compute (no_sync backward), measured link, overlapped steps.

    Returns plain data: per compute-only step, the backward time and each parameter's gradient time;
    per overlapped step, the backward time, the wait after it, and the learner's timeline; the median
    blocking all-reduce time of each bucket size. Times are seconds from the step's backward start.
    """
    model = big_model()
    params = list(model.parameters())
    grad_time = [0.0] * len(params)
    for i, p in enumerate(params):
        p.register_post_accumulate_grad_hook(lambda p, i=i: grad_time.__setitem__(i, time.perf_counter()))
    ddp = lab.BucketedDDP(model, BIG_CAP)
    gen = torch.Generator().manual_seed(rank)
    x, y = torch.randn(BIG_BATCH, BIG_WIDTHS[0], generator=gen), torch.randn(BIG_BATCH, BIG_WIDTHS[-1], generator=gen)

    def step(sync):
        model.zero_grad(set_to_none=False)
        if sync:
            loss = F.mse_loss(ddp(x), y)
            dist.barrier()
            t0 = time.perf_counter()
            loss.backward()
            t1 = time.perf_counter()
            timeline = ddp.finish_gradient_synchronization()
            t2 = time.perf_counter()
            rel = [{k: (v - t0 if k in ("ready", "start", "finish") else v) for k, v in r.items()} for r in timeline]
            return {"t0": t0, "backward": t1 - t0, "wait": t2 - t1, "timeline": rel}
        with ddp.no_sync():
            loss = F.mse_loss(ddp(x), y)
            dist.barrier()
            t0 = time.perf_counter()
            cpu0 = time.thread_time()
            loss.backward()
        wall = time.perf_counter() - t0
        return {"backward": wall, "grad_times": [t - t0 for t in grad_time],
                "cpu_share": (time.thread_time() - cpu0) / wall}

    for _ in range(2):   # warm-up: allocations, gloo connections
        step(True)
        step(False)
    compute, overlapped = [], []
    for _ in range(STEPS):   # interleaved, so that both see the same load on a shared machine
        compute.append(step(False))
        overlapped.append(step(True))
    link, link_fastest = {}, {}
    for nbytes in sorted({r["bytes"] for r in overlapped[0]["timeline"]}):
        buffer, times = torch.zeros(nbytes // 4), []
        for _ in range(STEPS):
            dist.barrier()
            start = time.perf_counter()
            dist.all_reduce(buffer)
            times.append(time.perf_counter() - start)
        link[nbytes], link_fastest[nbytes] = statistics.median(times), min(times)
    return {"compute": compute, "overlapped": overlapped, "link": link, "link_fastest": link_fastest}


def _big_param_bytes():
    return [p.numel() * 4 for p in big_model().parameters()]


def _last_finish(ready, comm):
    """When the last all-reduce ends, one at a time in bucket order, each starting once its bucket is ready and
    the previous one is done (the rule Lab 09's overlapped_allreduce_finish implements; written out here, since
    the times are measured in the run and no record can hold them)."""
    finish = 0.0
    for r, c in zip(ready, comm):
        finish = max(r, finish) + c
    return finish


def _overlap(lab):
    return RUNS.get("overlap", overlap_worker, 2, (lab,), timeout=90,
                    needs=[lab.bucket_assignment, lab.overlapped_allreduce_finish])


def test_measured_exposed_time_is_within_3x_of_the_prediction(lab):
    """Prediction: the finish time (_last_finish) of the buckets' measured ready times (compute-only
    backward, slowest rank) and measured blocking all-reduce times, minus the backward time.

    Measured must not be below a third of the prediction made with each all-reduce's fastest run (a step
    cannot beat its own link and compute; load only lengthens times, so the fastest run keeps a busy
    machine from failing correct code, as the median did once under the grader). It must not exceed 3x
    the prediction made with the median runs either, when each rank's backward got at least 70% of a
    core and the load average stays within 1.5x the cores; on an oversubscribed machine other processes
    set the timings, and only the lower side is checked. (A finish that does not wait shows here only on a quiet machine; the gradient tests catch
    it anywhere.)"""
    results = _overlap(lab)
    share = min(statistics.median(s["cpu_share"] for s in r["compute"]) for r in results)
    plan = EXPECTED("bucket_assignment", _big_param_bytes(), BIG_CAP)
    sizes = reference.bucket_bytes([p.numel() * 4 for p in big_model().parameters()], plan)
    backward = max(statistics.median(s["backward"] for s in r["compute"]) for r in results)
    ready = [max(statistics.median(max(s["grad_times"][i] for i in bucket) for s in r["compute"]) for r in results)
             for bucket in plan]
    for rank, r in enumerate(results):   # the link was timed at the sizes the timeline reports
        got = [record.get("bytes") for record in r["overlapped"][0]["timeline"]]
        if got != sizes:
            doubled = len(got) == len(sizes) and all(g == 2 * n for g, n in zip(got, sizes))
            fail(f"rank {rank}: the timeline's bucket bytes {got}, the plan's {sizes} for this float32 model" +
                 (": x2, float64 buffers for float32 gradients (a bucket's dtype is its parameters')"
                  if doubled else ""))
    comm = [max(r["link"][n] for r in results) for n in sizes]
    predicted = max(0.0, _last_finish(ready, comm) - backward)
    fastest = max(0.0, _last_finish(ready, [min(r["link_fastest"][n] for r in results) for n in sizes]) - backward)
    # Per step, for the job: the last rank's gradients are ready this long after the last rank's backward
    # ended (perf_counter is one clock for all processes of a machine). A rank that waits for a slower
    # peer's backward is not waiting for the network.
    per_step = [max(r["overlapped"][j]["t0"] + r["overlapped"][j]["backward"] + r["overlapped"][j]["wait"]
                    for r in results) -
                max(r["overlapped"][j]["t0"] + r["overlapped"][j]["backward"] for r in results)
                for j in range(STEPS)]
    measured = statistics.median(per_step)
    detail = (f"measured exposed {measured * 1e3:.1f} ms vs predicted {predicted * 1e3:.1f} ms; compute-only backward "
              f"{backward * 1e3:.1f} ms, bucket ready {[round(t * 1e3, 1) for t in ready]} ms, all-reduce "
              f"{[round(t * 1e3, 1) for t in comm]} ms; each rank's backward got {share:.0%} of a core")
    print(detail)
    if measured < fastest / FACTOR:
        fail(f"faster than the link and compute allow (does finish_gradient_synchronization() wait?): {detail}; "
             f"with each all-reduce's fastest run, predicted {fastest * 1e3:.1f} ms")
    # The backward's share is measured in the compute-only runs; the overlapped steps' all-reduce threads
    # also need a core, and a machine running other work beside the job starves them (seen once: 34 ms
    # exposed against 7.5 ms predicted, at 98% of a core, with a second test run on the 2 cores).
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    oversubscribed = load > 1.5 * (os.cpu_count() or 1)
    if share >= MIN_CPU_SHARE and not oversubscribed and measured > predicted * FACTOR:
        fail(f"more than {FACTOR:g}x the prediction: {detail}; load average {load:.1f} on {os.cpu_count()} cores")
