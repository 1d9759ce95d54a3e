"""The console summary of a bench run: per category and method what upstream's benchmark prints.

Upstream (z-lab/dflash `benchmark.py`) ends a run with the baseline's and the method's throughput
(1 / mean TPOT), the decoding speedup (mean AR TPOT / mean method TPOT), the average acceptance
length and the acceptance-length histogram. This prints the same figures for every method and
category of a run, from its results dict, and the run folder they came from.
"""
from __future__ import annotations

import math
from typing import Any

__all__ = ["summary_text"]


def _num(x: Any, spec: str) -> str:
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def _histogram(hist: dict[str, int]) -> str:
    """`1: 12.0%, 2: 8.0%, ...`: share of rounds per tau value, as upstream prints it."""
    total = sum(hist.values())
    if not total:
        return "—"
    return ", ".join(f"{k}: {100 * v / total:.1f}%" for k, v in sorted(hist.items(), key=lambda kv: int(kv[0])))


def summary_text(results: dict[str, Any], run: str | None = None) -> str:
    """Lines per category (then "all") and method: speedup, tau, AR and method throughput and the per-sample
    median ratio; each speculative method's tau histogram over all samples; the best setting of swept methods;
    the run folder last."""
    lines = []
    for cat, per in results["cells"].items():
        ar = per.get("ar")
        ar_tps = 1000 / ar["tpot_ms"] if ar and ar.get("tpot_ms") else None
        lines.append(f"[{cat}] AR throughput {_num(ar_tps, '.2f')} tok/s"
                     + (f" ({ar['n']} samples)" if ar else ""))
        for method, fig in per.items():
            if method == "ar":
                continue
            tps = 1000 / fig["tpot_ms"] if fig.get("tpot_ms") else None
            lines.append(f"[{cat}] {method}: speedup {_num(fig['speedup'], '.2f')}x "
                         f"({_num(fig['speedup_ci_low'], '.2f')}-{_num(fig['speedup_ci_high'], '.2f')}), "
                         f"tau {_num(fig['tau'], '.2f')}, throughput {_num(tps, '.2f')} tok/s, "
                         f"median ratio {_num(fig.get('speedup_median_ratio'), '.2f')}x")
            if cat == "all":
                lines.append(f"[{cat}] {method}: tau histogram {_histogram(fig.get('tau_histogram') or {})}")
    for family, per in ((results.get("best") or {}).get("categories") or {}).items():
        best = ", ".join(f"{group} {b['method']} ({_num(b['speedup'], '.2f')}x)" for group, b in per.items())
        lines.append(f"best {family}: {best}")
    lines.append("Speedup = mean AR TPOT / mean method TPOT over the same samples; tau = mean over samples of "
                 "each sample's mean tau (accepted drafts + 1).")
    if results.get("mismatches"):
        lines.append(f"Lossless check: {len(results['mismatches'])} mismatch(es), see results.json")
    if run:
        lines.append(f"Results: {run}")
    return "\n".join(lines)
