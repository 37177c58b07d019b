"""Loss curves like the paper's Fig. 5: NTP against PTP-l, training and validation."""

from __future__ import annotations

from rpt.result_files import write_atomic
from rpt.training.measure.metrics import read_metrics


def plot_loss_curves(metrics_path: str, out_png: str, title: str | None = None) -> str | None:
    """Write ``out_png`` from ``metrics.jsonl``; returns the path, or None when nothing to plot."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_metrics(metrics_path)
    if not rows:
        return None
    fig = loss_curves_figure(rows, title)
    try:
        write_atomic(out_png, lambda handle: fig.savefig(handle, format="png", dpi=110))
    finally:
        plt.close(fig)
    return out_png


def loss_curves_figure(rows: list[dict], title: str | None = None):
    """Training and validation panels of NTP and PTP-l losses from metrics rows."""
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    keys = sorted({k for r in rows for k in r if k == "ntp_loss" or k.startswith("ptp_loss_")})
    last_step = max(r["step"] for r in rows)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for ax, prefix, label in ((axes[0], "", "training"), (axes[1], "eval_", "validation")):
        for key in keys:
            pts = [(r["step"], r[prefix + key]) for r in rows if r.get(prefix + key) is not None and r[prefix + key] == r[prefix + key]]
            if pts:
                name = "NTP" if key == "ntp_loss" else "PTP-" + key.rsplit("_", 1)[-1]
                # a lone point (one evaluation, a run of one logged step) is a visible marker, not an empty line
                marker = "o" if len(pts) == 1 else ("." if prefix else None)
                ax.plot(*zip(*pts), marker=marker, label=name)
        ax.set_title(f"{label} loss")
        ax.set_xlabel("step")
        # Both panels span the whole run: one point at step 20 sits at 20 of 0..20, not on an axis 19..21.
        ax.set_xlim(0, last_step * 1.03 + 0.5)
        ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(nbins=8, integer=True))
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend()
    axes[0].set_ylabel("cross-entropy (nats)")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig
