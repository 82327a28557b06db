"""Lab 13's tests catch the three classic ring-attention mistakes, each with a test whose name says why.

Each case edits one line of the reference, runs the lab's own tests on it as a
learner's ``starter.py`` (``run_planted`` of ``tests/planted_support.py``),
and checks which tests fail and which still pass. The two block bugs run only
the one-process tests (``-k``: they fail there, before any rank starts, which is
where a learner meets them); the unwaited transfer needs the 2-rank job.
"""

import re

import pytest

from commtax.boundary.byfile import load_module_from_file
from commtax.labs import LABS_DIR, REPO_ROOT

LAB13 = LABS_DIR / "lab-13-context-parallel"
pytestmark = pytest.mark.skipif(
    not (LAB13 / "solution.py").exists(), reason="the student release has no reference solution to plant bugs in"
)
run_planted = load_module_from_file(
    "commtax_planted_bugs_runner", str(REPO_ROOT / "tests" / "planted_support.py")
).run_planted


def _failed(run) -> set[str]:
    return {name.split("::")[-1] for name in run.failed()}


def _passed(run) -> set[str]:
    return set(re.findall(r"^PASSED \S+::(test_\S+)", run.output, re.M))


def test_a_diagonal_block_that_masks_the_past_instead_of_the_future_is_caught(tmp_path):
    mask = "        future = torch.ones(s.shape[0], s.shape[2], dtype=torch.bool, device=s.device)"
    run = run_planted(tmp_path, LAB13, mask + ".triu(1)\n", mask + ".tril(-1)\n", "-k", "block_forward", "-rA")
    failed, passed = _failed(run), _passed(run)
    assert "test_block_forward_masks_only_the_future_keys_of_a_diagonal_block" in failed, run.output[-3000:]
    assert "test_block_forward_folds_blocks_into_the_exact_softmax[normal_logits]" in failed
    assert "one diagonal block = causal attention" in run.output
    assert not passed & {"test_block_forward_masks_only_the_future_keys_of_a_diagonal_block"}


def test_a_softmax_without_the_running_max_passes_normal_logits_and_fails_logits_near_1000(tmp_path):
    run = run_planted(
        tmp_path,
        LAB13,
        "    m_new = torch.maximum(m, s.amax(-1))\n",
        "    m_new = torch.zeros_like(m)     # exp(s) unshifted\n",
        "-k",
        "block_forward",
        "-rA",
    )
    failed, passed = _failed(run), _passed(run)
    assert "test_block_forward_folds_blocks_into_the_exact_softmax[logits_near_1000_need_the_running_max]" in failed, (
        run.output[-3000:]
    )
    assert "got nan" in run.output  # exp(1000) / exp(1000) = inf / inf
    # mathematically the same softmax: with ordinary logits the bug is invisible
    assert "test_block_forward_folds_blocks_into_the_exact_softmax[normal_logits]" in passed, run.output[-3000:]
    assert "test_block_forward_masks_only_the_future_keys_of_a_diagonal_block" in passed


def test_a_ring_that_never_waits_for_its_forward_transfers_is_caught_by_the_wait_check(tmp_path):
    run = run_planted(
        tmp_path,
        LAB13,
        '            with timed(timeline, phase="forward", step=step, event="wait"):\n'
        "                for work in works:\n"
        "                    work.wait()\n",
        '            with timed(timeline, phase="forward", step=step, event="wait"):\n'
        "                pass                      # the transfers are never waited for\n",
        "-k",
        "isend_and_irecv and 2]",
        "-rA",
    )
    assert "test_every_isend_and_irecv_of_the_ring_is_waited_for[2]" in _failed(run), run.output[-3000:]
    # the runner's dropped-request detector ("never waited on the request of its dist.isend ...") or, where
    # the requests stay referenced, the lab's own wait check ("... were never waited for"): both name the bug
    assert "never waited on the request" in run.output or "were never waited for" in run.output, run.output[-3000:]
    assert "deadlocked" not in run.output
