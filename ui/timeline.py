"""The round timeline (pure): one bar per round, its height the tokens the round committed, stacked by who
drafted them (small, mid, both, or the target's bonus token), with the rounds that called the mid marked."""
from __future__ import annotations

import plotly.graph_objects as go

from treegraft.trace import RoundTrace

from .style import NORMAL, Style
from .tree_figure import COLORS, category

PARTS = ("small", "mid", "both", "bonus")
MAX_COUNTED = 24  # rounds up to which the number of mid steps is written over the bar
PART_NAMES = {"small": "drafted by small (n-gram)", "mid": "drafted by mid", "both": "drafted by both",
              "bonus": "bonus token (target)"}
PART_COLORS = {"small": COLORS["small"], "mid": COLORS["mid"], "both": COLORS["both"], "bonus": COLORS["accepted"]}


def round_commits(rounds: list[RoundTrace], limit: int | None = None) -> list[dict[str, int]]:
    """Per round, the committed tokens by who drafted them: accepted draft nodes by drafter, then the bonus.
    limit: the generation's new-token count (its last round may commit past max_new_tokens or an EOS; the
    output is cut there, and so is this count)."""
    out, n = [], 0
    for r in rounds:
        parts = dict.fromkeys(PARTS, 0)
        pieces = [category(r.tree, v) for v in r.accepted_path[1:]] + ["bonus"]
        for who in pieces:
            if limit is not None and n >= limit:
                break
            parts[who] += 1
            n += 1
        out.append(parts)
    return out


def timeline_figure(rounds: list[RoundTrace], limit: int | None = None, current: int | None = None,
                    style: Style = NORMAL, title: str | None = None) -> go.Figure:
    """Stacked bars per round (click one to open that round); a red triangle over the rounds that called
    the mid, with the number of mid steps; `current` (1-based) is outlined."""
    commits = round_commits(rounds, limit)
    xs = [r.index + 1 for r in rounds]
    fig = go.Figure()
    for part in PARTS:
        ys = [c[part] for c in commits]
        fig.add_trace(go.Bar(x=xs, y=ys, name=PART_NAMES[part], marker={"color": PART_COLORS[part]},
                             hovertemplate=f"round %{{x}}: %{{y}} {PART_NAMES[part]}<extra></extra>"))
    totals = [sum(c.values()) for c in commits]
    mids = [(x, tot, r.mid_calls) for x, tot, r in zip(xs, totals, rounds) if r.mid_calls]
    counts = len(rounds) <= MAX_COUNTED  # beyond that many bars the counts would run into each other
    fig.add_trace(go.Scatter(x=[m[0] for m in mids] or [None], y=[m[1] + 0.35 for m in mids] or [None],
                             mode="markers+text" if counts else "markers", name="mid called (steps)",
                             text=[str(m[2]) for m in mids], customdata=[m[2] for m in mids],
                             textposition="top center", textfont={"size": style.legend, "color": COLORS["mid"]},
                             marker={"symbol": "triangle-down", "size": 9, "color": COLORS["mid"]},
                             hovertemplate="round %{x}: the mid drafted in %{customdata} step(s)<extra></extra>"))
    if current:
        fig.add_vrect(x0=current - 0.5, x1=current + 0.5, line={"color": "#111", "width": 1.5},
                      fillcolor="rgba(0,0,0,0.05)")
    total = sum(totals)
    head = title or f"Rounds: {len(rounds)} rounds, {total} tokens committed (click a bar to open its round)"
    fig.update_layout(barmode="stack", title={"text": head, "font": {"size": style.title}, "x": 0.01},
                      template="plotly_white", height=style.chart_height, clickmode="event",
                      margin={"l": 40, "r": 10, "t": 40 + style.title, "b": 40}, font={"size": style.font},
                      legend={"orientation": "h", "y": -0.2, "font": {"size": style.legend}},
                      xaxis={"title": {"text": "round"}, "fixedrange": True},
                      yaxis={"title": {"text": "tokens"}, "fixedrange": True, "dtick": 1 if max(totals, default=1) <= 8
                             else None, "range": [0, max(totals, default=1) + 1.2]},
                      meta={"tg": {"kind": "timeline"}})
    return fig
