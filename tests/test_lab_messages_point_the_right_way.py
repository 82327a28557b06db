"""Labs 01, 02, 06 and 07 name the real slip: mistakes planted in copies of the references, and the
helpers that read the evidence, fed what each slip leaves behind.

* Lab 01 has no tensors: a formula slip that is off by float32's rounding in its 1-byte case is not blamed on
  float32, and the case furthest off (where the slip's factor shows) is reported first.
* Lab 02: a received chunk added into the chunk that was sent says "received into a different chunk?" (not
  "copied instead of added?"); chunks counted in bytes say "bytes vs elements?" (not a bare torch
  size-mismatch error, nor "different chunk"), whether chunk_bounds counts bytes or a receive slice or
  buffer is ``(rb - ra) * element_size()`` long.
* Lab 07: a bubble fraction of the other definition says "relative_to swapped?"; a simulate that raises on
  a valid schedule fails in one line that names it and where to look (not a page of harness frames); a
  received activation that does not require grad says so (not a bare AttributeError on ``x.grad``).
* Lab 06: a wrong value that equals a known slip names it: latency counted (t-1) times, the 2 of 2(t-1)/t
  dropped, one all-reduce per layer, the payload in elements, comm / compute, bits vs bytes, per-rank vs
  total (not a bare got/expected and its ratio); the comm / compute slip is named by the first test it fails
  under ``-x``, not only by the later one on the convention.

The planted runs use ``run_planted`` of ``tests/planted_support.py`` (a lab's tests on its solution with one
line changed, as a learner's starter, in a separate pytest).
"""

import importlib.util
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from commtax.labs import LABS_DIR
from commtax.testing import mismatch

LAB01 = LABS_DIR / "lab-01-alpha-beta"
LAB02 = LABS_DIR / "lab-02-ring-allreduce"
LAB07 = LABS_DIR / "lab-07-pipeline-schedules"
pytestmark = pytest.mark.skipif(
    not (LAB02 / "solution.py").exists(), reason="the student release has no reference solutions to plant bugs in"
)


def _module(name: str, path: Path):
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def _planted():
    return _module("commtax_test_planted_bugs", Path(__file__).with_name("planted_support.py"))


def _lab02_tests():
    return _module("commtax_lab02_test_lab", LAB02 / "test_lab.py")


def _lab07_tests():
    return _module("commtax_lab07_test_lab", LAB07 / "test_lab.py")


# -- Lab 01: no float32 hint without tensors; the worst case first -----------------------------------


def test_the_float32_hint_needs_a_float32_value_not_only_a_difference_of_its_size():
    expected = 0.1
    from_a_float32_tensor = float(torch.tensor(expected, dtype=torch.float32))  # 0.10000000149...
    assert "float32" in mismatch(from_a_float32_tensor, expected)
    off_in_float64 = expected * (1 + 1.49e-8)  # the same relative difference, computed in float64
    why = mismatch(off_in_float64, expected)
    assert why.endswith("(x(1 + 1.5e-08) of the expected)") and "float32" not in why, why
    tensor = mismatch(torch.tensor([expected], dtype=torch.float32), torch.tensor([expected], dtype=torch.float64))
    assert "float32" in tensor, tensor


def test_a_lab01_formula_slip_is_reported_at_its_worst_case_without_a_float32_hint(tmp_path):
    # The ring's bandwidth term times P (a total where the per-rank bytes belong): 5e-6 off at 1 byte, where
    # the latency hides it (a float32-sized difference), x2 at 1 GB. The 1 GB case is the one reported: the
    # 1-byte case alone would read as float32's rounding.
    run = _planted().run_planted(
        tmp_path,
        LAB01,
        "        return 2 * (p - 1) * alpha + bandwidth_term\n",
        "        return 2 * (p - 1) * alpha + bandwidth_term * p\n",
        "-k",
        "allreduce_formula_equals_simulated_time and ring",
        "-x",
    )
    assert run.outcomes.get("failed") == 1, run.output[-3000:]
    first = "\n".join(run.failure(0))
    assert "ring on 2 ranks, 1e+09 bytes: got" in first and "(x2 of the expected)" in first, first
    assert "float32" not in first, first
    assert "also wrong: 5.04e+06 bytes, 4096 bytes, 1 bytes" in first, first


