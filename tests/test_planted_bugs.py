"""The labs' tests catch real mistakes, quickly and clearly: bugs planted in copies of the references.

Each case edits one line of a lab's reference solution, saves the result as
the ``starter.py`` of a scratch copy of the lab (without ``solution.py``, as
in the student release) and runs the lab's own tests on it with
``LAB_IMPL=starter`` in a separate pytest, the way a learner does. What is
checked is what the learner sees: which tests fail, how long the whole run
takes, and the first lines of the first failure. A deadlock must cost
seconds: the whole lab, deadlocked, fails in under a minute on a quiet
machine (the budget scales with the load average where the team shares two
cores: the runner cannot make other processes' CPU time its own), each
deadlocked job costs its start-up plus a few seconds, a test that would
rerun a hung job fails in under a second, and the first failure names each
rank's stuck line of the learner's file and the fix. The same holds for an
``isend`` whose request is dropped without a wait (Labs 10 and 12), which
used to hang to the deadline (90-140 s) with a hint that blamed the order of
collectives.
"""

import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from commtax.labs import LABS_DIR, REPO_ROOT
from commtax.ranks._byfile import load_module_from_file
from commtax.ranks.launch import run_ranks

LAB02 = LABS_DIR / "lab-02-ring-allreduce"
LAB05 = LABS_DIR / "lab-05-tensor-parallel-layers"
LAB07 = LABS_DIR / "lab-07-pipeline-schedules"
LAB08 = LABS_DIR / "lab-08-memory-and-zero"
LAB09 = LABS_DIR / "lab-09-ddp-overlap"
LAB10 = LABS_DIR / "lab-10-moe-all-to-all"
LAB11 = LABS_DIR / "lab-11-plan-a-cluster"
LAB12 = LABS_DIR / "lab-12-the-whole-bill"
WHOLE_LAB_SECONDS = 60.0  # the promise to learners: a deadlocked lab fails in under a minute, in total
DEADLOCKED_JOB_SECONDS = 15.0  # one deadlocked job: rank start-up (2-8 s, busy or not) + the 2 s quiet period
pytestmark = pytest.mark.skipif(not (LAB02 / "solution.py").exists(),
                                reason="the student release has no reference solutions to plant bugs in")


@dataclass
class LabRun:
    seconds: float
    output: str
    outcomes: dict

    def durations(self) -> dict[str, float]:
        """Seconds of each test's call phase (``--durations=0``), by test id."""
        return {test: float(s) for s, test in re.findall(r"^([\d.]+)s call\s+(\S+)$", self.output, re.M)}

    def failed(self) -> list[str]:
        return re.findall(r"^FAILED (\S+)", self.output, re.M)

    def check_time(self):
        """The whole lab within a minute, each failure within its budget (both scaled by the load)."""
        load = os.getloadavg()[0] / (os.cpu_count() or 1) if hasattr(os, "getloadavg") else 0.0
        budget = WHOLE_LAB_SECONDS * max(1.0, load)
        assert self.seconds < budget, f"the broken lab took {self.seconds:.0f} s (budget {budget:.0f} s)"
        durations = self.durations()
        for test in self.failed():
            seconds = durations.get(test, 0.0)
            shared = re.search(rf"^_+ {re.escape(test.split('::')[-1])} _+\n(RememberedHang|SharedRunFailed)",
                               self.output, re.M)
            limit = (1.0 if shared else DEADLOCKED_JOB_SECONDS) * max(1.0, load)
            assert seconds < limit, f"{test} took {seconds:.1f} s to fail (limit {limit:.1f} s)"

    def failure(self, index: int = 0) -> list[str]:
        """The report lines of the ``index``-th failing test (its header excluded)."""
        sections = re.split(r"\n_+ test\S* _+\n", self.output)
        assert len(sections) > index + 1, f"no failure number {index + 1} in:\n{self.output[-3000:]}"
        text = sections[index + 1].split("\n=====", 1)[0]
        return text.splitlines()


def run_planted(tmp_path: Path, lab_dir: Path, old: str, new: str, *pytest_args: str) -> LabRun:
    """Run ``lab_dir``'s tests on its solution with ``old`` replaced by ``new``, as a learner's starter."""
    source = (lab_dir / "solution.py").read_text()
    assert source.count(old) == 1, f"the line to break is not in the reference: {old!r}"
    course = tmp_path / "course"
    lab = course / "labs" / lab_dir.name
    shutil.copytree(lab_dir, lab, ignore=shutil.ignore_patterns("solution.py", "__pycache__"))
    (lab / "starter.py").write_text(source.replace(old, new))
    shutil.copy(LABS_DIR / "conftest.py", course / "labs")
    for name in ("conftest.py", "pyproject.toml"):
        shutil.copy(REPO_ROOT / name, course)
    env = dict(os.environ, LAB_IMPL="starter",
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])))
    env.pop("PYTEST_CURRENT_TEST", None)
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", f"labs/{lab_dir.name}", "-q", "-p", "no:cacheprovider", "--durations=0",
         *pytest_args],
        cwd=course, env=env, capture_output=True, text=True, timeout=600)
    seconds = time.monotonic() - start
    summary = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
    outcomes = {kind: int(n) for n, kind in re.findall(r"(\d+) (passed|failed|skipped|error)", summary)}
    return LabRun(seconds, proc.stdout + proc.stderr, outcomes)


def _rank_line(line: str, rank, lab_dir: Path, function: str, code: str) -> bool:
    """``line`` is "  rank RANK: labs/LAB/starter.py:N in FUNCTION: `CODE...`" (``rank`` None: any rank)."""
    who = r"\d+" if rank is None else str(rank)
    return re.match(rf"  rank {who}: labs/{lab_dir.name}/starter\.py:\d+ in {function}: `{re.escape(code)}",
                    line) is not None


# -- deadlocks: seconds, and the line ------------------------------------------------------------

