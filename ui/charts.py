"""Pure builders for the app's other views: margin trace, speedup bars, counters, coloured output text."""
from __future__ import annotations

import html

import plotly.graph_objects as go

from treegraft.trace import RoundTrace

from .style import NORMAL, Style
from .tree_figure import COLORS

OUTPUT_COLORS = {"draft: small": COLORS["small"], "draft: mid": COLORS["mid"], "draft: both": COLORS["both"],
                 "bonus (target)": COLORS["accepted"]}


def margin_figure(rounds: list[RoundTrace], style: Style = NORMAL) -> go.Figure:
    """The scheduler's margin before every draft step it decided, across rounds; the mid is called where it is
    above 0. g_psi's (the learned scheduler) is read as it is; the yield gate's (step 1 of each round: tokens per
    ms with its call minus without, plus two standard errors: the bound it decides on, scheduler/online.py) is shown
    in tokens per second."""
    xs, ys, acts, hover, kinds = [], [], [], [], set()
    i = 0
    for r in rounds:
        for s in r.steps:
            i += 1
            if s.margin is None:
                continue
            gate = s.decided_by == "yield"
            kinds.add(gate)
            y = 1000 * s.margin if gate else s.margin
            xs.append(i)
            ys.append(y)
            acts.append(s.action)
            what = f"yield bound {y:+.1f} tokens/s" if gate else f"margin {y:+.4f}"
            hover.append(f"round {r.index + 1}, step {s.k}: {what} -> {s.action}")
    fig = go.Figure()
    gate_only = kinds == {True}
    if xs:
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", line={"color": "#999"},
                                 name="yield bound" if gate_only else "margin g(z)", hoverinfo="skip"))
        for act, color, name in (("mid", COLORS["mid"], "mid called"), ("small", COLORS["small"], "small step")):
            sel = [j for j, a in enumerate(acts) if a == act]
            fig.add_trace(go.Scatter(x=[xs[j] for j in sel], y=[ys[j] for j in sel], mode="markers", name=name,
                                     marker={"color": color, "size": 7}, hovertext=[hover[j] for j in sel],
                                     hoverinfo="text"))
        fig.add_hline(y=0, line={"dash": "dash", "color": "#333"}, annotation_text="threshold (call mid above)",
                      annotation_position="bottom left")
        rate = acts.count("mid") / len(acts)
        if gate_only:  # calls below 0 are the gate's first rounds and its exploration
            title = (f"Step-1 yield: tokens/s with the mid call - without,<br>upper bound (called in {rate:.0%} of "
                     "rounds)")
        else:
            title = f"Scheduler margin per draft step<br>(mid-call rate {rate:.0%})"
    else:
        title = "Scheduler margin: this method<br>has no learned scheduler"
    # the legend sits above the plot, right of the title, so the axis title below never meets it
    fig.update_layout(title={"text": title, "font": {"size": style.title}, "x": 0.01}, template="plotly_white",
                      height=style.chart_height, margin={"l": 40, "r": 10, "t": 50 + 2 * style.title, "b": 45},
                      font={"size": style.font}, xaxis_title="draft step (all rounds)",
                      legend={"orientation": "h", "x": 1, "xanchor": "right", "y": 1.0, "yanchor": "bottom",
                              "font": {"size": style.legend}})
    return fig


def ms_per_token(run: dict) -> float:
    return 1000 * run["wall_s"] / max(run["tokens"], 1)


def speedup_over_ar(runs: dict[str, dict], label: str) -> float | None:
    """AR's time per new token / the method's (None until both finished, and for a run drawn live, whose time
    shared the CPU with its frames): fair when token counts differ."""
    ar, r = runs.get("ar"), runs.get(label)
    if not (ar and r and ar.get("done") and r.get("done") and r["tokens"] and ar["tokens"]) or r.get("drawn"):
        return None
    return ms_per_token(ar) / ms_per_token(r)


def match_with_ar(runs: dict[str, dict], label: str) -> str:
    """'identical', or how many leading tokens equal AR's ('12/30'); '-' until both finished."""
    ar, r = runs.get("ar"), runs.get(label)
    if not (ar and r and ar.get("done") and r.get("done") and "new_tokens" in r and "new_tokens" in ar):
        return "-"
    a, b = ar["new_tokens"], r["new_tokens"]
    if a == b:
        return "identical"
    same = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    return f"first {same} of {len(a)}"


def speedup_figure(runs: dict[str, dict], style: Style = NORMAL) -> go.Figure:
    """Bars of speedup over AR (time per new token) for every finished run."""
    labels = [k for k in runs if k != "ar" and speedup_over_ar(runs, k) is not None]
    fig = go.Figure()
    if labels:
        vals = [speedup_over_ar(runs, k) for k in labels]
        fig.add_trace(go.Bar(x=labels, y=vals, text=[f"{v:.2f}x" for v in vals], textposition="outside",
                             marker={"color": [COLORS["mid"] if "treegraft" in k else "#888" for k in labels]}))
        fig.add_hline(y=1.0, line={"dash": "dot"}, annotation_text="AR")
    top = max([speedup_over_ar(runs, k) for k in labels] or [1.0])
    fig.update_layout(title={"text": "Speedup over AR<br>(time per token)", "font": {"size": style.title}, "x": 0.01},
                      template="plotly_white", height=style.chart_height, font={"size": style.font},
                      margin={"l": 40, "r": 10, "t": 50 + 2 * style.title, "b": 40}, yaxis_title="x",
                      yaxis={"range": [0, 1.25 * top]})
    return fig


