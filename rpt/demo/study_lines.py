"""The report's line on the pre-registered agreement study, which the demo does not rerun: read from
its committed results (``docs/agreement.json``), the gap decomposed into RPT sampling and RPT training
(:mod:`rpt.studies.agreement.decomposition`)."""

from __future__ import annotations

import json
from pathlib import Path

from rpt.studies.agreement.decomposition import decompose

AGREEMENT_RESULTS = Path(__file__).resolve().parents[2] / "docs" / "agreement.json"


def agreement_tradeoff(path: Path = AGREEMENT_RESULTS) -> dict | None:
    """``{"line", "results"}``: the study's trade-off in one line, every number from ``path``; None
    where the results are not there (a copy of the package without the docs)."""
    if not path.is_file():
        return None
    summary = json.loads(path.read_text(encoding="utf-8"))
    d = summary.get("decomposition") or decompose(summary["models"], summary["seeds"])
    tag, pooled, content = (d["rpt_q0.3"][w] for w in ("tag_first", "pooled", "content_first"))
    p2 = summary["predictions"]["P2"]
    ci = tag["training"]["ci95_seeds"]
    line = (f"On tag-first windows RPT (q = 0.3) TV1 {p2['rpt_tv1']:.4f} vs pure-NTP TV0 {p2['ntp_tv0']:.4f}: "
            f"{tag['gap']['mean']:+.4f} = RPT sampling {tag['sampling']['mean']:+.4f} (negative in "
            f"{tag['sampling']['negative_seeds']} of {len(tag['sampling']['per_seed'])} seeds) + RPT training "
            f"{tag['training']['mean']:+.4f} (seed interval [{ci[0]:+.4f}, {ci[1]:+.4f}]); pooled over window types "
            f"{pooled['training_share']:.0%} of the gain is training, and sampling {'costs' if content['sampling']['mean'] > 0 else 'gains'} "
            f"{content['sampling']['mean']:+.4f} on content-first windows.")
    return {"line": line, "results": "docs/agreement.md"}
