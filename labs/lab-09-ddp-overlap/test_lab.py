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

import os
import random
import statistics
from pathlib import Path

import pytest
import torch

from commtax.boundary.byfile import load_module_from_file
from commtax.formulas import ddp as reference
from commtax.recorded import Expected
from commtax.testing import SharedRuns, expect_close, expect_value_error, fail, known_ratios

# The harness is beside this file, loaded by path (lab folders are not packages; the ranks load _workers.py
# the same way): _workers.py the rank side (the models, the data, what every rank runs), _checks.py the
# references the runs are compared with and what a difference suggests.
_here = Path(__file__).resolve().parent
load_module_from_file("lab_09_workers", str(_here / "_workers.py"))
load_module_from_file("lab_09_checks", str(_here / "_checks.py"))
from lab_09_checks import (  # noqa: E402  (loaded just above)
    _big_param_bytes,
    _finish,
    _last_finish,
    _param_bytes,
    _plan,
    _single_process_grads,
    _tick_simulation,
    _walk,
    bucket_mistake,
    check_grads,
    check_launches,
    check_subgroup,
    check_timeline,
)
from lab_09_workers import (  # noqa: E402
    BIG_CAP,
    CAP,
    HOLD_BACK,
    MICROBATCHES,
    STEPS,
    _state,
    big_model,
    build_model,
    learner_ddp_worker,
    learner_rows,
    overlap_worker,
    pytorch_ddp_worker,
    pytorch_rows,
)

RUNS = SharedRuns()
# commtax.formulas.ddp's bucket plans (expected.py; expected.json in the release, recorded for these inputs)
EXPECTED = Expected(Path(__file__).resolve().parent)


# -- the bucket plan -------------------------------------------------------------------------------


def test_buckets_fill_from_the_last_parameter_and_close_on_reaching_the_cap(lab):
    _plan(lab, [4, 4, 4, 4], 8, [[3, 2], [1, 0]])  # 8 reaches 8: closes
    _plan(lab, [4, 4, 4, 4], 5, [[3, 2], [1, 0]])  # 8 exceeds 5: closes
    _plan(lab, [4, 4, 4, 4], 9, [[3, 2, 1], [0]])  # the last bucket is short
    _plan(lab, [4, 4, 4, 4], 4, [[3], [2], [1], [0]])
    _plan(lab, [4, 4, 4, 4], 10**9, [[3, 2, 1, 0]])  # one bucket: no overlap
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
        if (
            isinstance(plan, list)
            and plan != _walk(sizes, cap, list(reversed(range(len(sizes)))))
            and bucket_mistake(plan, sizes, cap)
        ):
            fail(f"{what}{bucket_mistake(plan, sizes, cap)}")
        if not isinstance(plan, list) or not all(isinstance(b, list) and b for b in plan):
            fail(f"{what}: expected a list of non-empty lists of indices")
        if [i for bucket in plan for i in bucket] != list(reversed(range(len(sizes)))):
            fail(f"{what}: every index once, from the last to the first")
        for bucket in plan[:-1]:
            total = sum(sizes[i] for i in bucket)
            if not (total >= cap and total - sizes[bucket[-1]] < cap):
                fail(
                    f"{what}: bucket {bucket} holds {total} bytes; a closed bucket reaches the cap, and would not "
                    "without its last parameter"
                )
        expect_close(plan, EXPECTED("bucket_assignment", sizes, cap), what=what + " against commtax.formulas.ddp")


# -- the overlapped finish time ----------------------------------------------------------------------


def test_finish_time_on_hand_checked_timelines(lab):
    _finish(lab, [1, 2, 3], [2, 2, 0.5], 5.5)  # starts 1, 3, 5
    _finish(lab, [0, 10, 20], [1, 1, 1], 21)  # the link idles: a tail of 1
    _finish(lab, [0, 0, 0], [1, 2, 3], 6)  # all ready at once: serial
    _finish(lab, [5], [0], 5)
    expect_close(lab.overlapped_allreduce_finish([], []), 0.0, what="overlapped_allreduce_finish([], [])")


def test_finish_time_equals_a_tick_by_tick_simulation(lab):
    rng = random.Random(4)
    for _ in range(300):
        k = rng.randint(1, 8)
        ready = sorted(rng.randint(0, 30) for _ in range(k))
        comm = [rng.randint(1, 9) for _ in range(k)]
        expect_close(
            lab.overlapped_allreduce_finish(ready, comm),
            float(_tick_simulation(ready, comm)),
            what=f"overlapped_allreduce_finish({ready}, {comm}) against a tick-by-tick simulation",
        )


