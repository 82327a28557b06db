"""Labs 01 and 02 name the real slip (issue 40): mistakes planted in copies of the references, and the helpers
that read the evidence, fed what each slip leaves behind.

* Lab 01 has no tensors: a formula slip that is off by float32's rounding in its 1-byte case is not blamed on
  float32, and the case furthest off (where the slip's factor shows) is reported first.
* Lab 02: a received chunk added into the chunk that was sent says "received into a different chunk?" (not
  "copied instead of added?"); chunk bounds counted in bytes say "bytes vs elements?" (not a bare torch
  size-mismatch error).

The planted runs use ``run_planted`` of ``tests/test_planted_bugs.py`` (a lab's tests on its solution with one
line changed, as a learner's starter, in a separate pytest).
"""

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

from commtax.labs import LABS_DIR
from commtax.testing import mismatch

LAB01 = LABS_DIR / "lab-01-alpha-beta"
LAB02 = LABS_DIR / "lab-02-ring-allreduce"
pytestmark = pytest.mark.skipif(not (LAB02 / "solution.py").exists(),
                                reason="the student release has no reference solutions to plant bugs in")


def _module(name: str, path: Path):
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def _planted():
    return _module("commtax_test_planted_bugs", Path(__file__).with_name("test_planted_bugs.py"))


def _lab02_tests():
    return _module("commtax_lab02_test_lab", LAB02 / "test_lab.py")


# -- Lab 01: no float32 hint without tensors; the worst case first -----------------------------------

def test_the_float32_hint_needs_a_float32_value_not_only_a_difference_of_its_size():
    expected = 0.1
    from_a_float32_tensor = float(torch.tensor(expected, dtype=torch.float32))     # 0.10000000149...
    assert "float32" in mismatch(from_a_float32_tensor, expected)
    off_in_float64 = expected * (1 + 1.49e-8)        # the same relative difference, computed in float64
    why = mismatch(off_in_float64, expected)
    assert why.endswith("(x(1 + 1.5e-08) of the expected)") and "float32" not in why, why
    tensor = mismatch(torch.tensor([expected], dtype=torch.float32), torch.tensor([expected], dtype=torch.float64))
    assert "float32" in tensor, tensor


def test_a_lab01_formula_slip_is_reported_at_its_worst_case_without_a_float32_hint(tmp_path):
    # The ring's bandwidth term times P (a total where the per-rank bytes belong): 5e-6 off at 1 byte, where
    # the latency hides it (a float32-sized difference), x2 at 1 GB. The 1-byte case used to come first,
    # blamed on float32.
    run = _planted().run_planted(tmp_path, LAB01, "        return 2 * (p - 1) * alpha + bandwidth_term\n",
                                 "        return 2 * (p - 1) * alpha + bandwidth_term * p\n",
                                 "-k", "allreduce_formula_equals_simulated_time and ring", "-x")
    assert run.outcomes.get("failed") == 1, run.output[-3000:]
    first = "\n".join(run.failure(0))
    assert "ring on 2 ranks, 1e+09 bytes: got" in first and "(x2 of the expected)" in first, first
    assert "float32" not in first, first
    assert "also wrong: 5.04e+06 bytes, 4096 bytes, 1 bytes" in first, first


def test_a_failure_over_several_cases_names_the_furthest_off_first():
    lab01 = _module("commtax_lab01_test_lab", LAB01 / "test_lab.py")
    with pytest.raises(pytest.fail.Exception) as failed:
        lab01.expect_cases_close([(1.0 + 5e-9, 1.0, "1 byte"), (3.0, 2.0, "1 GB"), (2.0, 2.0, "1 kB")],
                                 what="ring on 2 ranks")
    assert failed.value.msg.startswith("ring on 2 ranks, 1 GB: got 3, expected 2 (x1.5 = 3/2 of the expected)"), failed.value
    assert failed.value.msg.endswith("; also wrong: 1 byte"), failed.value


