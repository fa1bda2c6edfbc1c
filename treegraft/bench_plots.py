"""Benchmark plots (interactive HTML always; PNG through kaleido, which drives the system's Chromium)."""
from __future__ import annotations

from pathlib import Path

import plotly.graph_objects as go


def speedup_by_category(summary: dict) -> go.Figure:
    fig = go.Figure()
    cats = sorted({c for m in summary["per_category"].values() for c in m})
    for method, by_cat in summary["per_category"].items():
        if method == "ar":
            continue
        fig.add_trace(go.Bar(name=method, x=cats, y=[by_cat.get(c, {}).get("speedup") for c in cats]))
    fig.add_hline(y=1.0, line={"dash": "dot"}, annotation_text="AR")
    fig.update_layout(title="Speedup over AR per category", barmode="group", yaxis_title="x", template="plotly_white")
    return fig


def accepted_by_method(summary: dict) -> go.Figure:
    methods = [m for m in summary["overall"] if m != "ar" and summary["overall"][m]["all"]["mean_accepted"] is not None]
    vals = [summary["overall"][m]["all"]["mean_accepted"] for m in methods]  # the HF peers report no A
    fig = go.Figure(go.Bar(x=methods, y=vals, text=[f"{v:.2f}" for v in vals], textposition="outside"))
    fig.update_layout(title="Mean accepted draft tokens per round (A)", yaxis_title="A", template="plotly_white")
    return fig


def cost_breakdown(summary: dict) -> go.Figure:
    methods = [m for m in summary["overall"] if summary["overall"][m]["all"]["draft_ms_per_round"] is not None]
    parts = {"draft": "draft_ms_per_round", "verify": "verify_ms_per_round", "engine + other": "other_ms_per_round"}
    fig = go.Figure()
    for name, key in parts.items():
        fig.add_trace(go.Bar(name=name, x=methods, y=[summary["overall"][m]["all"][key] for m in methods]))
    fig.update_layout(title="Cost per round (ms)", barmode="stack", yaxis_title="ms", template="plotly_white")
    return fig


def write_plots(out: Path, summary: dict, png: bool = True) -> list[str]:
    """Writes NAME.html (and NAME.png where kaleido can start a browser, unless png is False); returns the PNG
    names written."""
    pngs = []
    for name, fig in (("speedup", speedup_by_category(summary)), ("accepted", accepted_by_method(summary)),
                      ("cost", cost_breakdown(summary))):
        fig.write_html(str(out / f"{name}.html"), include_plotlyjs=True)
        if not png:
            continue
        try:
            fig.write_image(str(out / f"{name}.png"), width=900, height=450)
            pngs.append(f"{name}.png")
        except Exception as err:  # no Chromium here: the HTML plots are still written
            print(f"PNG export skipped ({type(err).__name__}: {err}); the HTML plots are written")
    return pngs