@pytest.mark.parametrize("k", [1, 2, 4, 8, 32])
@pytest.mark.parametrize("comm_total", [0.2, 1.0, 3.0])
def test_k_equal_buckets_finish_at_max_of_T_plus_c_and_T_over_k_plus_k_c(lab, k, comm_total):
    """Lesson 08's closed form: gradients produced at a constant rate over T = 1 s, k buckets, alpha 1 ms."""
    T, a = 1.0, 1e-3
    c = a + comm_total / k
    ready = [T * (i + 1) / k for i in range(k)]
    expect_close(
        lab.overlapped_allreduce_finish(ready, [c] * k),
        float(max(T + c, T / k + k * c)),
        what="lab.overlapped_allreduce_finish(ready, [c] * k)",
    )


def test_bad_arguments_raise_value_error_naming_them(lab):
    expect_value_error(lambda: lab.bucket_assignment([4, 4], 0), "bucket_cap_bytes", function=lab.bucket_assignment)
    expect_value_error(lambda: lab.bucket_assignment([4, 4], -8), "bucket_cap_bytes", function=lab.bucket_assignment)
    expect_value_error(lambda: lab.bucket_assignment([4, -4], 8), "param_bytes", function=lab.bucket_assignment)
    expect_value_error(
        lambda: lab.bucket_assignment([4, -1], 8), "param_bytes", function=lab.bucket_assignment
    )  # the edge: < 0, not < -1
    expect_value_error(lambda: lab.bucket_assignment([], 8), "param_bytes", function=lab.bucket_assignment)
    expect_value_error(
        lambda: lab.overlapped_allreduce_finish([2, 1], [1, 1]), "ready_times", function=lab.overlapped_allreduce_finish
    )  # must not go backwards
    expect_value_error(
        lambda: lab.overlapped_allreduce_finish([1, 2], [1, -1]), "comm_times", function=lab.overlapped_allreduce_finish
    )
    expect_value_error(
        lambda: lab.overlapped_allreduce_finish([1, 2], [1]),
        ("ready_times", "comm_times"),
        function=lab.overlapped_allreduce_finish,
    )
    expect_value_error(
        lambda: lab.overlapped_allreduce_finish(1.0, [1.0]), "ready_times", function=lab.overlapped_allreduce_finish
    )  # a number, not a list
    # a check of "< 0" alone lets NaN and inf through; a byte count is whole
    for ready, comm, name in (
        ([1.0, float("nan")], [1, 1], "ready_times"),
        ([1, float("inf")], [1, 1], "ready_times"),
        ([1, 2], [float("inf"), 1], "comm_times"),
        ([1, 2], [1, float("nan")], "comm_times"),
    ):
        expect_value_error(
            lambda: lab.overlapped_allreduce_finish(ready, comm), name, function=lab.overlapped_allreduce_finish
        )
    expect_value_error(lambda: lab.bucket_assignment([4.5, 4], 8), "param_bytes", function=lab.bucket_assignment)
    expect_value_error(lambda: lab.bucket_assignment(4, 8), "param_bytes", function=lab.bucket_assignment)  # a list


# -- a real bucketed DDP: gradients, bytes, no_sync -----------------------------------------------------

DDP_METHODS = (
    "BucketedDDP.broadcast_module_state",
    "BucketedDDP._grad_ready",
    "BucketedDDP.finish_gradient_synchronization",
    "BucketedDDP.no_sync",
)


def _needs(lab):
    return [lab.bucket_assignment] + [getattr(lab.BucketedDDP, name.split(".")[1]) for name in DDP_METHODS]


def _learner(lab, world_size):
    return RUNS.get(
        ("learner", world_size),
        learner_ddp_worker,
        world_size,
        (lab,),
        timeout=60 + HOLD_BACK,
        needs=_needs(lab),
        rank_args=[(learner_rows(r, world_size),) for r in range(world_size)],
    )