@pytest.mark.slow   # the whole of Lab 02: 37 s at load 2 on 2 cores; test_launch's planted ring and the
# dropped-isend lab runs below cover the message and the whole-lab time (suite time: 25 min)
def test_a_ring_whose_ranks_all_receive_first_fails_the_whole_lab_in_under_a_minute(tmp_path):
    run = run_planted(tmp_path, LAB02,
                      "        _exchange(flat[send_start:send_stop], send_to, received, recv_from, group, add_piece)\n",
                      "        dist.recv(received, recv_from, group)\n"
                      "        dist.send(flat[send_start:send_stop], send_to, group)\n"
                      "        target.add_(received)\n")
    run.check_time()
    assert run.outcomes.get("failed", 0) >= 1 and run.outcomes.get("passed", 0) >= 1, run.outcomes
    first = run.failure(0)
    assert first[0].startswith("DistributedRunError: distributed run of ") and "deadlocked after" in first[0]
    assert first[0].endswith("every rank waits in recv() and no message is on its way"), first[0]
    assert _rank_line(first[1], 0, LAB02, "ring_reduce_scatter", "dist.recv(received, recv_from, group)"), first[1]
    assert _rank_line(first[2], 1, LAB02, "ring_reduce_scatter", "dist.recv(received, recv_from, group)"), first[2]
    assert first[3].startswith("hint: every rank is waiting to receive"), first[3]
    # Later tests that need the same job say so in a few lines instead of hanging again.
    assert "RememberedHang: not run:" in run.output or "SharedRunFailed:" in run.output
    assert len(run.output.splitlines()) < 400, "a page per failure again"


@pytest.mark.slow   # 14 s at load 2; test_launch's ring_that_sends_first_with_a_blocking_send gives the same diagnosis
def test_a_ring_of_blocking_sends_is_told_to_use_isend(tmp_path):
    run = run_planted(tmp_path, LAB02,
                      "        _exchange(flat[send_start:send_stop], send_to, received, recv_from, group, add_piece)\n",
                      "        dist.send(flat[send_start:send_stop], send_to, group)\n"
                      "        dist.recv(received, recv_from, group)\n"
                      "        target.add_(received)\n",
                      "-x", "-k", "ring_all_reduce_equals")
    first = run.failure(0)
    assert "deadlocked after" in first[0] and first[0].endswith("every rank is blocked in send()"), first[0]
    assert _rank_line(first[1], 0, LAB02, "ring_reduce_scatter", "dist.send(flat[send_start:send_stop]"), first[1]
    assert first[3].startswith("hint: every rank is blocked in dist.send()") and "dist.isend" in first[3]


@pytest.mark.slow   # 16 s at load 2; test_launch's ring_with_a_wrong_source gives the same diagnosis
def test_a_ring_that_sends_to_the_wrong_neighbour_is_told_to_check_the_source_rank(tmp_path):
    run = run_planted(tmp_path, LAB02, "global_rank((rank + 1) % size)", "global_rank((rank + 2) % size)",
                      "-k", "ring_all_reduce_equals")
    assert run.outcomes.get("failed", 0) >= 1, run.outcomes
    assert "deadlocked after" in run.output
    assert "Check the tag and the source rank of each recv against the sends" in run.output
    assert "in ring_reduce_scatter" in run.output  # and where each rank was


def test_a_pipeline_that_receives_with_the_wrong_tag_fails_the_whole_lab_in_under_a_minute(tmp_path):
    run = run_planted(tmp_path, LAB07, "dist.recv(x, peer(rank - 1), group, tag=2 * i)",
                      "dist.recv(x, peer(rank - 1), group, tag=2 * i + 1)")
    run.check_time()
    assert run.outcomes.get("failed", 0) >= 1 and run.outcomes.get("passed", 0) >= 1, run.outcomes
    first = run.failure(0)
    assert "deadlocked after" in first[0] and first[0].endswith("a recv's tag matches no send"), first[0]
    assert any(_rank_line(line, 1, LAB07, "train_1f1b", "dist.recv(x, peer(rank - 1), group, tag=2 * i + 1)")
               for line in first[1:3]), first[1:3]
    hint = next(line for line in first if line.startswith("hint: "))
    assert "waits for tag 1 from rank 0 while rank 0 sent it" in hint
    assert "Check the tag and the source rank of each recv against the sends" in hint


# -- a dropped request: seconds, the isend's line and req.wait() -------------------------------------

def _check_dropped_isend_report(run: LabRun, lab_dir: Path, function: str, code: str) -> None:
    first = run.failure(0)
    assert re.match(r"DistributedRunError: distributed run of \w+\(\) on \d+ ranks \(gloo\) failed: rank \d+ never "
                    r"waited on the request of its dist\.isend to rank \d+ \(tag \d+\): keep it and call "
                    r"req\.wait\(\)$", first[0]), first[0]
    assert _rank_line(first[1], None, lab_dir, function, code), first[1]
    hint = next(line for line in first if line.startswith("hint: "))
    assert "dist.isend" in hint and "req.wait()" in hint and "collectives" not in hint, hint
    assert "deadlocked" not in run.output and "deadline passed" not in run.output


def test_an_all_to_all_that_drops_its_isend_requests_fails_the_whole_lab_in_under_a_minute(tmp_path):
    run = run_planted(tmp_path, LAB10,
                      "            requests.append(dist.isend(send[send_at[to]:send_at[to] + send_splits[to]],\n"
                      "                                       dst=_global(group, to), group=group))\n",
                      "            dist.isend(send[send_at[to]:send_at[to] + send_splits[to]],\n"
                      "                       dst=_global(group, to), group=group)\n")
    run.check_time()
    assert run.outcomes.get("failed", 0) >= 1 and run.outcomes.get("passed", 0) >= 1, run.outcomes
    _check_dropped_isend_report(run, LAB10, "all_to_all", "dist.isend(send[send_at[to]:send_at[to] + send_splits[to]],")


def test_a_pipeline_that_drops_its_isend_requests_fails_in_seconds_naming_the_isend(tmp_path):
    run = run_planted(tmp_path, LAB12, '                pending.append((dist.isend(out, dst=ctx["next"], tag=k), out))\n',
                      '                dist.isend(out, dst=ctx["next"], tag=k)\n', "-k", "losses_equal")
    run.check_time()
    assert run.outcomes.get("failed", 0) >= 1 and not run.outcomes.get("passed"), run.outcomes
    _check_dropped_isend_report(run, LAB12, "train_step", 'dist.isend(out, dst=ctx["next"], tag=k)')
    # the other plans are not run again: they say which run dropped its request (Lab 12's worker's name may change)
    assert re.search(r"RememberedHang: not run: \w+\(\) dropped a request", run.output), run.output[-3000:]


