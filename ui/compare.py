"""The compare view's counters (pure): two traces' headline numbers in one table, side by side."""
from __future__ import annotations

import html

from treegraft.trace import GenerationResult

from .timeline import round_commits

ROWS = (("method", "method"), ("tokens", "new tokens"), ("rounds", "rounds"), ("tpr", "tokens per round"),
        ("mean_a", "mean A (accepted drafts per round)"),
        ("mid_tok", "tokens drafted by the mid (alone or with small)"),
        ("mid_calls", "mid calls"), ("drafted", "drafted nodes per round"), ("verified", "verified nodes per round"),
        ("ms", "ms per token (as recorded)"))


def trace_counters(res: GenerationResult) -> dict[str, str]:
    rounds = res.rounds
    n, k = len(res.new_tokens), max(len(rounds), 1)
    commits = round_commits(rounds, n)
    return {"method": res.method, "tokens": str(n), "rounds": str(len(rounds)), "tpr": f"{n / k:.2f}",
            "mean_a": f"{sum(r.accepted for r in rounds) / k:.2f}",
            "mid_tok": str(sum(c["mid"] + c["both"] for c in commits)),
            "mid_calls": str(sum(r.mid_calls for r in rounds)),
            "drafted": f"{sum(r.tree.size - 1 for r in rounds) / k:.1f}",
            "verified": f"{sum(sum(r.tree.kept) - 1 for r in rounds) / k:.1f}",
            "ms": f"{1000 * res.wall_s / max(n, 1):.1f}"}


def compare_html(a: GenerationResult | None, b: GenerationResult | None, names: tuple[str, str]) -> str:
    """A table with one column per trace (a missing trace shows dashes)."""
    ca, cb = (trace_counters(x) if x else {} for x in (a, b))
    head = "".join(f"<th>{html.escape(n)}</th>" for n in names)
    rows = "".join(f"<tr><td>{label}</td><td>{html.escape(ca.get(key, '-'))}</td>"
                   f"<td>{html.escape(cb.get(key, '-'))}</td></tr>" for key, label in ROWS)
    return f"<table class='tg-counters' id='compare-table'><tr><th></th>{head}</tr>{rows}</table>"
