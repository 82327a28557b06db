"""The course's TP inference bill (commtax.formulas.tp, behind Lesson 05) against the simulator and Lab 06's reference."""

import pytest

from commtax.formulas import tp
from commtax.labs import LABS_DIR, load_lab
from commtax.simulation import messages as simulate


def test_allreduce_time_is_the_simulated_ring():
    for n in (2, 4, 8):
        sim = simulate.simulate_allreduce("ring", 8192, n, 3e-6, 450e9, numel=4 * n)
        assert tp.allreduce_time_s(8192, n, 3e-6, 450e9) == pytest.approx(sim.time)


def test_forward_time_is_memory_bound_for_decode_and_compute_bound_for_prefill():
    weights = 8e9 * 2 / 2 / tp.H100_HBM_BYTES_PER_S
    assert tp.forward_time_s(8e9, 1, 2) == pytest.approx(weights)
    assert tp.forward_time_s(8e9, 4096, 2) == pytest.approx(2 * 8e9 * 4096 / 2 / (989e12 * 0.5))
    with pytest.raises(ValueError, match="mfu"):
        tp.forward_time_s(8e9, 1, 2, mfu=0)


@pytest.mark.skipif(
    not (LABS_DIR / "lab-06-tp-comm-cost" / "solution.py").exists(), reason="the student release has no lab solutions"
)
def test_course_formulas_agree_with_the_lab_06_reference():
    lab = load_lab("lab-06-tp-comm-cost", "solution")
    for tokens in (1, 64, 2048):
        payload = tp.allreduce_payload_bytes(tokens, 4096)
        assert payload == lab.allreduce_payload_bytes(tokens, 4096)
        for n in (2, 8):
            assert tp.tp_comm_time_per_step(32, payload, n, 5e-6, 50e9) == pytest.approx(
                lab.tp_comm_time_per_step(32, payload, n, 5e-6, 50e9)
            )
    assert tp.comm_fraction(1.0, 3.0) == lab.comm_fraction(1.0, 3.0) == 0.25
