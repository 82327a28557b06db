"""Lab 09's rank side: the models, the data, and what every rank runs (the learner's DDP, PyTorch's).

``test_lab.py`` reads as the spec; this file holds what its ranks execute and what both sides
share (``Net``, ``global_batch``, ``big_model``). Grader isolation: a rank gets its own rows of each
batch from the test through ``rank_args``; ``SEED`` is drawn where this file is imported, and a rank
started without its rows (a planted-bug test) makes them from the default seed. Rank workers return
plain data; every expected value is computed in the test process.
"""

import contextlib
import statistics
import threading
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from commtax.ranks.traffic import record_traffic
from commtax.testing import input_seed, stream_seed

SEED = input_seed(0)  # the batches: secret under the grader, drawn in the test process and never sent to a rank


WIDTHS = [16, 32, 32, 24, 8]  # four Linear layers, float64: 8 trainable parameters
LOCAL_BATCH, MICROBATCHES = 6, 3
CAP = 1200  # bytes: several buckets of one or two parameters each
HOLD_BACK = 10.0  # seconds rank 1 waits for rank 0's backward to return (it takes ms)


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
        self.input_scale = nn.Parameter(
            torch.full((WIDTHS[0],), 1.0 + 0.1 * seed, dtype=torch.float64), requires_grad=False
        )
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
        parts.append(
            (
                torch.randn(LOCAL_BATCH, WIDTHS[0], dtype=torch.float64, generator=gen),
                torch.randn(LOCAL_BATCH, WIDTHS[-1], dtype=torch.float64, generator=gen),
            )
        )
    return tuple(torch.cat(column) for column in zip(*parts))


def _mine(batch, rank):
    return tuple(t[rank * LOCAL_BATCH : (rank + 1) * LOCAL_BATCH] for t in batch)


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
    model = build_model(seed=rank)  # unequal initial state: the wrapper must broadcast rank 0's
    ddp = lab.BucketedDDP(model, CAP)
    step = {
        "state": _state(model),
        "is_module": isinstance(ddp, nn.Module),
        "names": [name for name, _ in ddp.named_parameters()],
    }
    x, y = _my_rows(world_size, 0, rank)
    with (
        record_traffic() as traffic,
        _launch_snapshots() as (launched, launch_times),
        _gradient_times(model) as grad_times,
    ):
        _backward(F.mse_loss(ddp(x), y))
        timeline = ddp.finish_gradient_synchronization()
    step.update(
        grads=_grads(model),
        collectives=list(traffic.collectives),
        timeline=[dict(r) for r in timeline],
        launched=launched,
        launch_times=launch_times,
        grad_times=sorted(grad_times.items()),
    )
    kept = [(name, p.grad) for name, p in model.named_parameters() if p.grad is not None]  # a caller may keep them
    kept_values = [g.clone() for _, g in kept]
    model.zero_grad()
    counts = []
    for k in range(MICROBATCHES):
        x, y = _my_rows(world_size, k + 1, rank)
        with record_traffic() as traffic:
            if k == MICROBATCHES - 1:
                try:  # a no_sync block left by an exception must not leave the wrapper holding back the last one
                    with ddp.no_sync():
                        raise _LeftByException
                except _LeftByException:
                    pass
                F.mse_loss(ddp(x), y).backward()
                try:  # (a wrapper stuck in no_sync may refuse to finish: said in the no_sync test, not a crash here)
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


CALLBACK_DELAY = 0.02  # seconds the test holds back the callbacks chained on a bucket's future


class _LateFuture:
    """A Work whose future completes CALLBACK_DELAY s after the all-reduce: what a busy callback thread does.
    A wrapper that waits only on the work (not on its future) then returns before its callback has recorded
    'finish'; one that waits on the future, as the docstring asks, sees no difference."""

    def __init__(self, work):
        self._work, self._future = work, None

    def get_future(self):
        if self._future is None:  # completed from another thread, a while after the real one (gloo runs
            late = self._future = torch.futures.Future()  # callbacks before work.wait() returns: no race there)

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
            times.setdefault(index, time.perf_counter())  # returns nothing: a hook's return would replace .grad

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
        raise type(exc)(
            f"{exc} - was p.grad None in your gradient hook? A hook from register_hook runs before "
            "the gradient is added into .grad (it receives the gradient as its argument); "
            "register_post_accumulate_grad_hook runs after, with .grad filled in"
        ) from exc


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
        return {
            "backward_start": start,
            "backward_end": end,
            "finish_called": called,
            "timeline": [dict(r) for r in timeline],
        }
    deadline = time.perf_counter() + HOLD_BACK
    while not store.check([flag]) and time.perf_counter() < deadline:
        time.sleep(0.005)  # polled, not waited on: the run's deadlock detector must not see a wait here
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
        for _ in range(3):  # DDP rebuilds its buckets in gradient order after the first iteration
            model.zero_grad()
            F.mse_loss(ddp(x), y).backward()
        logged = ddp._get_ddp_logging_data()
        out[size] = {"grads": _grads(model), "rebuilt": logged.get("rebuilt_per_bucket_param_indices", "")}
    dist.barrier()
    return out


# -- overlap, measured ------------------------------------------------------------------------------

BIG_WIDTHS = [1024] * 9  # eight 1024 x 1024 float32 layers: 4 MiB of weights each
BIG_BATCH, BIG_CAP, STEPS = 16, 4_500_000, 5  # two layers per bucket: four 8.4 MB all-reduces


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
        return {
            "backward": wall,
            "grad_times": [t - t0 for t in grad_time],
            "cpu_share": (time.thread_time() - cpu0) / wall,
        }

    for _ in range(2):  # warm-up: allocations, gloo connections
        step(True)
        step(False)
    compute, overlapped = [], []
    for _ in range(STEPS):  # interleaved, so that both see the same load on a shared machine
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