def cost_figure(host: dict, rounds: list[RoundTrace] = (), style: Style = NORMAL) -> go.Figure:
    """This host's verification cost T(tokens) as the calibration probed it (what B_ver reads), against one plain
    decoding step and the memory floor, with each round of the run (tokens it verified, its verification time) and
    the B_ver the curve allows."""
    fig = go.Figure()
    curve = {int(k): float(v) for k, v in (host or {}).get("verify_ms", {}).items()}
    if curve:
        xs = sorted(curve)
        fig.add_trace(go.Scatter(x=xs, y=[curve[x] for x in xs], mode="lines+markers",
                                 name="T(n) probed (calibration)", line={"color": COLORS["small"]},
                                 hovertemplate="%{x} tokens: %{y:.1f} ms<extra></extra>"))
        pts = [(int(sum(r.tree.kept)), 1000 * r.verify_s) for r in rounds if r.steps]
        if pts:
            fig.add_trace(go.Scatter(x=[p[0] for p in pts], y=[p[1] for p in pts], mode="markers", name="rounds",
                                     marker={"color": "#bbb", "size": 5},
                                     hovertemplate="round: %{x} tokens verified, t_V %{y:.1f} ms<extra></extra>"))
        t1 = curve.get(1)
        if t1:
            fig.add_hline(y=t1, line={"dash": "dot", "color": "#333"}, annotation_text="one plain step",
                          annotation_position="top left")
        floor = host.get("memory_floor_ms")
        if floor:
            fig.add_hline(y=floor, line={"dash": "dash", "color": COLORS["mid"]},
                          annotation_text="memory floor (read every weight once)", annotation_position="bottom right")
        b = host.get("b_ver")
        if b:
            fig.add_vline(x=b + 1, line={"dash": "dash", "color": COLORS["accepted"]},
                          annotation_text=f"B_ver here: {b}", annotation_position="top right")
        t8 = curve.get(8)
        title = "Verification cost on this host" + (f"<br>T(8) = {t8 / t1:.2f} x T(1)" if t1 and t8 else "")
        top = max(list(curve.values()) + [p[1] for p in pts] + [floor or 0])
        fig.update_xaxes(type="log", tickvals=xs, title="tokens verified (root + tree nodes)")
        fig.update_yaxes(range=[0, 1.15 * top], title="ms")
    else:
        title = "Verification cost: not measured<br>(no adaptive budget in this run)"
    fig.update_layout(title={"text": title, "font": {"size": style.title}, "x": 0.01}, template="plotly_white",
                      height=style.chart_height, font={"size": style.font}, showlegend=False,
                      margin={"l": 45, "r": 10, "t": 50 + 2 * style.title, "b": 45})
    return fig


def counters_caption(dtype: str, order: list[str], recorded: bool = False) -> str:
    """What the counters measure, true for the running dtype, for whether methods were compared and for whether the
    one row is a recorded trace (a saved or gallery one) rather than a run drawn live here."""
    same = ("In float32 every method's greedy output is identical to AR's; the last column checks it."
            if dtype == "float32" else
            f"In {dtype or 'this dtype'} a batched (tree) forward and a one-token forward round differently, so "
            "outputs may differ from AR's; the last column shows how far each matches.")
    chosen = html.escape(order[0]) if order else "the chosen method"
    if recorded:
        return f"The time of the trace as it was recorded, wall clock on the host that ran it. {same}"
    if len(order) < 2:
        return (f"How the counter is measured: {chosen} drawn live, wall clock on this host. Drawing its frames takes "
                f"CPU time from the engine, so it reads slower than the method runs undrawn; tick \"Also run AR, "
                f"All-Small and All-Mid\" to time every method without drawing. {same}")
    return (f"How the counters are measured: one short warm-up generation first (not timed); {chosen} drawn live "
            f"(the tree: its frames take CPU time from the engine, so that run is not compared); then every method "
            f"of the table, {chosen} too, in a run of its own without drawing, in an order that rotates from run to "
            f"run, on the same engine, prompt and settings, wall clock on this host. Speedup = AR's time per new "
            f"token / the method's, so runs that stop at different lengths compare fairly. {same}")


def counters_html(runs: dict[str, dict], order: list[str], dtype: str = "") -> str:
    """A table of the side-by-side runs (rows not finished yet: 'running' or 'queued'), and its caption."""
    rows = []
    recorded = len(order) < 2 and not any(r.get("drawn") for r in runs.values())  # a loaded trace's one row
    for label in order:
        r = runs.get(label)
        if r is None:
            rows.append(f"<tr><td>{html.escape(label)}</td><td colspan=7><i>queued</i></td></tr>")
            continue
        state = ("" if r.get("done") else " <i>(running)</i>") + (" <i>(drawn live)</i>" if r.get("drawn") else "")
        sp = speedup_over_ar(runs, label)
        speed = f"{sp:.2f}x" if sp is not None else "-"
        rows.append(f"<tr><td><b>{html.escape(label)}</b>{state}</td><td id='speedup-{html.escape(label)}'>{speed}</td>"
                    f"<td>{r['tokens']}</td><td>{r['wall_s']:.2f}s</td><td>{ms_per_token(r):.1f}</td>"
                    f"<td>{r.get('mean_accepted', 0):.2f}</td><td>{r.get('rounds', 0)}</td>"
                    f"<td id='match-{html.escape(label)}'>{match_with_ar(runs, label)}</td></tr>")
    return ("<table class='tg-counters'><tr><th>method</th><th>speedup vs AR</th><th>tokens</th><th>wall</th>"
            "<th>ms/token</th><th>mean A</th><th>rounds</th><th>same as AR</th></tr>" + "".join(rows) + "</table>"
            f"<p class='tg-counters-caption'><i>{counters_caption(dtype, order, recorded)}</i></p>")


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