# -- wrong values: a failure, not a pass ----------------------------------------------------------

@pytest.mark.slow   # Lab 02's value tests and mutation scores cover wrong sums (suite time: 25 min)
def test_a_ring_that_overwrites_instead_of_adding_gives_a_wrong_sum_not_a_pass(tmp_path):
    run = run_planted(tmp_path, LAB02, "target[a:b].add_(received[a:b])", "target[a:b].copy_(received[a:b])",
                      "-k", "ring_all_reduce_equals or reduce_scatter_leaves")
    assert run.outcomes.get("failed", 0) >= 1 and not run.outcomes.get("passed"), run.outcomes
    assert "deadlocked" not in run.output


@pytest.mark.slow   # Lab 02's value tests and mutation scores cover wrong sums (suite time: 25 min)
def test_an_all_gather_that_starts_from_the_wrong_chunk_is_caught(tmp_path):
    run = run_planted(tmp_path, LAB02, "bounds[(owned_chunk - step) % size]", "bounds[(owned_chunk + step) % size]",
                      "-k", "reduce_scatter_leaves or all_gather_fills")
    assert run.outcomes.get("failed", 0) >= 1 and run.outcomes.get("passed", 0) >= 1, run.outcomes
    assert "test_reduce_scatter_leaves" not in run.output.split("short test summary", 1)[-1]  # untouched...
    assert "test_all_gather_fills" in run.output.split("short test summary", 1)[-1]  # ...the all-gather's fail


def test_a_row_parallel_layer_that_adds_its_bias_on_every_rank_is_caught(tmp_path):
    run = run_planted(tmp_path, LAB05,
                      "        partial = F.linear(x, self.weight)\n"
                      "        out = reduce_from_tp_region(partial, self.group)\n"
                      "        return out + self.bias if self.bias is not None else out\n",
                      "        partial = F.linear(x, self.weight, self.bias)  # bias before the sum: t times\n"
                      "        return reduce_from_tp_region(partial, self.group)\n",
                      "-k", "forward_output_equals")
    assert run.outcomes.get("failed", 0) >= 1, run.outcomes
    assert "deadlocked" not in run.output


def test_an_all_to_all_that_never_waits_on_its_requests_is_told_so_in_seconds(tmp_path):
    # The requests are kept in a list but never waited on: the next exchange's messages used to land in this
    # one's open receives (gloo: "Received data size doesn't match", SIGABRT) and the hint blamed receive sizes.
    run = run_planted(tmp_path, LAB10, "    for request in requests:\n        request.wait()\n    return out\n",
                      "    for request in requests:\n        pass\n    return out\n",
                      "-x", "-k", "all_to_all_equals_all_to_all_single")
    run.check_time()
    first = run.failure(0)
    assert re.match(r"DistributedRunError: distributed run of \w+\(\) on \d+ ranks \(gloo\) failed: rank \d+ never "
                    r"waited on the request of its dist\.i(send to|recv from) rank \d+ \(tag 0\): keep it and call "
                    r"req\.wait\(\)$", first[0]), first[0]
    assert re.match(rf"  rank \d+: labs/{LAB10.name}/starter\.py:\d+ in all_to_all: `requests\.append\(dist\.i(send|recv)\(",
                    first[1]), first[1]
    assert "req.wait()" in next(line for line in first if line.startswith("hint: "))
    assert "Received data size" not in run.output and "hint (Lab 10): when a message and the receive buffer" \
        not in run.output


@pytest.mark.slow   # two 2-rank jobs of Lab 10: about 25 s at load 3 on 2 cores
def test_lab10s_size_hint_follows_a_short_receive_and_not_a_diagnosed_blocking_send(tmp_path):
    # A correct "blocked in send()" diagnosis must not be followed by the lab's hint about receive sizes,
    # which is about a different mistake. The plant: a loop of blocking sends before the loop of receives
    # (the isends gone).
    solution = (LAB10 / "solution.py").read_text()
    start = solution.index("    for step in range(1, world):")
    end = solution.index("group=group))\n", solution.index("requests.append(dist.isend(")) + len("group=group))\n")
    loop = solution[start:end]
    receives = loop.split("        if send_splits[to]:\n")[0]       # the loop header, to/frm and the irecv
    sends_first = (receives.splitlines(keepends=True)[0] + "        to = (rank + step) % world\n"
                   "        if send_splits[to]:\n            dist.send(send[send_at[to]:send_at[to] + send_splits[to]], "
                   "dst=_global(group, to), group=group)\n" + receives)
    blocking = run_planted(tmp_path / "send", LAB10, loop, sends_first,
                           "-x", "-k", "all_to_all_equals_all_to_all_single")
    assert "every rank is blocked in send()" in blocking.output, blocking.output[-3000:]
    assert "hint (Lab 10)" not in blocking.output, blocking.output[-3000:]
    short = run_planted(tmp_path / "short", LAB10, "out[recv_at[frm]:recv_at[frm] + recv_splits[frm]],",
                        "out[recv_at[frm]:recv_at[frm] + recv_splits[frm] - 1],",
                        "-x", "-k", "all_to_all_equals_all_to_all_single")
    assert "hint (Lab 10): when a message and the receive buffer posted for it differ in size" in short.output, \
        short.output[-3000:]


@pytest.mark.slow   # one 2-rank job: about 10 s on a quiet 2-core machine
def test_a_rank_that_raised_and_left_its_peer_waiting_is_named_first(tmp_path):
    # Rank 1's own slice raises (caught in the test's part, which goes on to its barrier) while rank 0
    # waits for it in all_to_all: the deadlock report must show the exception first, not only the waits.
    run = run_planted(tmp_path, LAB10,
                      "    out[recv_at[rank]:recv_at[rank] + recv_splits[rank]] = send[send_at[rank]",
                      "    out[send_at[rank]:send_at[rank] + recv_splits[rank]] = send[send_at[rank]",
                      "-x", "-k", "all_to_all_equals_all_to_all_single")
    first = run.failure(0)
    raised = next((i for i, line in enumerate(first) if line.startswith("    but first it raised, at starter.py:")),
                  None)
    assert raised is not None and raised < 5 and "RuntimeError" in first[raised], "\n".join(first[:12])
    assert first[raised - 1].startswith("  rank "), first[raised - 1]


