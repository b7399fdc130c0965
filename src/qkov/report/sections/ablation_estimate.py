"""Every ablation estimated to first order (attribution patching), beside the exact reruns."""

from __future__ import annotations

from qkov.report.markup import figure, table
from qkov.report.sections.ablation import ablation_modes
from qkov.report.svg import esc
from qkov.results import Results

ESTIMATES_SHOWN = 24  # the largest estimated ablations listed in the report (results.json has all)


def ablation_estimate_section(r: Results) -> str:
    estimate = r.ablation_estimate
    if estimate is None:
        return ""
    rows = [
        [a.head, a.mode, a.estimated, "—" if a.exact is None else a.exact]
        for a in estimate.ablations[:ESTIMATES_SHOWN]
    ]
    rho = "" if estimate.rank_correlation is None else f", Spearman's ρ {estimate.rank_correlation:.3f}"
    return figure(
        table(["head", "ablation", "estimated change", "exact change"], rows),
        f"Every ablation's change in the {esc(estimate.metric)} (clean {estimate.clean:.4f} nats), "
        f"estimated to first order by attribution patching (one forward and one backward pass for "
        f"every head: the gradient at each head's write times the ablation's change of it) on "
        f"{esc(estimate.tokens)}, {estimate.sequences} sequence(s) of period {estimate.period}; the "
        f"largest {len(rows)} of {len(estimate.ablations)} "
        f"({ablation_modes(a.mode for a in estimate.ablations)}). Exact: a rerun with the head ablated "
        f"({estimate.exact} of them{rho}); '—': estimated only.",
        "the estimate ranks the heads that matter first; where it and the rerun differ, the rerun is "
        "the number.",
    )