# -- Lab 02: the chunk a receive went into; bytes vs elements ----------------------------------------

def test_a_receive_added_into_the_sent_chunk_is_told_as_such_from_the_evidence():
    t = _lab02_tests()
    world, numel = 2, 8
    bounds = t.bounds_of(numel, world)
    inputs = [t.rank_data(r, numel) for r in range(world)]
    # Rank 0's reduce-scatter with the slip: chunk 1 comes in and is added into chunk 0, the one it sent.
    got = inputs[0].clone()
    got[0:4] += inputs[1][4:8]
    elsewhere = t.received_elsewhere(got, inputs, 0, bounds)
    assert elsewhere == " Chunk 0 of rank 0 holds rank(s) [1]'s chunk 1 added to its own.", elsewhere
    told = t.explain_chunk(got[4:8], [x[4:8] for x in inputs], world, 0, elsewhere)
    assert told.startswith(" Received into a different chunk? Chunk 0 of rank 0") and "copied" not in told, told
    # After the all-gather only the owned chunk is left to see: its owner's own input, nothing added in.
    owned = t.explain_chunk(inputs[0][4:8], [x[4:8] for x in inputs], world, owner=0)
    assert "Received into a different chunk" in owned and "copied" not in owned, owned
    # An overwrite shows another rank's data in the chunk: still "copied instead of added?".
    copied = t.explain_chunk(inputs[1][4:8], [x[4:8] for x in inputs], world, owner=0)
    assert "copied instead of added?" in copied, copied


def test_a_torch_size_mismatch_is_read_against_the_cases_chunks():
    t = _lab02_tests()
    note = t.CASE_NOTE
    in_bytes = t.size_mismatch_hint("RuntimeError: output with shape [1] doesn't match the broadcast shape [4]\n"
                                     + note.format(1, 8, 2))
    assert "Bytes vs elements?" in in_bytes and "4 is a chunk of the buffer's 8 bytes" in in_bytes, in_bytes
    other = t.size_mismatch_hint("RuntimeError: output with shape [1] doesn't match the broadcast shape [2]\n"
                                 + note.format(3, 8, 2))
    assert "Received into a different chunk?" in other and "Bytes" not in other, other
    assert t.size_mismatch_hint("RuntimeError: output with shape [1] doesn't match the broadcast shape [2]") is None
    assert t.size_mismatch_hint("RuntimeError: something else\n" + note.format(3, 8, 2)) is None


@pytest.mark.slow   # a Lab 02 job on real ranks (a minute or two under load); the two tests above read the evidence
def test_a_ring_that_adds_the_received_chunk_into_the_one_it_sent_is_told_received_into_a_different_chunk(tmp_path):
    planted = _planted()
    old, new = "        target = flat[recv_start:recv_stop]\n", "        target = flat[send_start:send_stop]\n"
    run = planted.run_planted(tmp_path / "rs", LAB02, old, new, "-k", "reduce_scatter_leaves", "-x")
    first = "\n".join(run.failure(0))
    assert "Received into a different chunk? Chunk 0 of rank 0 holds" in first and "copied" not in first, first
    run = planted.run_planted(tmp_path / "ar", LAB02, old, new, "-k", "ring_all_reduce_equals", "-x")
    first = "\n".join(run.failure(0))
    assert "Received into a different chunk?" in first and "copied" not in first, first


@pytest.mark.slow   # as above
def test_chunk_bounds_counted_in_bytes_are_told_bytes_vs_elements(tmp_path):
    run = _planted().run_planted(tmp_path, LAB02, "    bounds = chunk_bounds(flat.numel(), size)\n    largest",
                                 "    bounds = chunk_bounds(flat.numel() * flat.element_size(), size)\n    largest",
                                 "-k", "ring_all_reduce_equals", "-x")
    first = "\n".join(run.failure(0))
    assert "Bytes vs elements?" in first, first