def _pytorch():
    return RUNS.get(
        "pytorch",
        pytorch_ddp_worker,
        4,
        (CAP / 2**20,),
        timeout=60,
        rank_args=[(pytorch_rows(r, 4),) for r in range(4)],
    )


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
            fail(
                f"rank {rank}: the wrapper's parameters are {result['names'][:3]}..., expected the model's under "
                "'module.' (keep the model as self.module)"
            )
        for name, value in want.items():
            got = result["state"].get(name)
            if rank and got is not None and torch.equal(got, _state(build_model(seed=rank))[name]):
                fail(
                    f"rank {rank}: {name} is still this rank's own initial value after construction: broadcast "
                    "rank 0's parameters and buffers (the frozen ones too) in __init__"
                )
            expect_close(got, value, rel=0.0, abs=0.0, what=f"rank {rank}: {name} after construction (rank 0's)")


@pytest.mark.points(3)
@pytest.mark.parametrize("world_size", [2, 4])
def test_gradients_after_a_step_equal_pytorch_ddp(lab, world_size):
    mine = _learner(lab, world_size)
    theirs = _pytorch()
    for rank in range(world_size):
        check_launches(mine[rank]["launched"], rank, world_size)  # a bucket launched early: say so, not just "differ"
        check_grads(
            mine[rank]["grads"],
            theirs[rank][world_size]["grads"],
            f"rank {rank}: gradients against DistributedDataParallel's",
            world_size,
        )


@pytest.mark.parametrize("world_size", [2, 4])
def test_gradients_equal_the_single_process_gradient_of_the_global_batch(lab, world_size):
    expected = _single_process_grads(world_size)
    for rank, result in enumerate(_learner(lab, world_size)):
        check_launches(result["launched"], rank, world_size)
        check_grads(
            result["grads"], expected, f"rank {rank}: gradients against one process on the global batch", world_size
        )


def test_pytorch_ddp_buckets_equal_the_plan_with_the_same_cap(lab):
    """DistributedDataParallel's rebuilt buckets (bucket_cap_mb = CAP / 2**20 MiB) are this plan."""
    yours = lab.bucket_assignment(_param_bytes(), CAP)  # first: a starter fails before DDP's 4-rank run
    logged = _pytorch()[0][4]["rebuilt"]
    theirs = [[int(i) for i in bucket.split()] for bucket in logged.split(",")]
    expect_close(yours, theirs, what=f"bucket_assignment of the test model at cap {CAP} against DDP's rebuilt buckets")


@pytest.mark.points(3)
@pytest.mark.parametrize("world_size", [2, 4])
def test_one_allreduce_per_bucket_per_step_with_the_planned_bytes(lab, world_size):
    plan = EXPECTED("bucket_assignment", _param_bytes(), CAP)
    expected = [["all_reduce", b] for b in reference.bucket_bytes(_param_bytes(), plan)]
    for rank, result in enumerate(_learner(lab, world_size)):
        got = [list(c) for c in result["collectives"]]
        what = f"rank {rank}: the collectives of one step (name, bytes), against the plan"
        if len(got) != len(expected):  # show both lists: the count alone does not say which buckets differ
            same_total = sum(b for _, b in expected) == sum(
                c[1] for c in got if len(c) == 2 and isinstance(c[1], (int, float))
            )
            fail(
                f"{what}: {len(got)} all-reduces {got}, the plan's {len(expected)} {expected}"
                + (
                    ": the same bytes in other buckets: the plan's sizes and its cap are in bytes (param_bytes: numel x "
                    "8 for float64), not elements?"
                    if same_total
                    else ""
                )
            )
        expect_close(got, expected, what=what, causes=known_ratios(element_bytes=8))  # the model is float64


@pytest.mark.parametrize("world_size", [2, 4])
def test_timeline_has_each_bucket_ready_then_launched_then_finished(lab, world_size):
    plan = EXPECTED("bucket_assignment", _param_bytes(), CAP)
    sizes = reference.bucket_bytes(_param_bytes(), plan)
    for rank, result in enumerate(_learner(lab, world_size)):
        check_timeline(result, rank, plan, sizes)


def test_a_returned_timeline_is_not_rewritten_by_the_next_step(lab):
    """finish_gradient_synchronization returns step 1's timeline; after the next step (a no_sync accumulation
    then a synchronised backward) the records returned for step 1 must still hold step 1's times (Lesson 08
    plots several steps' timelines side by side)."""
    for rank, result in enumerate(_learner(lab, 2)):
        if not result["timeline"]:
            fail(f"rank {rank}: finish_gradient_synchronization returned an empty timeline {result['timeline']!r}")
        if result["timeline_later"] != result["timeline"]:
            fail(
                f"rank {rank}: the timeline returned after step 1 changed during the next step: "
                "finish_gradient_synchronization must start fresh records for the next step (new dicts), not "
                f"reuse the ones it returned. Step 1's records: {result['timeline']}; after step 2 they read: "
                f"{result['timeline_later']}"
            )


