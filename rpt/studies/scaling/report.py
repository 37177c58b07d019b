"""The scaling study's report: markdown tables (per size with intervals, the fits, the crossover,
the registered predictions held or failed) and one figure, each quantity against parameter count
with its fit (and the paper's 8B point where comparable)."""

from __future__ import annotations

import numpy as np

from rpt.studies.scaling import fits
from rpt.studies.scaling.measure import RULES
from rpt.studies.scaling.summary import POWER, PRIMARY_RULE, quantity_names

LABELS = {"ntp_loss": "validation NTP loss (nats)", "ptp1_loss": "validation PTP-1 loss (nats)",
          "ptp_excess": "PTP excess: head - NTP-implied (nats)", "eps0": "eps_0 (NTP)"}
for _r in RULES:
    LABELS.update({f"eps1_{_r}": f"eps_1, {_r}", f"eps_change_{_r}": f"eps_1 - eps_0, {_r}",
                   f"share_improved_{_r}": f"share with p_1 > p_0, {_r}"})


def _f(x, signed: bool = False) -> str:
    if x is None:
        return ""
    return f"{x:+.4f}" if signed else f"{x:.4f}"


def _ci(c, signed: bool = True) -> str:
    if c is None:
        return ""
    return "[" + ", ".join("" if v is None else (f"{v:+.4f}" if signed else f"{v:.4f}") for v in c) + "]"


def n_star(c: dict) -> str:
    """The crossover as ``10^x (N)``, or "none"."""
    x = c["log10_crossover"]
    if x is None:
        return "none"
    return f"N* = 10^{x:.2f}" + (f" ({10.0 ** x:.3g} parameters)" if x < 300 else "")


def crossover_text(c: dict) -> str:
    lo, hi = c["log10_crossover_ci95"]
    est = n_star(c)
    bounds = f"10^{lo:.2f}" if lo is not None else "no lower bound"
    bounds += " .. " + (f"10^{hi:.2f}" if hi is not None else "no crossover (unbounded)")
    return (f"{est} ({c['where']}); 95% bootstrap interval over seeds and positions: {bounds}; "
            f"{c['share_no_crossover']:.0%} of the replicates have no crossover")


def one_line(summary: dict) -> str:
    """The study in one line (the demo's report and the README): the primary crossover and the
    registered checks."""
    c = summary["crossover"][PRIMARY_RULE]
    failed = [k for k, p in summary["predictions"].items() if not p["held"]]
    sizes = summary["parameters"]
    return (f"{'Official' if summary.get('official') else 'Development'} scaling study on code "
            f"({len(sizes)} sizes, {sizes[0]:,} to {sizes[-1]:,} parameters, seeds {summary['seeds']}): "
            f"eps_1 - eps_0 ({PRIMARY_RULE}) at the largest size "
            f"{summary['quantities'][f'eps_change_{PRIMARY_RULE}']['sizes'][-1]['mean']:+.4f}, PTP excess "
            f"{summary['quantities']['ptp_excess']['sizes'][-1]['mean']:+.3f} nats; crossover {crossover_text(c)}; "
            f"registered checks failed: {', '.join(failed) or 'none'}")


def tables(summary: dict) -> list[tuple[list[str], list[list]]]:
    params = summary["parameters"]
    q = summary["quantities"]
    per_size = []
    for name in quantity_names():
        signed = name.startswith(("eps_change", "ptp_excess"))
        for s in q[name]["sizes"]:
            per_size.append([LABELS[name], f"{s['parameters']:,}", _f(s["mean"], signed),
                             ", ".join(_f(x, signed) for x in s["per_seed"]), _ci(s["ci95"], signed),
                             _ci(s["ci95_seeds"], signed)])
    fit_rows = []
    for name in quantity_names():
        lin = q[name]["log_linear"]
        power = q[name].get("power_offset")
        text = (f"{power['c']:.4f} + {power['k']:.4g} N^-{power['alpha']:.3f}" if power else "")
        fit_rows.append([LABELS[name], q[name]["form"], f"{lin['a']:+.4f} {lin['b']:+.4f} log10 N",
                         _ci(lin["b_ci95"]), text])
    cross = [[r + (" (registered primary)" if r == PRIMARY_RULE else ""), crossover_text(c)]
             for r, c in summary["crossover"].items()]
    preds = []
    for key, p in summary["predictions"].items():
        if "registered_log10" in p:
            lo, hi = p["registered_log10"]
            est = (f"registered [{'-inf' if lo is None else lo}, {'+inf' if hi is None else hi}]; measured "
                   + ("none" if p["log10_crossover"] is None else f"10^{p['log10_crossover']:.2f}"))
        elif "slope" in p:
            est = f"slope {p['slope']:+.4f} per decade, 95% CI {_ci(p['slope_ci95'])}"
        elif "difference_ci95" in p:
            est = (f"observed {p['observed']:+.4f}, predicted {p['predicted']:+.4f}; observed - predicted "
                   f"{p['observed_minus_predicted']:+.4f}, 95% CI {_ci(p['difference_ci95'])}")
        else:
            est = f"observed {p['observed']:.4f} 95% CI {_ci(p['observed_ci95'], False)}, predicted {p['predicted']:.4f}"
        preds.append([key, p["what"], "**held**" if p["held"] else "**failed**", est])
    models = [[m["name"], f"{m['parameters']:,}", f"{m['training_tokens']:,}", m["batch"], "+".join(map(str, m["steps"])),
               _f(m["ntp_loss"]), _f(m["ptp1_loss"]), _f(m["ptp_excess"], True),
               *(_f(m["eps_change"][r], True) for r in RULES)] for m in summary["models"]]
    del params
    return [(["prediction", "what", "outcome", "estimate"], preds),
            (["PTP rule", "crossover (eps_1 - eps_0 turns negative), log-linear in log10 N"], cross),
            (["quantity", "parameters", "mean", "per seed", "95% CI (seeds x positions)", "95% CI (seeds, t)"], per_size),
            (["quantity", "registered form", "log-linear fit", "slope 95% CI", "power law with offset"], fit_rows),
            (["model", "parameters", "training tokens", "batch", "steps", "NTP", "PTP-1", "PTP excess",
              *(f"eps change {r}" for r in RULES)], models)]


