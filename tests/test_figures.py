"""The lessons' larger figures (commtax.ui.figures): drawn from the formulas, refusing bad input."""

import pytest

from commtax.formulas import collectives as C
from commtax.formulas.links import PRESETS as LINKS
from commtax.ui import figures

NVLINK, IB = LINKS["NVLink 4 (H100 SXM)"], LINKS["InfiniBand NDR (400 Gb/s per GPU)"]


def test_the_hierarchy_figure_plots_the_formulas_ratio_and_both_limits():
    fig = figures.hierarchical_speedup_figure(NVLINK, IB, gpus_per_node=8)
    ax = fig.axes[0]
    one_gb = next(line for line in ax.lines if line.get_label() == "n = 1 GB")
    links = (NVLINK.alpha, NVLINK.bandwidth, IB.alpha, IB.bandwidth)
    x, y = one_gb.get_data()
    expected = C.flat_ring_two_level_time(1e9, int(x[0]), 8, *links) / C.hierarchical_allreduce_time(
        1e9, int(x[0]), 8, *links
    )
    assert y[0] == pytest.approx(expected)
    limits = sorted(line.get_ydata()[0] for line in ax.lines if "limit" in line.get_label())
    assert limits == pytest.approx([1 / (IB.bandwidth / NVLINK.bandwidth + 1 / 8), 8])


def test_the_mfu_figure_has_three_placements_on_top_and_the_tp_sweep_below():
    fig = figures.mfu_knobs_figure(
        989e12, 0.4, LINKS["NVLink 4 ring, measured (H100 SXM)"], LINKS["InfiniBand NDR, measured (400 Gb/s per GPU)"]
    )
    top, bottom = fig.axes
    assert len([line for line in top.lines if line.get_label().startswith(("DP", "pure"))]) == 3
    mfus = bottom.lines[0].get_ydata()
    assert all(0 < m <= 0.4 for m in mfus) and mfus[-1] < mfus[3]  # TP past the node costs MFU


@pytest.mark.parametrize(
    "call,argument",
    [
        (lambda: figures.hierarchical_speedup_figure(NVLINK, IB, gpus_per_node=1), "gpus_per_node"),
        (lambda: figures.mfu_knobs_figure(989e12, 1.5, NVLINK, IB), "mfu"),
    ],
)
def test_bad_input_names_the_argument(call, argument):
    with pytest.raises(ValueError, match=argument):
        call()