def _lab_mutant(tmp_path: Path, lab_dir: Path, name: str, old: str, new: str):
    """(the lab's test module, its solution with ``old`` replaced by ``new``) for a check without pytest."""
    source = (lab_dir / "solution.py").read_text()
    assert source.count(old) == 1, f"the line to break is not in the reference: {old!r}"
    path = tmp_path / f"{name}.py"
    path.write_text(source.replace(old, new))
    tests = load_module_from_file(f"{lab_dir.name[:6].replace('-', '_')}_test_lab", str(lab_dir / "test_lab.py"))
    return tests, load_module_from_file(f"{lab_dir.name[:6].replace('-', '_')}_mutant_{name}", str(path))


def test_routing_weights_cut_from_the_graph_are_named_not_blamed_on_the_learners_code(tmp_path):
    # The learner detaches the routing weights: the router gets no gradient. The test's own read of
    # router.weight.grad used to raise AttributeError, reported as "your code raised in the backward part".
    lab, broken = _lab_mutant(tmp_path, LAB10, "detached", "flat_w[:, None] * back", "flat_w.detach()[:, None] * back")
    results = run_ranks(lab.moe_worker, 2, (broken, lab._case(2, with_skew=False)), timeout=90)
    for rank, result in enumerate(results):
        got = result["dropless backward"]
        assert lab.SECTION_FAILED not in got, got   # the part no longer raises in the test's own code
        message = lab._missing_grads(got, rank, "dropless")
        print(message)
        assert message.startswith(f"rank {rank}, dropless: after backward, router.weight.grad: no gradient reached "
                                  "the router") and ".detach()" in message
        assert got["input_grad"] is not None and "input" not in message


def test_a_timeline_whose_backward_reuses_the_forwards_start_is_caught_naming_the_overlap(tmp_path):
    # The start time is taken for forwards only: each backward's entry starts at the last forward's start.
    lab, broken = _lab_mutant(tmp_path, LAB12, "timeline",
                              "        start = time.perf_counter()\n        if kind == \"F\":\n",
                              "        if kind == \"F\":\n            start = time.perf_counter()\n")
    results = run_ranks(lab.record_training, 1, (broken, 1, 1, 1, {}), timeout=90,   # one rank, one stage
                        rank_args=lab.rank_inputs(1, 1, 1))
    with pytest.raises(pytest.fail.Exception) as info:
        lab.check_timeline(results, 1, 1, 1)
    print(info.value)
    assert re.match(r"rank 0 \(stage 0\), step 0: op \('B', 0\) starts at [\d.]+ s, [\d.]+ s before op \('F', 0\) "
                    r"ended .*two ops of one rank overlap on the timeline", str(info.value)), str(info.value)


def test_a_timeline_that_starts_after_the_receive_is_caught_naming_the_hidden_wait(tmp_path):
    # The start time is taken after the forward's receive: the wait for the previous stage vanishes from
    # the Gantt chart (every other check of the timeline passes it).
    lab, broken = _lab_mutant(tmp_path, LAB12, "start_after_recv",
                              "dist.recv(x, src=ctx[\"prev\"], tag=k)\n",
                              "dist.recv(x, src=ctx[\"prev\"], tag=k)\n                start = time.perf_counter()\n")
    results = run_ranks(lab.record_slow_sends, 2, (broken, lab.SEND_DELAY), timeout=90)
    with pytest.raises(pytest.fail.Exception) as info:
        lab.check_receive_waits(results)
    print(info.value)
    assert re.match(r"stage 1: the step's first op \('F', 0\) starts [\d.]+ s after the step began; with every "
                    r"send held back 0.3 s, a start taken after the receive hides the wait", str(info.value)), \
        str(info.value)


def _lab12_tests():
    return load_module_from_file("lab_12_test_lab", str(LAB12 / "test_lab.py"))


def test_the_public_seeds_losses_and_a_rank_alone_fail_the_loss_test_and_are_named():
    # Red team a03's idea on Lab 12: train() made its model and data from a public seed, so one rank could
    # compute every other rank's part alone. Now each rank is handed a model real only in its own stage and
    # TP slice, and batches real only in its replica's rows (secret seed under the grader; a default here
    # that is not the public 0). What a rank gets without the others' parts fails the loss test, and the
    # hint says which shortcut it was: the public seed's losses, or the whole handed model trained alone.
    # No ranks (milliseconds); the real run of the public-seed forge is the slow test below.
    lab, plan = _lab12_tests(), (2, 2, 2)
    for rank in (0, 5):
        for got, named in ((lab.public_losses(2), ". These are the losses of the model and data of the public seed 0"),
                           (lab.alone(plan, rank), f". These are the losses rank {rank} gets by training the whole "
                                                   "model it was handed")):
            assert lab._loss_problem(got, lab.expected_losses(plan), f"rank {rank}"), got
            hint = lab.forged_hint(got, plan, rank)
            assert hint.startswith(named), hint


@pytest.mark.slow   # one 2-rank job (10-16 s at load 6 on 2 cores); the check above covers the values without ranks
def test_ranks_that_rebuild_the_model_from_the_public_seed_get_wrong_losses_and_are_told_so(tmp_path):
    # The forge for real: every rank ignores what it was handed and rebuilds model and data from train()'s
    # public seed (the rest of its training is correct). It trains the public model: the losses test fails.
    lab, forged = _lab_mutant(tmp_path, LAB12, "public_seed",
                              "    pp_idx, dp_idx, tp_idx = grid_coordinates(rank, dp, tp, pp)\n",
                              "    pp_idx, dp_idx, tp_idx = grid_coordinates(rank, dp, tp, pp)\n"
                              "    from commtax.ranks.wholebill import make_batch, make_model   # the public seed\n")
    plan = (2, 1, 1)
    results = run_ranks(lab.record_training, 2, (forged, *plan, {}), timeout=90, rank_args=lab.rank_inputs(*plan))
    got = results[0]["result"]["loss"]
    assert lab.close(got, lab.public_losses(2), rel=1e-9), got     # the forge trained the public model...
    problem = lab._loss_problem(got, lab.expected_losses(plan), "plan dp=2 tp=1 pp=1, rank 0")
    assert problem, got                                               # ...which is not the one graded
    hint = lab.forged_hint(got, plan, 0)
    print(problem + hint)
    assert hint.startswith(". These are the losses of the model and data of the public seed 0"), hint


