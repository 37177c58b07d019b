"""Loss curves like the paper's Fig. 5: NTP against PTP-l, training and validation."""

from __future__ import annotations

import os

from rpt.metrics import read_metrics


def plot_loss_curves(metrics_path: str, out_png: str, title: str | None = None) -> str | None:
    """Write ``out_png`` from ``metrics.jsonl``; returns the path, or None when nothing to plot."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_metrics(metrics_path)
    if not rows:
        return None
    keys = sorted({k for r in rows for k in r if k == "ntp_loss" or k.startswith("ptp_loss_")})
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for ax, prefix, label in ((axes[0], "", "training"), (axes[1], "eval_", "validation")):
        for key in keys:
            pts = [(r["step"], r[prefix + key]) for r in rows if r.get(prefix + key) is not None and r[prefix + key] == r[prefix + key]]
            if pts:
                name = "NTP" if key == "ntp_loss" else "PTP-" + key.rsplit("_", 1)[-1]
                ax.plot(*zip(*pts), marker="." if prefix else None, label=name)
        ax.set_title(f"{label} loss")
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        ax.legend()
    axes[0].set_ylabel("cross-entropy (nats)")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    os.makedirs(os.path.dirname(out_png) or ".", exist_ok=True)
    tmp = out_png + ".tmp.png"
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    os.replace(tmp, out_png)
    return out_png