def notes(summary: dict) -> str:
    reg = summary.get("registration")
    code = summary.get("code") or {}
    head = ("Official run of the pre-registered protocol (docs/scaling_preregistration.md; registration commits "
            + ", ".join(f"{p} {r['commit'][:10]}" for p, r in reg.items()) + "). " if reg else
            "Development run (not the official seeds): not a result. ")
    held = [k for k, p in summary["predictions"].items() if p["held"]]
    failed = [k for k, p in summary["predictions"].items() if not p["held"]]
    c = summary["crossover"][PRIMARY_RULE]
    return (head + f"Code at {str(code.get('commit'))[:10]}{' (with uncommitted changes)' if code.get('uncommitted_changes') else ''}. "
            f"Seeds {summary['seeds']}; sizes {', '.join(f'{n:,}' for n in summary['parameters'])} parameters. "
            f"Primary crossover ({PRIMARY_RULE}): {crossover_text(c)}. Held: {', '.join(held) or 'none'}; "
            f"failed: {', '.join(failed) or 'none'}. Intervals: percentile bootstrap over seeds and positions "
            f"(validation batches for the losses); Student's t over the seeds beside it. The paper's 8B point: "
            f"{summary['paper_8b']['source']}.")


def plot(summary: dict):
    from matplotlib.figure import Figure

    q = summary["quantities"]
    panels = [["ntp_loss", "ptp1_loss"], ["ptp_excess"], ["eps0", *(f"eps1_{r}" for r in RULES)],
              [f"eps_change_{r}" for r in RULES], [f"share_improved_{r}" for r in RULES]]
    fig = Figure(figsize=(16, 9))
    axes = fig.subplots(2, 3).ravel()
    n = np.asarray(summary["parameters"], dtype=np.float64)
    paper = summary["paper_8b"]
    grid = np.logspace(np.log10(n.min()) - 0.2, np.log10(max(n.max(), paper["parameters"])) + 0.2, 200)
    colors = ["tab:blue", "tab:orange", "tab:green", "tab:red"]
    for ax, names in zip(axes, panels):
        for color, name in zip(colors, names):
            sizes = q[name]["sizes"]
            mean = np.array([s["mean"] for s in sizes])
            lo = np.array([s["ci95"][0] for s in sizes])
            hi = np.array([s["ci95"][1] for s in sizes])
            ax.errorbar(n, mean, yerr=[mean - lo, hi - mean], fmt="o", color=color, capsize=3, label=LABELS[name])
            for s in sizes:
                ax.plot([s["parameters"]] * len(s["per_seed"]), s["per_seed"], "x", color=color, alpha=0.5)
            power = q[name].get("power_offset")
            if q[name]["form"] == POWER and power is not None:
                ax.plot(grid, fits.power_offset_value(power, grid), "-", color=color, alpha=0.7)
            else:
                lin = q[name]["log_linear"]
                ax.plot(grid, lin["a"] + lin["b"] * np.log10(grid), "-", color=color, alpha=0.7)
            key = name if name in paper else None
            if key is not None:
                ax.plot([paper["parameters"]], [paper[key]], "*", color=color, markersize=12,
                        label=f"paper 8B ({'Fig. 6, DCLM' if name.startswith('share') else 'Table 2, github'})")
        if names[0].startswith("eps_change") or names[0] == "ptp_excess":
            ax.axhline(0.0, color="black", linestyle="--", linewidth=1)
        if names[0].startswith("share"):
            ax.axhline(0.5, color="black", linestyle=":", linewidth=1)
        ax.set_xscale("log")
        ax.set_xlabel("parameters N")
        ax.legend(fontsize=7)
    c = summary["crossover"][PRIMARY_RULE]
    axes[3].set_title(f"crossover ({PRIMARY_RULE}): {n_star(c)}", fontsize=9)
    axes[5].axis("off")
    axes[5].text(0.0, 1.0, "\n".join(f"{k}: {'held' if p['held'] else 'FAILED'}" for k, p in summary["predictions"].items()),
                 va="top", fontsize=8, family="monospace")
    fig.suptitle("Scaling study on code: quantities vs parameters (points: size means with 95% bootstrap "
                 "intervals; x: seeds; lines: fits; stars: the paper's 8B)", fontsize=10)
    fig.tight_layout()
    return fig