# -- a value off by a known factor: the message names the factor's cause (no ranks: milliseconds) -------

def _fails(test, *args) -> str:
    with pytest.raises(pytest.fail.Exception) as info:
        test(*args)
    print(info.value)
    return str(info.value)


def test_a_pipelines_bytes_not_averaged_over_pp_are_named_as_such_not_as_counted_twice(tmp_path):
    # Lab 12: the PP bill without its average over the pp ranks is x pp; on 2 stages the hint used to say
    # only "each all-reduce (or send) counted twice?".
    lab, broken = _lab_mutant(tmp_path, LAB12, "pp_not_averaged", "\"pp\": microbatches * 2 * (pp - 1) / pp * act",
                              "\"pp\": microbatches * 2 * (pp - 1) * act")
    message = _fails(lab.test_predicted_bytes_equal_the_course_bill_for_this_model, broken)
    assert message.startswith("predicted_bytes_per_step(dp=2, tp=2, pp=2)['pp']: got 16384, expected 8192 (x2 of the "
                              "expected): x2 = pp: a pipeline's sends not averaged over its pp = 2 ranks"), message


def test_a_dp_bill_without_the_ring_factor_is_named_with_the_groups_size(tmp_path):
    # Lab 11: (g-1)/g left out of the ZeRO passes: x8/7 on a ring of 8 (it used to print "x1.143" alone).
    lab, broken = _lab_mutant(tmp_path, LAB11, "no_ring", "    ring = (g - 1) / g\n", "    ring = 1.0\n")
    message = _fails(lab.test_dp_time_what_the_axis_adds_its_collectives_and_bytes, broken,
                     "Llama 8B FP8 on 8 H100s, CP 2 ring")
    assert "['bytes']: " in message and message.endswith(
        "(x1.143 = 8/7 of the expected): the ring factor (g-1)/g = 7/8 left out?"), message


def test_a_byte_count_that_ignores_dtype_bytes_is_named(tmp_path):
    # Lab 08: zero_bytes_per_step at its default 2 bytes whatever dtype_bytes says: x1/2 against 4-byte values.
    lab, broken = _lab_mutant(tmp_path, LAB08, "dtype_ignored", "    return float(passes * (dp - 1) / dp * n_params * "
                              "dtype_bytes)\n", "    return float(passes * (dp - 1) / dp * n_params * 2)\n")
    message = _fails(lab.test_zero_bytes_per_step_counts_passes_2_2_m_plus_1_and_3m, broken, 2)
    assert message.startswith("zero_bytes_per_step(1e9, 8, 2, 4, dtype_bytes=4) against commtax.formulas.memory: got")
    assert message.endswith("(x0.5 = 1/2 of the expected): dtype_bytes ignored: counted at 2 bytes per element, not the 4 "
                            "asked?"), message


@pytest.mark.slow   # one 4-rank start-up: 19-22 s at load 3-6 on 2 cores (the lab's own tests run these checks)
def test_an_all_to_all_backward_with_the_forwards_splits_and_none_read_from_the_input_are_named(tmp_path, monkeypatch):
    # Two slips in one 4-rank start-up of the exchange parts alone: AllToAll's backward reusing the
    # forward's split lists (otherwise reported as a deadlock in the all-to-all test), and all_to_all_single
    # taking a None output_split_sizes from the INPUT's rows (no other test catches it).
    lab, broken = _lab_mutant(
        tmp_path, LAB10, "unswapped",
        "        return all_to_all(grad.contiguous(), recv_splits, send_splits, ctx.group), None, None, None\n",
        "        return all_to_all(grad.contiguous(), send_splits, recv_splits, ctx.group), None, None, None\n")
    source = Path(broken.__file__).read_text()
    old = '    recv_splits = splits(output_split_sizes, output, "output_split_sizes")\n'
    assert source.count(old) == 1
    Path(broken.__file__).write_text(source.replace(old, old.replace("output, ", "input, ")))
    broken = load_module_from_file("lab_10_mutant_unswapped_input", broken.__file__)
    results = run_ranks(lab.exchange_worker, 4, (broken, lab._case(4, with_skew=False)), timeout=90)
    backward = lab.section(results[0], "a2a backward", rank=0)
    assert backward["grad"] is not None and not lab.torch.equal(backward["grad"], backward["x"])
    monkeypatch.setattr(lab, "_results", lambda *_args, **_kw: results)   # the lab's tests read this run
    messages = []
    for test in (lab.test_all_to_all_backward_sends_each_gradient_row_back_where_it_came_from,
                 lambda b: lab.test_all_to_all_single_takes_torchs_argument_order_and_none_means_equal_splits(b, 4)):
        with pytest.raises(pytest.fail.Exception) as info:
            test(broken)
        messages.append(str(info.value))
        print(info.value)
    assert messages[0].startswith("rank 0, splits [[0, 1, 2, 3], ") and \
        "the backward reused the forward's split lists" in messages[0] and "deadlock" not in messages[0]
    assert messages[1].startswith("rank 0: all_to_all_single(output of 4 rows, input of 16 rows, None, "
                                  "input_split_sizes=[1, 3, 5, 7]) raised ValueError") and \
        "output_split_sizes=None means the OUTPUT's 4 rows in equal parts, 1 from each rank" in messages[1]


def test_a_piece_of_the_predictor_fails_first_in_its_own_test_when_run_with_x(tmp_path):
    # Lab 11, the bubble p/(v m) in place of (p-1)/(v m): with -x the first failure used to be a stage_layers
    # test that also priced the whole step; the whole steps now have their own test after the pieces'.
    run = run_planted(tmp_path, LAB11, "    return (p - 1) / (v * m) * m * stage_s, sends\n",
                      "    return p / (v * m) * m * stage_s, sends\n", "-x")
    assert run.failed() and run.failed()[0].split("::")[-1].startswith("test_pipeline_time_bubble"), run.failed()
    assert "stage_layers" not in run.output.split("short test summary", 1)[-1]