def test_a_failure_over_several_cases_names_the_furthest_off_first():
    lab01 = _module("commtax_lab01_test_lab", LAB01 / "test_lab.py")
    with pytest.raises(pytest.fail.Exception) as failed:
        lab01.expect_cases_close(
            [(1.0 + 5e-9, 1.0, "1 byte"), (3.0, 2.0, "1 GB"), (2.0, 2.0, "1 kB")], what="ring on 2 ranks"
        )
    assert failed.value.msg.startswith("ring on 2 ranks, 1 GB: got 3, expected 2 (x1.5 = 3/2 of the expected)"), (
        failed.value
    )
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
    in_bytes = t.size_mismatch_hint(
        "RuntimeError: output with shape [1] doesn't match the broadcast shape [4]\n" + note.format(1, 8, 2)
    )
    assert "Bytes vs elements?" in in_bytes and "4 is a chunk of the buffer's 8 bytes" in in_bytes, in_bytes
    other = t.size_mismatch_hint(
        "RuntimeError: output with shape [1] doesn't match the broadcast shape [2]\n" + note.format(3, 8, 2)
    )
    assert "Received into a different chunk?" in other and "Bytes" not in other, other
    assert t.size_mismatch_hint("RuntimeError: output with shape [1] doesn't match the broadcast shape [2]") is None
    assert t.size_mismatch_hint("RuntimeError: something else\n" + note.format(3, 8, 2)) is None


@pytest.mark.slow  # a Lab 02 job on real ranks (a minute or two under load); the two tests above read the evidence
def test_a_ring_that_adds_the_received_chunk_into_the_one_it_sent_is_told_received_into_a_different_chunk(tmp_path):
    planted = _planted()
    old, new = "        target = flat[recv_start:recv_stop]\n", "        target = flat[send_start:send_stop]\n"
    run = planted.run_planted(tmp_path / "rs", LAB02, old, new, "-k", "reduce_scatter_leaves", "-x")
    first = "\n".join(run.failure(0))
    assert "Received into a different chunk? Chunk 0 of rank 0 holds" in first and "copied" not in first, first
    run = planted.run_planted(tmp_path / "ar", LAB02, old, new, "-k", "ring_all_reduce_equals", "-x")
    first = "\n".join(run.failure(0))
    assert "Received into a different chunk?" in first and "copied" not in first, first


@pytest.mark.slow  # as above
def test_chunk_bounds_counted_in_bytes_are_told_bytes_vs_elements(tmp_path):
    run = _planted().run_planted(
        tmp_path,
        LAB02,
        "    bounds = chunk_bounds(flat.numel(), size)\n    largest",
        "    bounds = chunk_bounds(flat.numel() * flat.element_size(), size)\n    largest",
        "-k",
        "ring_all_reduce_equals",
        "-x",
    )
    first = "\n".join(run.failure(0))
    assert "Bytes vs elements?" in first, first


# A receive slice (and its buffer) sized in bytes while chunk_bounds counts elements: (rb - ra) * element_size().


def _mismatch(t, output, broadcast, case, rank=None, posted=None):
    """A rank's report of a torch size mismatch in ``case`` (elements, bytes each, ranks), as :func:`noted`
    notes it: with the receives ``rank`` had posted (in elements), if given."""
    text = (
        f"rank {rank} raised RuntimeError: output with shape [{output}] doesn't match the broadcast shape "
        f"[{broadcast}]\n" + t.CASE_NOTE.format(*case)
    )
    return text if posted is None else text + "\n" + t.RECEIVES_NOTE.format(rank, ", ".join(map(str, posted)))


def test_a_rank_notes_the_receives_it_posted_when_torch_says_two_lengths_differ():
    t = _lab02_tests()
    traffic = SimpleNamespace(messages=[("send", 1, 0, 8), ("recv", 1, 0, 64), ("recv", 1, 0, 0)])
    mine = torch.zeros(1, dtype=torch.float64)
    with pytest.raises(RuntimeError) as raised:  # a 1-element chunk += an 8-element receive slice
        t.noted(lambda: mine.add_(torch.zeros(8, dtype=torch.float64)), mine, 2, 1, traffic)
    notes = raised.value.__notes__
    assert notes == [t.CASE_NOTE.format(1, 8, 2), t.RECEIVES_NOTE.format(1, "8, 0")], notes
    with pytest.raises(ValueError) as other:  # any other error: the case only
        t.noted(lambda: int("x"), mine, 2, 1, traffic)
    assert other.value.__notes__ == [t.CASE_NOTE.format(1, 8, 2)], other.value.__notes__


