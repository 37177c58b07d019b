"""Plots read at every run length: a lone point is a visible marker on an axis that spans the run,
and no two tick labels overlap (checked on the rendered text boxes)."""

import itertools

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: E402

from rpt.studies.error_analysis.analysis import plot_histogram  # noqa: E402
from rpt.training.measure.plotting import loss_curves_figure  # noqa: E402


def overlapping_tick_labels(fig) -> list[tuple[str, str]]:
    canvas = FigureCanvasAgg(fig)  # a bare Figure has no renderer of its own
    canvas.draw()
    renderer = canvas.get_renderer()
    bad = []
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            lo, hi = sorted(axis.get_view_interval())
            labels = [t for tick, t in zip(axis.get_major_ticks(), axis.get_ticklabels())
                      if t.get_visible() and t.get_text() and lo - 1e-12 <= tick.get_loc() <= hi + 1e-12]
            boxes = [(t.get_text(), t.get_window_extent(renderer)) for t in labels]
            bad += [(a, b) for (a, ba), (b, bb) in itertools.combinations(boxes, 2) if ba.overlaps(bb)]
    return bad


def rows_for(steps: int, log_every: int, eval_every: int) -> list[dict]:
    rows = []
    for s in range(1, steps + 1):
        row = {}
        if s % log_every == 0 or s == steps:
            row.update(loss=5 - s / steps, ntp_loss=5 - s / steps, ptp_loss_1=5.2 - s / steps)
        if s % eval_every == 0 or s == steps:
            row.update(eval_ntp_loss=4.9 - s / steps, eval_ptp_loss_1=5.1 - s / steps)
        if row:
            rows.append({"step": s, **row})
    return rows


@pytest.mark.parametrize("steps, log_every, eval_every", [(1, 10, 100), (20, 10, 100), (20, 1, 100), (400, 10, 100),
                                                          (100_000, 1000, 5000)])
def test_loss_curves_span_the_run_and_show_lone_points(steps, log_every, eval_every):
    fig = loss_curves_figure(rows_for(steps, log_every, eval_every), "rpt w=2")
    for ax in fig.axes:
        lo, hi = ax.get_xlim()
        assert lo <= 0 and steps <= hi <= steps * 1.1 + 1  # the whole run, not 19..21 around a lone point
        for line in ax.lines:
            if len(line.get_xdata()) == 1:
                assert line.get_marker() not in (None, "None", "", " ")  # a lone point is drawn
    assert not overlapping_tick_labels(fig)
    plt.close(fig)


@pytest.mark.parametrize("lo, hi, n", [(-0.033, 0.033, 2000), (-1.0, 1.0, 100), (-0.0004, 0.0009, 10**6), (0.0, 0.5, 3)])
def test_error_analysis_histogram_tick_labels_do_not_overlap(lo, hi, n):
    bins = 41
    edges = [lo + (hi - lo) * i / bins for i in range(bins + 1)]
    counts = [n // (1 + abs(i - bins // 2)) for i in range(bins)]
    summary = {"histogram": {"bin_edges": edges, "counts": counts}, "frac_improved": 0.128,
               "frac_improved_ci": [0.113, 0.142], "n_positions": n}
    title = "RPT (k = 1, greedy PTP, confidence 0.9) minus NTP, top-m (m = 16 of V = 4096; unexplored pairs keep x_i)"
    fig = plot_histogram(summary, title)
    assert not overlapping_tick_labels(fig)
    assert all(len(line) <= 70 for line in fig.axes[0].get_title().splitlines()[:-1])
