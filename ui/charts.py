"""Pure builders for the app's other views: margin trace, speedup bars, counters, coloured output text."""
from __future__ import annotations

import html

import plotly.graph_objects as go

from treegraft.trace import RoundTrace

from .tree_figure import COLORS

OUTPUT_COLORS = {"draft: small": COLORS["small"], "draft: mid": COLORS["mid"], "draft: both": COLORS["both"],
                 "bonus (target)": COLORS["accepted"]}


def margin_figure(rounds: list[RoundTrace]) -> go.Figure:
    """g_psi's margin before every draft step across rounds; the mid is called where it is above 0."""
    xs, ys, acts, hover = [], [], [], []
    i = 0
    for r in rounds:
        for s in r.steps:
            i += 1
            if s.margin is None:
                continue
            xs.append(i)
            ys.append(s.margin)
            acts.append(s.action)
            hover.append(f"round {r.index + 1}, step {s.k}: margin {s.margin:+.4f} -> {s.action}")
    fig = go.Figure()
    if xs:
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", line={"color": "#999"}, name="margin g(z)",
                                 hoverinfo="skip"))
        for act, color, name in (("mid", COLORS["mid"], "mid called"), ("small", COLORS["small"], "small step")):
            sel = [j for j, a in enumerate(acts) if a == act]
            fig.add_trace(go.Scatter(x=[xs[j] for j in sel], y=[ys[j] for j in sel], mode="markers", name=name,
                                     marker={"color": color, "size": 7}, hovertext=[hover[j] for j in sel],
                                     hoverinfo="text"))
        fig.add_hline(y=0, line={"dash": "dash", "color": "#333"}, annotation_text="threshold (call mid above)")
        rate = acts.count("mid") / len(acts)
        title = f"Scheduler margin per draft step (mid-call rate {rate:.0%})"
    else:
        title = "Scheduler margin: this method has no learned scheduler (see method)"
    fig.update_layout(title=title, template="plotly_white", height=260, margin={"l": 10, "r": 10, "t": 40, "b": 10},
                      xaxis_title="draft step (all rounds)", legend={"orientation": "h"})
    return fig


def speedup_figure(runs: dict[str, dict]) -> go.Figure:
    """Bars of speedup over AR for every finished run: runs[label] = {"wall_s", "tokens", ...}."""
    ar = runs.get("ar")
    labels = [k for k in runs if k != "ar"]
    fig = go.Figure()
    if ar and labels:
        vals = [ar["wall_s"] / runs[k]["wall_s"] for k in labels]
        fig.add_trace(go.Bar(x=labels, y=vals, text=[f"{v:.2f}x" for v in vals], textposition="outside",
                             marker={"color": [COLORS["mid"] if "treegraft" in k else "#888" for k in labels]}))
        fig.add_hline(y=1.0, line={"dash": "dot"}, annotation_text="AR")
    fig.update_layout(title="Speedup over AR (same prompt, same tokens, wall clock)", template="plotly_white",
                      height=260, margin={"l": 10, "r": 10, "t": 40, "b": 10}, yaxis_title="x")
    return fig


def counters_html(runs: dict[str, dict], order: list[str]) -> str:
    """A table of the side-by-side runs; rows not finished yet show 'running' or 'queued'."""
    ar = runs.get("ar")
    rows = []
    for label in order:
        r = runs.get(label)
        if r is None:
            rows.append(f"<tr><td>{html.escape(label)}</td><td colspan=6><i>queued</i></td></tr>")
            continue
        state = "" if r.get("done") else " <i>(running)</i>"
        speed = f"{ar['wall_s'] / r['wall_s']:.2f}x" if ar and ar.get("done") and r.get("done") else "-"
        rows.append(f"<tr><td><b>{html.escape(label)}</b>{state}</td><td id='speedup-{html.escape(label)}'>{speed}</td>"
                    f"<td>{r['tokens']}</td><td>{r['wall_s']:.2f}s</td><td>{r['tokens'] / max(r['wall_s'], 1e-9):.1f}</td>"
                    f"<td>{r.get('mean_accepted', 0):.2f}</td><td>{r.get('rounds', 0)}</td></tr>")
    return ("<table class='tg-counters'><tr><th>method</th><th>speedup vs AR</th><th>tokens</th><th>wall</th>"
            "<th>tokens/s</th><th>mean A</th><th>rounds</th></tr>" + "".join(rows) + "</table>")


def output_segments(rounds: list[RoundTrace], token_strings: dict[int, str], limit: int | None = None):
    """[(text, label)] for gr.HighlightedText: accepted draft tokens by drafter, bonus tokens from the target."""
    segs = []
    n = 0
    for r in rounds:
        t = r.tree
        pieces = [(v, None) for v in r.accepted_path[1:]] + [(None, r.bonus_token)]
        for v, bonus in pieces:
            if limit is not None and n >= limit:
                return segs
            if v is None:
                segs.append((token_strings.get(bonus, ""), "bonus (target)"))
            else:
                both = t.confirmed[v] == 3
                who = "both" if both else ("mid" if t.drafter[v] == 1 else "small")
                segs.append((token_strings.get(t.token[v], ""), f"draft: {who}"))
            n += 1
    return segs