def test_the_gradients_of_a_step_are_not_rewritten_by_the_next_step(lab):
    """After step 1 the caller keeps the p.grad tensors (zero_grad then sets p.grad to None); the next step's
    all-reduces must not write into them: finish_gradient_synchronization copies the averages into each
    p.grad, and a p.grad that is a view of a bucket buffer is rewritten by the next step."""
    for rank, result in enumerate(_learner(lab, 2)):
        if result["kept_changed"]:
            fail(
                f"rank {rank}: the gradients step 1 left in p.grad of {', '.join(result['kept_changed'])} changed "
                "during the next step: they share memory with a bucket buffer the next all-reduce reuses. Copy "
                "each slice of the averaged buffer into p.grad (p.grad.copy_(...)) instead of making p.grad a view of it"
            )


@pytest.mark.parametrize("world_size", [2, 4])
def test_a_step_whose_buckets_never_all_launch_raises_runtime_error(lab, world_size):
    """The docstring's promise: finish_gradient_synchronization raises RuntimeError when a bucket was never
    launched in this backward (a parameter got no gradient), also after earlier steps went well."""
    for rank, result in enumerate(_learner(lab, world_size)):
        raised = result["unlaunched"]
        if raised is None:
            fail(
                f"rank {rank}: after two full steps, a backward that gave only layers[0].weight a gradient "
                "launched one bucket of several, and finish_gradient_synchronization() raised nothing: it "
                "must raise RuntimeError naming the buckets never launched. Are the last step's works still "
                "there (reset them to None at the end of finish, as the counters)?"
            )
        if raised[0] != "RuntimeError":
            fail(
                f"rank {rank}: after two full steps, a backward that gave only layers[0].weight a gradient "
                f"made finish_gradient_synchronization() raise {raised[0]}: {raised[1]} - expected RuntimeError "
                "naming the buckets never launched (check for them before waiting: the last step's works, "
                "if kept, are not this step's)"
            )


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
            fail(
                f"rank {rank}: finish_gradient_synchronization after the last micro-batch raised {result['finish_error']}"
            )
        if plan and calls[-1] == 0 and not any(calls[:-1]):
            raised = (
                f" (and finish_gradient_synchronization raised {result['finish_error']})"
                if result.get("finish_error")
                else ""
            )
            fail(
                f"rank {rank}: the last micro-batch all-reduced nothing{raised} (collectives per micro-batch {calls}). Just "
                "before it the test left a no_sync() block by an exception: the wrapper stayed in no_sync. Set the flag "
                "back in a finally block (try: yield / finally: ...), so an exception inside the block cannot keep it"
            )
        expect_close(
            calls,
            [0] * (MICROBATCHES - 1) + [len(plan)],
            what=f"rank {rank}: collectives per micro-batch (none under no_sync, then one per bucket)",
        )
        check_grads(
            result["accumulated"], expected, f"rank {rank}: gradients accumulated over {MICROBATCHES} micro-batches", 2
        )


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
        fail(
            f"rank 0's backward did not return while rank 1 held its gradients back ({HOLD_BACK:g} s): a hook waits "
            "for its all-reduce (work.wait() in _grad_ready?). Launch with async_op=True and wait only in "
            "finish_gradient_synchronization()"
        )
    # One record per bucket first: an empty timeline (nothing launched) would pass every check below.
    plan = EXPECTED("bucket_assignment", _param_bytes(), CAP)
    expect_close(
        [r.get("bucket") for r in zero["timeline"]],
        list(range(len(plan))),
        what="rank 0: the timeline's buckets (one record per bucket, each launched from its hook)",
    )
    end = zero["backward_end"]
    for r in zero["timeline"]:
        if not isinstance(r.get("start"), float) or not isinstance(r.get("finish"), float):
            fail(f"rank 0, bucket {r.get('bucket')}: no start or finish time in the timeline: {r}")
        if r["start"] > end:
            fail(
                f"rank 0: bucket {r['bucket']} was launched {(r['start'] - end) * 1e3:.1f} ms after its backward "
                "returned: launch each bucket's all-reduce from the hook, the moment the bucket is full"
            )
        if r["finish"] < end:
            fail(
                f"rank 0: bucket {r['bucket']} 'finished' {(end - r['finish']) * 1e3:.1f} ms before its backward "
                "returned, while rank 1 had sent nothing: record finish when the all-reduce completes (a callback "
                "on work.get_future())"
            )
        if r["finish"] > zero["finish_called"]:
            fail(
                f"rank 0: bucket {r['bucket']} 'finished' {(r['finish'] - zero['finish_called']) * 1e6:.0f} us after "
                "finish_gradient_synchronization() was called, though every all-reduce had completed before (a "
                "barrier waited for them): record finish when the all-reduce completes (a callback on "
                "work.get_future()), not when you wait for it"
            )