def test_a_receive_slice_sized_in_bytes_is_told_bytes_vs_elements_not_a_different_chunk():
    t = _lab02_tests()
    # A receive slice in bytes, buf[: (rb - ra) * element_size()], with buf of the largest chunk's 2 elements:
    # rank 0's receive of chunk 1 (1 element) is 8 long, cut to 2, the length of the other chunk.
    clipped = t.size_mismatch_hint(_mismatch(t, 1, 2, (3, 8, 2), rank=0, posted=[2]))
    assert "Bytes vs elements?" in clipped, clipped
    assert "rank 0 received chunk 1 (1 element(s), reduce-scatter step 0) into a slice of 2 elements" in clipped
    assert "Received into a different chunk?" not in clipped, clipped
    # The buffer sized in bytes as well: the receive slice is 1 x 8 = 8 elements, with or without the receive note.
    for text in (_mismatch(t, 1, 8, (1, 8, 2), rank=1, posted=[8]), _mismatch(t, 1, 8, (1, 8, 2))):
        told = t.size_mismatch_hint(text)
        assert told is not None and "Bytes vs elements?" in told and "different chunk" not in told, told
        assert "8 = 1 x 8" in told, told
    # A receive into the chunk that was sent (not the one due): the receive had the right length, the add went astray.
    astray = t.size_mismatch_hint(_mismatch(t, 1, 2, (3, 8, 2), rank=1, posted=[2]))
    assert "Received into a different chunk?" in astray and "Bytes" not in astray, astray


@pytest.mark.slow  # Lab 02 jobs on real ranks, as above
def test_a_receive_slice_or_buffer_of_rb_minus_ra_times_element_size_is_told_bytes_vs_elements(tmp_path):
    planted = _planted()
    old = "        received = inbox[: recv_stop - recv_start]\n"
    run = planted.run_planted(
        tmp_path / "slice",
        LAB02,
        old,
        "        received = inbox[: (recv_stop - recv_start) * flat.element_size()]\n",
        "-k",
        "ring_all_reduce_equals",
        "-x",
    )
    first = run.failure(0)[0]
    assert first.startswith("P = 2, ring_all_reduce: slices of 1 and 2 elements met") and "Bytes vs elements?" in first
    assert "different chunk?" not in first.split("Bytes vs elements?")[0], first
    buffer = "    inbox = _inbox(largest, flat.dtype, flat.device)"
    source = (LAB02 / "solution.py").read_text()
    block = source[source.index(buffer) : source.index(old) + len(old)]
    run = planted.run_planted(
        tmp_path / "buffer",
        LAB02,
        block,
        block.replace("_inbox(largest,", "_inbox(largest * flat.element_size(),").replace(
            old, "        received = inbox[: (recv_stop - recv_start) * flat.element_size()]\n"
        ),
        "-k",
        "ring_all_reduce_equals",
        "-x",
    )
    first = run.failure(0)[0]
    assert (
        first.startswith("P = 2, ring_all_reduce: slices of 1 and 8 elements met") and "Bytes vs elements?" in first
    ), first


# -- Lab 06: a value that equals a known slip names it -----------------------------------------------

LAB06 = LABS_DIR / "lab-06-tp-comm-cost"
LAB06_SLIPS = {  # slip: (the reference's line, the learner's, the first test it fails, its first line's start, the slip named)
    "one all-reduce per layer": (
        "    return 2 * num_layers * allreduce_time_s(",
        "    return num_layers * allreduce_time_s(",
        "test_a_decode_step_issues_64_all_reduces",
        "32 layers x 2 all-reduces: got",
        "one all-reduce per layer: a TP layer has two",
    ),
    "payload in elements": (
        "    return batch_tokens * hidden * dtype_bytes\n",
        "    return batch_tokens * hidden\n",
        "test_payload_is_one_activation_row_per_token",
        "one decode token (8 KiB): got 4096",
        "elements, not bytes: multiply by dtype_bytes",
    ),
    "latency (t-1) times": (
        "    return 2 * (tp - 1) * latency_s + traffic",
        "    return (tp - 1) * latency_s + traffic",
        "test_hop_model_is_the_simulated_ring",
        "8192 bytes on 2 ranks: got",
        "latency counted (t-1) times: a ring all-reduce has 2(t-1) steps",
    ),
    "comm / compute": (
        "    return comm_s / (comm_s + compute_s)\n",
        "    return comm_s / compute_s\n",
        "test_decode_comm_on_nvlink_is_small_but_a_faster_gpu_makes_it_relatively_larger",
        "vs the table's 8 ms: got",
        "that is comm / compute: the share asked is comm / (comm + compute)",
    ),
    "the 2 of 2(t-1)/t dropped": (
        "    return 2 * (tp - 1) / tp * payload_bytes",
        "    return (tp - 1) / tp * payload_bytes",
        "test_ring_traffic_formula",
        "t = 2: exactly one payload: got 4096",
        "x0.5: the 2 in 2(t-1)/t dropped (an all-reduce is a reduce-scatter plus an all-gather",
    ),
    "bits vs bytes": (
        "    return 2 * (tp - 1) * latency_s + traffic",
        "    return 2 * (tp - 1) * latency_s + 8 * traffic",
        "test_hop_model_is_the_simulated_ring",
        "8192 bytes on 2 ranks: got",
        "bits vs bytes",
    ),
    "traffic of all ranks": (
        "    return 2 * (tp - 1) / tp * payload_bytes",
        "    return 2 * (tp - 1) * payload_bytes",
        "test_ring_traffic_formula",
        "t = 2: exactly one payload: got 16384",
        "per-rank vs total",
    ),
    "weights not shared by the t ranks": (
        "    return n_params * dtype_bytes / (tp * hbm_bandwidth)",
        "    return n_params * dtype_bytes / hbm_bandwidth",
        "test_decode_step_time_streams_every_weight_once_per_token",
        "t = 2: the ranks share the reads: got 0.008",
        "per-rank vs total: not divided by t",
    ),
}


