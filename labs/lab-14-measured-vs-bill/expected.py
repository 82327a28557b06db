"""Lab 14's expected values from the course's own tools (course repository only).

The tests ask ``EXPECTED(name, *inputs)`` (``commtax.recorded``): here it runs ``RECIPES[name]`` on
``commtax.trace`` (the trace report) and ``commtax.calibrate``'s fit of nccl-tests logs; the student
release gets ``expected.json`` instead, these recipes run by ``python -m grading release`` on exactly
the inputs ``cases()`` lists, which are the visible tests' inputs.
"""

from pathlib import Path

from commtax.measured import nccl_tests
from commtax.recorded import lab_test_data
from commtax.trace import analyze

HERE = Path(__file__).resolve().parent


def trace_busy_times(name):
    """``python3 -m commtax.trace``'s compute_s, comm_s and exposed_comm_s of one recorded trace."""
    row = analyze([str(HERE / "data" / "traces" / name)])[0]["ranks"][0]
    return {key: row[key] for key in ("compute_s", "comm_s", "exposed_comm_s")}


def calibration(name, ranks, collective, min_size):
    """``python3 -m commtax.calibrate nccl-tests``'s fit of one log: [alpha_s, bandwidth_Bps]."""
    log = nccl_tests.parse_log(HERE / "data" / "nccl-tests" / name, ranks=ranks, collective=collective)
    return list(nccl_tests.fit_link(log, min_size))


RECIPES = {"trace_busy_times": trace_busy_times, "calibration": calibration}


def cases():
    """Every (recipe, inputs) the visible tests ask for."""
    t = lab_test_data(HERE)
    for name in t.TRACES:
        yield "trace_busy_times", (name,)
    for name, ranks, collective, _op, min_size in t.LOGS:
        yield "calibration", (name, ranks, collective, min_size)
