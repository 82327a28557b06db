"""Lab 07 tests: simulated bubbles against the formulas (both definitions), activation memory,
point-to-point time, Megatron-LM's numbers, and a real 1F1B pipeline against single-process training."""

import pytest
import torch
import torch.nn.functional as F

from commtax.testing import SharedRuns
from commtax.ranks.traffic import record_traffic

RUNS = SharedRuns()
UNIFORM = dict(t_forward=1.0, t_backward=2.0)  # equal stage times; backward twice the forward


# -- the formula ---------------------------------------------------------------------------

def test_megatron_lm_example_p8_m32_is_7_32_of_ideal_and_7_39_of_the_step(lab):
    assert lab.bubble_fraction(8, 32, relative_to="ideal") == pytest.approx(7 / 32)
    assert lab.bubble_fraction(8, 32, relative_to="total") == pytest.approx(7 / 39)
    assert lab.bubble_fraction(8, 32, 2, relative_to="ideal") == pytest.approx(7 / 64)  # v = 2 halves it


def test_the_two_definitions_convert_by_r_over_1_plus_r(lab):
    for p, m, v in ((4, 8, 1), (8, 32, 2), (16, 4, 1)):
        r = lab.bubble_fraction(p, m, v, "ideal")
        assert lab.bubble_fraction(p, m, v, "total") == pytest.approx(r / (1 + r))


def test_gpipe_at_m_equal_4p_is_16_to_20_percent_not_negligible(lab):
    shares = [lab.bubble_fraction(p, 4 * p) for p in (4, 8, 16, 64)]
    assert shares[0] == pytest.approx(3 / 19)      # 15.8%
    assert shares[1] == pytest.approx(7 / 39)      # 17.9%
    assert all(0.15 < s < 0.20 for s in shares) and shares == sorted(shares)  # -> (p-1)/(5p-1) -> 20%


# -- the simulator against the formula -------------------------------------------------------

@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("p,m", [(2, 1), (2, 4), (4, 4), (4, 8), (8, 32), (3, 7)])
def test_simulated_bubble_equals_the_formula_both_ways(lab, schedule, p, m):
    ops = lab.simulate(schedule, p, m, **UNIFORM)
    share = lab.measured_bubble(ops)
    assert share == pytest.approx(lab.bubble_fraction(p, m, relative_to="total"))
    assert share / (1 - share) == pytest.approx(lab.bubble_fraction(p, m, relative_to="ideal"))
    assert lab.makespan(ops) == pytest.approx((m + p - 1) * 3.0)


@pytest.mark.parametrize("p,m", [(2, 3), (4, 8)])
def test_naive_pipeline_idles_p_minus_1_over_p(lab, p, m):
    ops = lab.simulate("naive", p, m, **UNIFORM)
    assert lab.measured_bubble(ops) == pytest.approx((p - 1) / p) == pytest.approx(lab.bubble_fraction(p, 1))


@pytest.mark.parametrize("p,m,v", [(4, 8, 2), (4, 8, 4), (8, 32, 2), (2, 4, 2), (4, 4, 2)])
def test_interleaved_bubble_equals_p_minus_1_over_v_m(lab, p, m, v):
    ops = lab.simulate("interleaved_1f1b", p, m, v, **UNIFORM)
    share = lab.measured_bubble(ops)
    assert share == pytest.approx(lab.bubble_fraction(p, m, v, "total"))
    assert share / (1 - share) == pytest.approx(lab.bubble_fraction(p, m, v, "ideal"))


def test_ops_obey_dependencies_and_one_op_per_device(lab):
    for schedule, v in (("gpipe", 1), ("1f1b", 1), ("interleaved_1f1b", 2)):
        p, m = 4, 8
        ops = lab.simulate(schedule, p, m, v, t_p2p=0.25, **UNIFORM)
        assert len(ops) == 2 * p * m * v
        end = {(op.kind, op.chunk * p + op.stage, op.microbatch): op.end for op in ops}
        for op in ops:
            vs = op.chunk * p + op.stage
            if op.kind == "F" and vs > 0:
                assert op.start >= end[("F", vs - 1, op.microbatch)] + 0.25 - 1e-9
            if op.kind == "B":
                assert op.start >= end[("F", vs, op.microbatch)] - 1e-9
                if vs < p * v - 1:
                    assert op.start >= end[("B", vs + 1, op.microbatch)] + 0.25 - 1e-9
        for stage in range(p):
            mine = sorted((op for op in ops if op.stage == stage), key=lambda op: op.start)
            assert all(a.end <= b.start + 1e-9 for a, b in zip(mine, mine[1:])), f"{schedule}: overlap on {stage}"