@pytest.mark.parametrize("slip", list(LAB06_SLIPS))
def test_a_lab06_value_that_equals_a_known_slip_names_the_slip(tmp_path, slip):
    old, new, test, start, named = LAB06_SLIPS[slip]
    planted = _planted()
    tests, mutant = planted._lab_mutant(
        tmp_path, LAB06, "slip_" + "".join(c if c.isalnum() else "_" for c in slip), old, new
    )
    first = planted._fails(getattr(tests, test), mutant).splitlines()[0]
    assert first.startswith(start) and named in first, first


def test_lab06_values_that_are_no_known_slip_are_numbers_only():
    checks = _module("commtax_lab06_checks", LAB06 / "_checks.py")
    slips = checks.allreduce_slips(8192, 2, 3e-6, 450e9)
    with pytest.raises(pytest.fail.Exception) as other:
        checks.expect_known(5e-6, 6.0182e-6, slips, what="one all-reduce", rel=1e-9)
    assert other.value.msg.startswith(
        "one all-reduce: got 5e-06, expected 6.0182e-06 (x0.8308 of the expected)"
    ) and other.value.msg.endswith("of the expected)"), other.value.msg
    checks.expect_known(6.0182e-6, 6.0182e-6, slips, what="one all-reduce")


def test_comm_over_compute_in_a_planted_lab06_is_named_by_the_first_test_it_fails(tmp_path):
    # The test that names the convention (comm over comm plus compute, at the edges) runs later; under -x the
    # learner sees only the first failure, which must say it.
    old, new, test, start, named = LAB06_SLIPS["comm / compute"]
    run = _planted().run_planted(
        tmp_path, LAB06, old, new.replace("compute_s\n", "compute_s if compute_s else 1.0\n"), "-x"
    )
    assert run.failed() == [f"labs/lab-06-tp-comm-cost/test_lab.py::{test}"], run.output[-3000:]
    first = run.failure(0)[0]
    assert first.startswith(start) and named in first, first


# -- Lab 07: the two bubble definitions; simulate raising on a valid schedule; a received activation's grad --


def test_a_bubble_of_the_other_definition_is_told_relative_to_swapped():
    t = _lab07_tests()
    with pytest.raises(pytest.fail.Exception) as ideal:  # the share of the step where ideal was asked
        t.expect_bubble(7 / 39, 8, 32, 1, "ideal", what="p = 8, m = 32, relative to ideal")
    assert ideal.value.msg.startswith("p = 8, m = 32, relative to ideal: got 0.179"), ideal.value.msg
    assert "the bubble's share of the step: relative_to swapped?" in ideal.value.msg, ideal.value.msg
    with pytest.raises(pytest.fail.Exception) as total:
        t.expect_bubble(7 / 64, 8, 32, 2, "total", what="v = 2, share of the step")
    assert "relative to the ideal step: relative_to swapped?" in total.value.msg, total.value.msg
    with pytest.raises(pytest.fail.Exception) as other:  # another wrong value: numbers only
        t.expect_bubble(7 / 40, 8, 32, 1, "ideal", what="p = 8, m = 32")
    assert "swapped" not in other.value.msg, other.value.msg
    t.expect_bubble(7 / 39, 8, 32)