@pytest.mark.parametrize("lab_dir,old,new,test,named", [
    (LAB11, "    return [q + 1] * r + [q] * (p - r)\n", "    return [q] * (p - r) + [q + 1] * r\n",
     "test_stage_layers_split_evenly_and_give_the_extra_layers_to_the_first_stages",
     "98 layers on 8 stages, even: got [12, 12, 12, 12, 12, 12, 13, 13]: the extra layers on the LAST stages"),
    (LAB12, "+ ffn * hidden + hidden)\n", "+ ffn * hidden + hidden // tp)\n",
     "test_params_per_rank_counts_the_tp_shard_of_a_stage",
     "(x0.9925 of the expected): b2 split too?"),
    (LAB09, "        finish = max(float(ready), finish) + float(comm)", "        finish = max(float(ready) + float(comm), finish)",
     "test_finish_time_on_hand_checked_timelines", "(x0.7273 = 8/11 of the expected): each all-reduce started at its own"),
    (LAB11, "        [b for b in range(1, min(per_replica, MAX_MICRO_BATCH) + 1) if per_replica % b == 0]",
     "        [b for b in range(1, min(per_replica, MAX_MICRO_BATCH)) if per_replica % b == 0]",
     "test_predict_chooses_the_micro_batch_and_interleaving_a_run_leaves_open", "both ends included): got 0.0235"),
], ids=["lab11_extra_layers_last", "lab12_b2_split", "lab09_links_side_by_side", "lab11_micro_batch_16_left_out"])
def test_a_count_slip_in_a_lab_formula_is_named_in_its_failure(tmp_path, lab_dir, old, new, test, named):
    # Each slip used to fail with numbers only, or (the micro-batch of 16 left out) to pass: the failure names it.
    lab, broken = _lab_mutant(tmp_path, lab_dir, f"slip_{tmp_path.name}", old, new)
    assert named in _fails(getattr(lab, test), broken)


CONVENTION = "test_each_convention_the_readme_states_changes_its_piece_where_it_matters"   # args: a key's start
SEND_3_4 = ("send", 1e6, 3, 4, "H100-80GB")
DP3_TP4 = ("all_reduce", 1e9, 3, 4, "H100-80GB")


@pytest.mark.parametrize("lab_dir,old,new,test,args,named", [
    (LAB11, 'exposed = {"tp": tp_s, "cp": cp_s, "pp"', 'exposed = {"tp": tp_s, "pp"',
     "test_predict_names_cp_the_binding_axis_when_ring_attention_exposes_most", (), "binding 'tp' for a plan"),
    (LAB11, "inside = stride < gpu.gpus_per_node and m > 1", "inside = stride < gpu.gpus_per_node",
     "test_collective_time_is_the_course_network_model_at_measured_bandwidths", SEND_3_4, "3 GPUs at stride 4"),
    (LAB11, "    while size % m:\n        m -= 1\n", "",
     "test_collective_time_is_the_course_network_model_at_measured_bandwidths", DP3_TP4, "3 GPUs at stride 4"),
    (LAB11, 'key = (not result["fits"], result', "key = (False, result",
     "test_predict_chooses_the_micro_batch_and_interleaving_a_run_leaves_open", (), "got 26.3658"),
    (LAB11, "in_flight = math.ceil(layers[stage] / v) *", "in_flight = layers[stage] // v *",
     "test_memory_bytes_per_gpu_an_interleaved_stage_holds_whole_chunks_of_layers", (), "ceil(7 / 8) = 1"),
    (LAB11, 'stored -= 7 * sbh / (t if sp else 1)', 'stored -= 7 * sbh / t', CONVENTION, 'fp8 at TP 2 without SP',
     "['activations']"),
    (LAB11, 'if z == 3 and g > 1 else 0.0)', 'if z == 3 else 0.0)', CONVENTION, 'ZeRO-3 with one data-parallel rank',
     "['buffers']: got 100689920"),
    (LAB11, 'n_params / g * gb, r, t * g, gpu)', 'n_params / g * gb, r, t, gpu)', CONVENTION, "HSDP's replicas of one shard",
     "['added']"),
    (LAB11, 'max(1, cfg["kv_heads"] // t)', '(cfg["kv_heads"] // t)', CONVENTION, "CP's all-gather carries",
     'at least one KV head'),
    (LAB11, 'n_params / g * gb, r, t * g, gpu)', 'n_params / g * gb, r, t * g, base)', CONVENTION,
     "DeepSpeed's share of the bandwidth",
     "['added']"),
    (LAB12, "    act = micro_batch * seq * hidden * dtype_bytes\n", "    act = micro_batch * seq * hidden * 8\n",
     "test_predicted_bytes_of_the_capstone_plan_equal_the_bill_worked_by_hand", (), "dtype_bytes ignored"),
    (LAB08, "return 2.0 * sbh / (t if sequence_parallel else 1)", "return 2.0 * sbh / t",
     "test_korthikanti_table_2_rows_for_gpt3_175b", (8, False, "full", 2), "plain TP keeps the whole input"),
    (LAB08, "not 0 <= value < float(\"inf\")", "not 0 < value < float(\"inf\")",
     "test_model_state_follows_the_dtypes_it_is_given", (), "optimizer_bytes_per_param must be"),
    (LAB10, "    return int(math.ceil(round(", "    return float(math.ceil(round(",
     "test_expert_capacity_is_the_ceiling_of_cf_times_the_average_load", (), "the docstring says an int"),
    # a pipeline's send stride, the optimizer's shard group, the 1F1B warm-up's cap
    (LAB11, 'p, cfg["tp"] * cfg["cp"] * cfg["dp"], gpu)', 'p, cfg["tp"] * cfg["cp"], gpu)', CONVENTION,
     "a pipeline's stages sit",
     "['sends']"),
    (LAB11, '/ (cfg["shard_group"] if cfg["zero_stage"] >= 1 else 1)', '/ (cfg["dp"] if cfg["zero_stage"] >= 1 else 1)',
     CONVENTION, 'ZeRO shards the optimizer', "['step_time_s']"),
    (LAB12, "warmup = min(stages - stage - 1, microbatches)", "warmup = stages - stage - 1",
     "test_one_f_one_b_order_is_the_1f1b_rule_on_every_stage", (4, 2), "3 forwards before the first backward"),
], ids=["lab11_binding_without_cp", "lab11_send_ignores_members", "lab11_members_not_a_divisor",
        "lab11_choice_that_does_not_fit", "lab11_interleaved_floor", "lab11_fp8_saving_over_t", "lab11_zero3_dp1_buffers",
        "lab11_hsdp_replica_stride", "lab11_cp_gather_no_kv_floor", "lab11_deepspeed_share_base", "lab12_bf16_ignored",
        "lab08_full_recompute_over_t", "lab08_k_zero_refused", "lab10_capacity_float",
        "lab11_pp_send_stride_without_dp", "lab11_optimizer_shard_over_dp", "lab12_warmup_without_min"])