def test_1f1b_holds_at_most_p_minus_stage_microbatches_where_gpipe_holds_m(lab):
    p, m = 4, 16
    gpipe, one_f_one_b = lab.simulate("gpipe", p, m, **UNIFORM), lab.simulate("1f1b", p, m, **UNIFORM)
    assert [lab.peak_activations_in_flight(gpipe, s) for s in range(p)] == [m] * p
    assert [lab.peak_activations_in_flight(one_f_one_b, s) for s in range(p)] == [p - s for s in range(p)]


def test_p2p_time_adds_2_p_minus_1_transfers_to_gpipe_and_more_to_1f1b(lab):
    for p, m in ((2, 4), (4, 8), (8, 16)):
        base = lab.makespan(lab.simulate("gpipe", p, m, **UNIFORM))
        slow = lab.makespan(lab.simulate("gpipe", p, m, t_p2p=0.1, **UNIFORM))
        assert slow - base == pytest.approx(2 * (p - 1) * 0.1)       # only the fill and the drain wait
        base = lab.makespan(lab.simulate("1f1b", p, m, **UNIFORM))
        slow = lab.makespan(lab.simulate("1f1b", p, m, t_p2p=0.1, **UNIFORM))
        assert slow - base >= 2 * (p - 1) * 0.1 - 1e-9                 # strict alternation exposes more
    assert lab.makespan(lab.simulate("1f1b", 4, 2, t_p2p=0.1, **UNIFORM)) - \
        lab.makespan(lab.simulate("1f1b", 4, 2, **UNIFORM)) == pytest.approx(0.6)


def test_bad_arguments_raise_value_error_naming_them(lab):
    with pytest.raises(ValueError, match="microbatches"):
        lab.simulate("interleaved_1f1b", 4, 6, 2)            # m must be a multiple of p
    with pytest.raises(ValueError, match="schedule"):
        lab.simulate("zero_bubble", 4, 8)
    with pytest.raises(ValueError, match="virtual_stages"):
        lab.simulate("gpipe", 4, 8, 2)
    with pytest.raises(ValueError, match="stages"):
        lab.bubble_fraction(0, 8)
    with pytest.raises(ValueError, match="relative_to"):
        lab.bubble_fraction(4, 8, relative_to="ideal compute")
    with pytest.raises(ValueError, match="t_p2p"):
        lab.simulate("1f1b", 4, 8, t_p2p=-1.0)


# -- a real 1F1B pipeline ------------------------------------------------------------------------

LAYERS, WIDTH, BATCH, MICROBATCHES = 8, 16, 16, 8


def check_real_pipeline(rank, world_size, lab):
    """Runs on every rank: one 1F1B step of this rank's stage vs single-process training of the whole MLP."""
    gen = torch.Generator().manual_seed(3)
    inputs = torch.randn(BATCH, WIDTH, dtype=torch.float64, generator=gen)
    targets = torch.randn(BATCH, WIDTH, dtype=torch.float64, generator=gen)
    reference = lab.make_mlp(LAYERS, WIDTH, seed=0)
    F.mse_loss(reference(inputs), targets).backward()
    stage = lab.split_stages(lab.make_mlp(LAYERS, WIDTH, seed=0), world_size)[rank]
    with record_traffic(forbid_collectives=True) as traffic:
        loss = lab.train_1f1b(stage, (inputs, targets), MICROBATCHES)
    offset = rank * len(stage)
    reference_params = list(reference[offset:offset + len(stage)].parameters())
    diffs = [(mine.grad - ref.grad).abs().max().item() for mine, ref in zip(stage.parameters(), reference_params)]
    return {"max_grad_diff": max(diffs), "loss": None if loss is None else float(loss),
            "reference_loss": F.mse_loss(reference(inputs), targets).item(),
            "sent": traffic.bytes_sent, "received": traffic.bytes_received}


def _pipeline(lab, world_size):
    return RUNS.get(world_size, check_real_pipeline, world_size, (lab,), timeout=120,
                    needs=[lab.train_1f1b, lab.simulate])


@pytest.mark.points(3)
@pytest.mark.parametrize("world_size", [2, 4])
def test_real_1f1b_pipeline_gradients_equal_single_process_training(lab, world_size):
    results = _pipeline(lab, world_size)
    for rank, r in enumerate(results):
        assert r["max_grad_diff"] < 1e-12, f"rank {rank}: gradients differ by {r['max_grad_diff']:g}"
    assert results[-1]["loss"] == pytest.approx(results[-1]["reference_loss"])
    assert all(r["loss"] is None for r in results[:-1])


@pytest.mark.parametrize("world_size", [2, 4])
def test_real_pipeline_sends_one_activation_and_one_gradient_per_microbatch_per_boundary(lab, world_size):
    activation = BATCH // MICROBATCHES * WIDTH * 8   # bytes of one micro-batch's activation (float64)
    for rank, r in enumerate(_pipeline(lab, world_size)):
        boundaries = (rank > 0) + (rank < world_size - 1)   # a middle stage sends both ways
        assert r["sent"] == r["received"] == boundaries * MICROBATCHES * activation