class _RaisingLab:
    """A lab whose simulate raises what the learner's did (the boundary rebuilds it with its traceback)."""

    def __init__(self, exc):
        self.exc = exc

    def simulate(self, *args, **kwargs):
        raise self.exc


def test_simulate_raising_on_a_valid_schedule_is_told_in_one_line_with_the_learners_line():
    t = _lab07_tests()
    exc = ValueError("the interleaved_1f1b order cannot proceed: every device waits on another")
    exc.add_note(
        'in the learner\'s code:\nTraceback (most recent call last):\n  File "/x/labs/lab-07/starter.py", '
        "line 164, in simulate\n    raise ValueError(message)\nValueError: the interleaved_1f1b order ..."
    )
    with pytest.raises(pytest.fail.Exception) as failed:
        t.simulate(_RaisingLab(exc), "interleaved_1f1b", 2, 4, 2)
    lines = failed.value.msg.splitlines()
    assert lines[0] == (
        "simulate raised on a valid interleaved_1f1b schedule: simulate('interleaved_1f1b', p=2, m=4, "
        "v=2) raised ValueError: the interleaved_1f1b order cannot proceed: every device waits on "
        "another"
    ), lines[0]
    assert lines[1] == "  at starter.py:164 in simulate: raise ValueError(message)", lines[1]
    assert "README's worked example (p = 2, v = 2, m = 4)" in lines[2], lines[2]
    with pytest.raises(NotImplementedError):  # a starter's stub keeps its own message
        t.simulate(_RaisingLab(NotImplementedError("simulate")), "gpipe", 2, 4)


def test_a_grad_of_none_sent_back_is_told_the_activation_must_require_grad():
    t = _lab07_tests()
    text = (
        "DistributedRunError: distributed run of check_real_pipeline() on 2 ranks (gloo) failed: rank 1 raised "
        "AttributeError: 'NoneType' object has no attribute 'numel'\n  rank 1: labs/lab-07-pipeline-schedules/"
        "starter.py:269 in train_1f1b: `sends.append(dist.isend(x.grad, g(rank - 1), group, tag=2 * i + 1))`\n"
    )
    hint = t.grad_is_none_hint(text)
    assert hint.startswith("x.grad is None on rank 1: the received activation must require grad"), hint
    assert t.grad_is_none_hint(text.replace("x.grad", "out")) is None
    assert t.grad_is_none_hint(text.replace("'NoneType'", "'Tensor'")) is None


def test_a_bubble_with_the_definitions_swapped_in_a_planted_lab_is_told_so(tmp_path):
    run = _planted().run_planted(
        tmp_path,
        LAB07,
        'return (stages - 1) / work if relative_to == "ideal" else',
        'return (stages - 1) / work if relative_to == "total" else',
        "-k",
        "megatron_lm_example",
        "-x",
    )
    first = run.failure(0)[0]
    assert first.startswith("p = 8, m = 32, relative to ideal: got 0.179"), first
    assert "relative_to swapped?" in first, first


def test_a_planted_simulate_that_raises_on_a_valid_order_fails_in_a_few_lines_naming_it(tmp_path):
    # Interleaved backwards not reversed through the chunks: the order cannot proceed, and the reference's
    # simulate says so with a ValueError, shown in a few lines, not behind ~45 lines of the harness's frames.
    run = _planted().run_planted(
        tmp_path, LAB07, "v - 1 - chunk if backward else chunk", "chunk", "-k", "interleaved_order", "-x"
    )
    failure = run.failure(0)
    assert failure[0].startswith(
        "simulate raised on a valid interleaved_1f1b schedule: simulate('interleaved_1f1b', "
        "p=2, m=4, v=2) raised ValueError: the interleaved_1f1b order deadlocks"
    ), failure
    assert failure[1].startswith("  at starter.py:") and "in simulate: raise ValueError" in failure[1], failure
    assert len(failure) < 8 and "proxy.py" not in "\n".join(failure), failure


@pytest.mark.slow  # a Lab 07 job on real ranks; the test above reads the evidence
def test_a_received_activation_that_does_not_require_grad_is_told_so(tmp_path):
    run = _planted().run_planted(
        tmp_path, LAB07, "                x.requires_grad_()\n", "", "-k", "real_1f1b_pipeline_gradients", "-x"
    )
    first = run.failure(0)[0]
    assert first.startswith("P = 2, train_1f1b: x.grad is None on rank 1: the received activation must require grad"), (
        first
    )