def test_a_pure_function_slip_that_once_passed_every_visible_test_fails_naming_it(tmp_path, lab_dir, old, new, test,
                                                                                  args, named):
    # Each slip passed every visible test until the test named here was added or sharpened.
    lab, broken = _lab_mutant(tmp_path, lab_dir, f"pure_slip_{tmp_path.name}", old, new)
    if test == CONVENTION:   # the convention's name as Lab 11's tests spell it, found by its first words
        args = (next(name for name in lab.CONVENTIONS if name.startswith(args)),)
    with pytest.raises((pytest.fail.Exception, Exception)) as info:   # a failed check, or the learner's ValueError
        getattr(lab, test)(broken, *args)
    assert named in str(info.value), str(info.value)


def test_a_bubble_that_ignores_the_virtual_stages_is_named(tmp_path):
    # Lab 11: the interleaved schedule's bubble without its 1/v must be named, not reported as a bare "x3".
    lab, broken = _lab_mutant(tmp_path, LAB11, "bubble_without_v", "    return (p - 1) / (v * m) * m * stage_s, sends\n",
                              "    return (p - 1) / m * m * stage_s, sends\n")
    plan = next(name for name in lab.PLANS if lab.PLANS[name].get("vpp", 1) > 1)
    assert "virtual stages per GPU: (p - 1) / (v m) of the ideal step" in \
        _fails(lab.test_pipeline_time_bubble_and_sends, broken, plan)


@pytest.mark.slow   # Lab 09's 2- and 4-rank jobs: about 35 s at load 3 on 2 cores
def test_a_wrapper_that_keeps_the_last_steps_works_is_caught_when_a_bucket_never_launches(tmp_path):
    # finish_gradient_synchronization never resetting self.works: a later step whose buckets did not all launch
    # waits on the last step's works instead of raising. Only a step with a parameter that gets no gradient
    # shows it; without that test it passed every test and the grader.
    run = run_planted(tmp_path, LAB09, "        self.works = [None] * len(self.plan)\n        self.times = [",
                      "        self.times = [", "-k", "never_all_launch")
    assert run.outcomes.get("failed") == 2, run.output[-3000:]
    assert "expected RuntimeError naming the buckets never launched" in run.failure(0)[0], run.failure(0)[:3]


@pytest.mark.slow   # one 8-rank job of Lab 12: about 20 s at load 3 on 2 cores
def test_a_ledger_with_the_worlds_ring_factor_is_named(tmp_path):
    # The Ledger's ring factor from dist.get_world_size() (8) instead of the group's (2) must be named, not
    # reported as a bare "x1.75 = 7/4".
    run = run_planted(tmp_path, LAB12, "            size = dist.get_world_size(group)",
                      "            size = dist.get_world_size()", "-x", "-k", "ledger_agrees and 2x2x2")
    assert "where the group's belongs: dist.get_world_size(group)" in run.failure(0)[0], run.failure(0)[:3]


@pytest.mark.slow   # Lab 09's 2- and 4-rank jobs: about 25 s at load 3 on 2 cores
def test_a_bucket_divided_before_its_all_reduce_finished_is_named(tmp_path):
    # The division moved before work.wait() must be named, not reported as one item wrong by a bare "x1.487".
    run = run_planted(tmp_path, LAB09, "            work.wait()\n            future.wait()\n"
                      "            self.bucket_buffers[b].div_(self.world_size)\n",
                      "            self.bucket_buffers[b].div_(self.world_size)\n            work.wait()\n"
                      "            future.wait()\n", "-x", "-k", "equal_pytorch_ddp")
    first = run.failure(0)[0]
    assert "is off by no single factor" in first and "before its all-reduce completed" in first, first


@pytest.mark.slow   # one lab run each, -x: 10-50 s at load 3 on 2 cores
@pytest.mark.parametrize("lab_dir,old,new,test,named", [
    (LAB10, "        self.dropped = int((~keep).sum())\n",
     "        if capacity is not None:\n            self.dropped = int((~keep).sum())\n",
     "capacity_in_the_layer", "every call sets it, 0 when nothing is dropped"),
    (LAB10, "        router.weight = nn.Parameter(moe.router.weight.detach().clone())",
     "        router.weight = nn.Parameter(moe.router.weight.detach())", "holds_only_its_experts",
     "router.weight share memory with the full MoE's"),
    (LAB10, "    if sum(recv_splits) != output.shape[0]:\n", "    if False:\n", "all_to_all_single_takes",
     "expected a ValueError naming output_split_sizes"),
    (LAB12, "            return originals[\"all_reduce\"](tensor, op=op, group=group, async_op=async_op)",
     "            return originals[\"all_reduce\"](tensor, op=op, group=group)", "async_op_on",
     "not a work to wait on"),
    (LAB10, "        self.send_counts, self.recv_counts = send_splits, recv_splits\n",
     "        self.send_counts, self.recv_counts = send_splits, recv_splits\n"
     "        self.send_counts = [0 if j == self.rank else c for j, c in enumerate(send_splits)]\n",
     "bytes_each_rank", "this rank's own, differs: it counts the copies that stay local too"),
], ids=["lab10_dropped_stale", "lab10_router_shared", "lab10_output_rows", "lab12_async_dropped",
        "lab10_send_counts_without_its_own"])   # the last: the docstring's "its own included"
def test_each_docstring_promise_fails_its_test_when_broken(tmp_path, lab_dir, old, new, test, named):
    # Each plant breaks a promise of a docstring that no test checked (it passed every test and the grader).
    run = run_planted(tmp_path, lab_dir, old, new, "-x", "-k", test)
    assert run.outcomes.get("failed") == 1 and named in "\n".join(run.failure(0)[:3]), run.output[-3000:]