@pytest.mark.points(3)
def test_ddp_on_a_subgroup_talks_only_to_its_group(lab):
    # 4 ranks in groups {0, 1} and {2, 3}; each rank seeds its own model; each group has its own data.
    check_subgroup(_learner(lab, 4))


# -- overlap, measured -------------------------------------------------------------------------------

FACTOR = 3.0  # measured exposed time within 3x of the prediction (shared CPUs)
MIN_CPU_SHARE = 0.7  # below this, other processes set the timings: only the lower side is checked


def _overlap(lab):
    return RUNS.get(
        "overlap", overlap_worker, 2, (lab,), timeout=90, needs=[lab.bucket_assignment, lab.overlapped_allreduce_finish]
    )


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
    ready = [
        max(statistics.median(max(s["grad_times"][i] for i in bucket) for s in r["compute"]) for r in results)
        for bucket in plan
    ]
    for rank, r in enumerate(results):  # the link was timed at the sizes the timeline reports
        got = [record.get("bytes") for record in r["overlapped"][0]["timeline"]]
        if got != sizes:
            doubled = len(got) == len(sizes) and all(g == 2 * n for g, n in zip(got, sizes))
            fail(
                f"rank {rank}: the timeline's bucket bytes {got}, the plan's {sizes} for this float32 model"
                + (
                    ": x2, float64 buffers for float32 gradients (a bucket's dtype is its parameters')"
                    if doubled
                    else ""
                )
            )
    comm = [max(r["link"][n] for r in results) for n in sizes]
    predicted = max(0.0, _last_finish(ready, comm) - backward)
    fastest = max(0.0, _last_finish(ready, [min(r["link_fastest"][n] for r in results) for n in sizes]) - backward)
    # Per step, for the job: the last rank's gradients are ready this long after the last rank's backward
    # ended (perf_counter is one clock for all processes of a machine). A rank that waits for a slower
    # peer's backward is not waiting for the network.
    per_step = [
        max(r["overlapped"][j]["t0"] + r["overlapped"][j]["backward"] + r["overlapped"][j]["wait"] for r in results)
        - max(r["overlapped"][j]["t0"] + r["overlapped"][j]["backward"] for r in results)
        for j in range(STEPS)
    ]
    measured = statistics.median(per_step)
    detail = (
        f"measured exposed {measured * 1e3:.1f} ms vs predicted {predicted * 1e3:.1f} ms; compute-only backward "
        f"{backward * 1e3:.1f} ms, bucket ready {[round(t * 1e3, 1) for t in ready]} ms, all-reduce "
        f"{[round(t * 1e3, 1) for t in comm]} ms; each rank's backward got {share:.0%} of a core"
    )
    print(detail)
    if measured < fastest / FACTOR:
        fail(
            f"faster than the link and compute allow (does finish_gradient_synchronization() wait?): {detail}; "
            f"with each all-reduce's fastest run, predicted {fastest * 1e3:.1f} ms"
        )
    # The backward's share is measured in the compute-only runs; the overlapped steps' all-reduce threads
    # also need a core, and a machine running other work beside the job starves them (seen once: 34 ms
    # exposed against 7.5 ms predicted, at 98% of a core, with a second test run on the 2 cores).
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    oversubscribed = load > 1.5 * (os.cpu_count() or 1)
    if share >= MIN_CPU_SHARE and not oversubscribed and measured > predicted * FACTOR:
        fail(f"more than {FACTOR:g}x the prediction: {detail}; load average {load:.1f} on {os.cpu_count()} cores")
