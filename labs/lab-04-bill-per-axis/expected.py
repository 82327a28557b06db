"""Lab 04's expected values from the course's bill (``commtax.formulas.bill``; course repository only).

The tests ask ``EXPECTED(name, *inputs)`` (``commtax.recorded``): here it runs
``RECIPES[name]``; the student release gets ``expected.json`` instead, these
recipes run by ``python -m grading release`` on exactly the inputs
``cases()`` lists, which are the visible tests' inputs.
"""

from pathlib import Path

from commtax.formulas import bill
from commtax.formulas.links import Link
from commtax.recorded import lab_test_data

HERE = Path(__file__).parent
ATTRIBUTES = ("link", "bytes", "t_comm", "window", "exposed", "tax")


def step_report(fields):
    """The course's step report of the plan test_lab.py's ``plan(lab, **fields)`` describes, as plain data."""
    t = lab_test_data(HERE)
    full = dict(
        n_params=12 * 32 * 4096**2,
        layers=32,
        hidden=4096,
        seq_len=4096,
        micro_batch=1,
        microbatches=1,
        gpus=8,
        peak_flops=t.PEAK,
        mfu=t.MFU,
    )
    full.update(fields)
    intra = Link("intra", full.pop("intra_alpha", 3e-6), full.pop("intra_bandwidth", t.NVLINK))
    inter = Link("inter", full.pop("inter_alpha", 5e-6), full.pop("inter_bandwidth", t.IB))
    report = bill.step_report(bill.Plan(**full, intra=intra, inter=inter))
    return dict(
        axes={name: {a: getattr(axis, a) for a in ATTRIBUTES} for name, axis in report.axes.items()},
        t_compute=report.t_compute,
        t_step=report.t_step,
        mfu=report.mfu,
        binding=report.binding,
    )


RECIPES = {"step_report": step_report, "good_call": lambda function, kwargs: getattr(bill, function)(**kwargs)}


def cases():
    """Every (recipe, inputs) the visible tests ask for."""
    t = lab_test_data(HERE)
    for fields in [*t.GRID, {}]:
        yield "step_report", (fields,)
    for function, kwargs in t.GOOD.items():
        yield "good_call", (function, kwargs)