@pytest.mark.slow   # one 2-rank start-up of Lab 08's jobs each: about 20 s at load 3 on 2 cores
@pytest.mark.parametrize("old,new,test,named", [
    ("            self.grad_shards[j].add_(shard)", "            self.grad_shards[j].copy_(shard)",
     "sharded_optimizer_equals and 2-adamw", "only the last micro-batch's gradient: accumulate"),
    ("            if self.zero_stage == 2:\n                grad = self.grad_shards[j].clone()",
     "            if False:\n                grad = self.grad_shards[j].clone()",
     "sharded_optimizer_equals and 2-adamw", "no gradient at all: at stage 2 the step's gradient is in grad_shards"),
    ("            hyper = self.optimizer.param_groups[local[index]] if index in local else param_group",
     "            hyper = param_group", "consolidated_state_dict_equals and 2",
     "hyper-parameters differ from plain AdamW's state_dict(): param_groups[0]: missing ['amsgrad'"),
    ("else (value.clone() if torch.is_tensor(value) else value)", "else value",
     "consolidated_state_dict_equals and 2", "it is the live state's tensor, not a copy"),
], ids=["stage2_shard_overwritten", "stage2_as_stage1", "hyper_from_given_groups", "step_not_cloned"])
def test_a_sharded_optimizer_slip_is_named_in_its_failure(tmp_path, old, new, test, named):
    # Lab 08's ZeRO slips: the failure names the slip, not only "the parameters differ" (stage 2), a
    # 'params' printed on one side only, or a bare "got 4.0, expected 3.0".
    run = run_planted(tmp_path, LAB08, old, new, "-x", "-k", test)
    assert run.outcomes.get("failed") == 1, run.output[-3000:]
    assert named in "\n".join(run.failure(0)[:3]), "\n".join(run.failure(0)[:6])


@pytest.mark.slow   # a 4-rank and a 2-rank start-up of the whole layer: about 40 s at load 5 on 2 cores
def test_a_backward_that_leaves_its_group_and_rows_not_regrouped_by_expert_are_named(tmp_path, monkeypatch):
    # AllToAll's backward called without ctx.group (it passes unless the backward, not only the forward, runs
    # on a subgroup), and received rows left in arrival order (grouped by source, not by expert), which
    # must be named rather than reported as a bare ratio.
    lab, broken = _lab_mutant(
        tmp_path, LAB10, "backward_group",
        "        return all_to_all(grad.contiguous(), recv_splits, send_splits, ctx.group), None, None, None\n",
        "        return all_to_all(grad.contiguous(), recv_splits, send_splits), None, None, None\n")
    results = run_ranks(lab.moe_worker, 4, (broken, lab._case(4, with_skew=False)), timeout=120)
    monkeypatch.setattr(lab, "_results", lambda *_args, **_kw: results)
    with pytest.raises(pytest.fail.Exception) as info:
        lab.test_the_layers_backward_on_a_subgroup_stays_in_its_group(broken)
    print(info.value)
    assert str(info.value).startswith("rank 0 (group [0, 1]): the layer's backward on its group raised") and \
        "keep it in ctx (ctx.group = group)" in str(info.value)
    lab, broken = _lab_mutant(tmp_path, LAB10, "no_regroup", "by_expert = torch.argsort(local_ids, stable=True)",
                              "by_expert = torch.arange(len(local_ids), device=x.device)")
    results = run_ranks(lab.moe_worker, 2, (broken, lab._case(2, with_skew=False)), timeout=120)
    monkeypatch.setattr(lab, "_results", lambda *_args, **_kw: results)
    with pytest.raises(pytest.fail.Exception) as info:
        lab.test_expert_parallel_outputs_and_input_grads_equal_the_single_process_moe(broken, 2, "dropless")
    print(info.value)
    assert "the layer's output" in str(info.value) and "Regroup them by local expert" in str(info.value)


@pytest.mark.slow   # a 2-rank (Lab 09) and an 8-rank (Lab 12) start-up: about 60 s at load 8 on 2 cores
def test_no_sync_without_finally_and_a_blocking_backward_send_are_named(tmp_path):
    # Two slips that no other test catches: Lab 09's no_sync() restoring its
    # flag after the yield but not in a finally (an exception inside the block leaves the wrapper holding back
    # every later backward), and Lab 12's backward sending its gradient with a blocking dist.send (gloo
    # buffers it; NCCL would deadlock 1F1B).
    lab, broken = _lab_mutant(tmp_path, LAB09, "no_finally",
                              "        try:\n            yield\n        finally:\n            self.syncing = True\n",
                              "        yield\n        self.syncing = True\n")
    assert "the wrapper stayed in no_sync. Set the flag back in a finally block" in \
        _fails(lab.test_no_sync_sends_nothing_until_the_last_microbatch, broken)
    lab, broken = _lab_mutant(tmp_path, LAB12, "blocking_send",
                              "pending.append((dist.isend(back, dst=ctx[\"prev\"], tag=microbatches + k), back))",
                              "dist.send(back, dst=ctx[\"prev\"], tag=microbatches + k)")
    message = _fails(lab.test_each_send_is_waited_on_at_the_end_of_the_step_not_at_once, broken)
    assert re.match(r"rank \d+, step 0: a blocking dist\.send \(tag \d+\) where the docstring asks for dist\.isend",
                    message), message


@pytest.mark.slow   # a 2-rank and a 4-rank start-up of Lab 09's learner run: about 30 s at load 6 on 2 cores
def test_a_finish_that_waits_on_the_work_but_not_on_its_future_is_named(tmp_path):
    # A slip no other test catches: finish_gradient_synchronization waits on each
    # bucket's work but not on the future whose callback records 'finish'. On gloo the callbacks run before
    # work.wait() returns, so nothing showed; the test now completes each future a little late.
    lab, broken = _lab_mutant(tmp_path, LAB09, "no_future_wait", "            work.wait()\n            future.wait()\n",
                              "            work.wait()\n")
    with pytest.raises(pytest.fail.Exception) as info:
        lab.test_timeline_has_each_bucket_ready_then_launched_then_finished(broken, 2)
    print(info.value)
    assert re.match(r"rank \d, bucket \d: no 'finish' in its record when finish_gradient_synchronization\(\) returned",
                    str(info.value)) and "wait on each bucket's future too" in str(info.value)
