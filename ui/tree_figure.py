"""RoundTrace -> Plotly figure of the shared draft tree, with the round's animation frames (pure).

Layout and labels: ui/tree_layout.py (layered, no overlapping labels). Frames: ui/animation.py; every
frame redraws the same traces (TRACES, in this order), so Plotly can step between them; the figure's
own data is the last frame (the verified round).

Encodings (each one a legend entry):
  fill colour   which drafter created the node: small (n-gram), mid, or both (proposed by each)
  hollow        pruned: drafted but not sent to verification (beyond B_ver)
  cross         overwritten: deleted by the w/o-ND ablation
  red diamond   graft site: a node a mid step chose as frontier
  orange ring   the pool of the step being shown; green square: its frontier; thick outline: its new nodes
  gold ring     accepted path; the gold star after it is the bonus token
  black ring    the path to the node last clicked
"""
from __future__ import annotations

import math

import plotly.graph_objects as go

from treegraft.trace import RoundTrace

from .animation import Frame, round_frames
from .style import NORMAL, Style, wrap
from .tree_layout import BONUS, MARGIN, Placement, layout

COLORS = {"root": "#444444", "small": "#1f77b4", "mid": "#d62728", "both": "#9467bd", "accepted": "#f2b705",
          "pool": "#ff7f0e", "frontier": "#2ca02c", "selected": "#111111"}
SMALL_BIT, MID_BIT = 1, 2
NAMES = {"root": "root (last committed token)", "small": "small drafter (n-gram)", "mid": "mid drafter",
         "both": "proposed by both drafters", "pruned": "pruned (not verified)", "overwritten": "overwritten (w/o ND)"}
NODE_KEYS = ("root", "small", "mid", "both", "pruned", "overwritten")
# name, symbol, colour, extra size over the node's marker (px), line width
OVERLAYS = {"graft": ("graft site (mid frontier)", "diamond-open", "#d62728", 6, 1.5),
            "pool": ("pool of the step", "circle-open", COLORS["pool"], 5, 2),
            "frontier": ("frontier of the step", "square-open", COLORS["frontier"], 9, 2),
            "new": ("added by the step", "circle-open", "#000000", 3, 1),
            "accepted": ("accepted path", "circle-open", COLORS["accepted"], 9, 3),
            "selected": ("clicked path", "circle-open", COLORS["selected"], 13, 2)}
TRACES = ("edge", "accepted edge") + NODE_KEYS + ("graft", "pool", "frontier", "new", "accepted", "bonus", "selected")
LABEL_FONT = "DejaVu Sans Mono, Menlo, Consolas, monospace"
FRAME_MS = 1100


def category(tree, v: int) -> str:
    if v == 0:
        return "root"
    if tree.confirmed[v] == SMALL_BIT | MID_BIT:
        return "both"
    return "mid" if tree.drafter[v] == 1 else "small"


def removed_by(rt: RoundTrace, upto_step: int | None) -> set[int]:
    """Nodes overwritten (w/o ND) by the end of step upto_step (None: the whole round)."""
    return {v for s in rt.steps if upto_step is None or s.k <= upto_step for v in s.removed}


def visible_nodes(rt: RoundTrace, show: str) -> list[int]:
    """show "all": every drafted node (pruned and overwritten flagged); "kept": the verified tree."""
    t = rt.tree
    if show == "all":
        return list(range(t.size))
    gone = removed_by(rt, None)
    return [v for v in range(t.size) if t.kept[v] and v not in gone]


def latest_drafting_round(rounds: list[RoundTrace]) -> int:
    """1-based number of the latest round that drafted anything (the last round when none did)."""
    return next((r.index + 1 for r in reversed(rounds) if r.tree.size > 1), len(rounds))


def graft_sites_by(rt: RoundTrace) -> dict[int, int]:
    """node -> the first mid step that chose it as frontier."""
    out: dict[int, int] = {}
    for s in rt.steps:
        if s.action == "mid":
            for v in s.frontier:
                out.setdefault(v, s.k)
    return out


def tree_figure(rt: RoundTrace, token_strings: dict[int, str], show: str = "all", style: Style = NORMAL,
                title: str | None = None, animate: bool = True, legend: bool = True) -> go.Figure:
    """The round's tree; with animate (and show "all"), its frames, Play/Pause buttons and a frame slider."""
    t = rt.tree
    nodes = visible_nodes(rt, show)
    kept = {v for v in nodes if t.kept[v]}
    pl = layout(t, nodes, kept, token_strings, style.tree_height, style.tree_max, style.font,
                accepted=[v for v in rt.accepted_path if v in kept], bonus_token=rt.bonus_token, width=style.label_width)
    frames = round_frames(rt) if animate and show == "all" else [round_frames(rt)[-1]]
    head = title or summary_title(rt)
    fig = go.Figure(data=frame_traces(rt, pl, frames[-1], nodes, token_strings, style))
    fig.update_layout(**base_layout(pl, style, frame_title(head, frames[-1], len(frames) - 1, len(frames), style)),
                      showlegend=legend)
    tg = {"kind": "tree", "parents": t.parent, "pos": {str(v): p for v, p in pl.pos.items()},
          "selected": TRACES.index("selected"), "round": rt.index + 1, "frames": []}
    if len(frames) > 1:
        tg["frames"] = [{"name": f.name, "data": frame_traces(rt, pl, f, nodes, token_strings, style),
                         "layout": {"title": {"text": frame_title(head, f, i, len(frames), style)}}}
                        for i, f in enumerate(frames)]
        fig.update_layout(updatemenus=[play_buttons(style)], sliders=[frame_slider(frames, style)])
    tg["key"] = f"{rt.index}:{t.size}:{len(tg['frames'])}:{style.name}:{len(nodes)}"
    fig.layout.meta = {"tg": tg}
    return fig


def frames_of(fig: go.Figure) -> list[dict]:
    """The animation frames kept in the figure's meta (plain dicts: Plotly validates them in the browser).
    The app's Plot component drops a figure's own frames, so a small script re-adds these (ui/assets)."""
    meta = fig.layout.meta or {}
    return list(meta.get("tg", {}).get("frames", [])) if isinstance(meta, dict) else []


def write_html(fig: go.Figure, path: str) -> None:
    """A standalone HTML file whose Play button and frame slider work without the app."""
    import plotly.io as pio

    d = fig.to_plotly_json()
    d["frames"] = frames_of(fig)
    pio.write_html(d, path, include_plotlyjs=True, validate=False, auto_play=False)


def summary_title(rt: RoundTrace) -> str:
    t = rt.tree
    return (f"Round {rt.index + 1}: {t.size - 1} drafted, {sum(t.kept) - 1} verified, "
            f"{rt.accepted} accepted + 1 bonus")


def frame_title(head: str, f: Frame, i: int, n: int, style: Style) -> str:
    count = f" (frame {i + 1}/{n})" if n > 1 else ""
    return f"{head}{count}<br>{wrap(f.caption, style.wrap)}"


def base_layout(pl: Placement, style: Style, title: str) -> dict:
    return dict(title={"text": title, "font": {"size": style.title}, "x": 0.01, "xanchor": "left",
                       "yref": "container", "y": 1.0, "yanchor": "top", "pad": {"t": 18}},
                template="plotly_white", height=pl.height, hovermode="closest",
                legend={"font": {"size": style.legend}, "itemsizing": "constant"},
                margin=dict(MARGIN), font={"size": style.font},
                xaxis={"visible": False, "range": list(pl.x_range), "fixedrange": True},
                yaxis={"visible": False, "range": [-0.02, 1.02], "fixedrange": True}, clickmode="event")


def play_buttons(style: Style) -> dict:
    play = {"frame": {"duration": FRAME_MS, "redraw": True}, "fromcurrent": True, "transition": {"duration": 0},
            "mode": "immediate"}
    pause = {"frame": {"duration": 0, "redraw": False}, "mode": "immediate", "transition": {"duration": 0}}
    return {"type": "buttons", "direction": "left", "x": 0.0, "xanchor": "left", "y": -0.02, "yanchor": "top",
            "pad": {"t": 30, "r": 10}, "showactive": False, "font": {"size": style.legend + 1},
            "buttons": [{"label": "\u25b6 Play", "method": "animate", "args": [None, play]},
                        {"label": "\u275a\u275a Pause", "method": "animate", "args": [[None], pause]}]}


def frame_slider(frames: list[Frame], style: Style) -> dict:
    marks = {"prune": "\u2702", "verify": "\u2713"}
    steps = [{"label": marks.get(f.stage, str(f.k) if f.stage == "pool" else ""), "method": "animate",
              "args": [[f.name], {"mode": "immediate", "frame": {"duration": 0, "redraw": True},
                                  "transition": {"duration": 0}}]} for f in frames]
    return {"active": len(frames) - 1, "steps": steps, "x": 0.2, "len": 0.8, "y": -0.02, "yanchor": "top",
            "pad": {"t": 20}, "currentvalue": {"visible": False}, "font": {"size": style.legend}}


def frame_traces(rt: RoundTrace, pl: Placement, f: Frame, nodes: list[int], strings, style: Style) -> list:
    """The TRACES of one frame, in order (empty ones keep their legend entry)."""
    t = rt.tree
    exist = [v for v in nodes if t.step[v] <= f.upto_step]
    final = f.stage in ("prune", "verify")
    gone = removed_by(rt, f.upto_step)
    groups: dict[str, list[int]] = {}
    for v in exist:
        key = "overwritten" if v in gone else "pruned" if final and not t.kept[v] else category(t, v)
        groups.setdefault(key, []).append(v)
    accepted = [v for v in rt.accepted_path if v in pl.pos] if f.stage == "verify" else []
    sites = graft_sites_by(rt)
    upto_site = f.k if f.stage in ("frontier", "grow") else f.k - 1 if f.k else len(rt.steps)
    out = edge_traces(t, exist, pl, set(accepted))
    out += [node_trace(t, k, groups.get(k, []), pl, strings, style) for k in NODE_KEYS]
    out.append(overlay(pl, "graft", [v for v in exist if sites.get(v, 99) <= upto_site]))
    out += [overlay(pl, "pool", f.pool), overlay(pl, "frontier", f.frontier), overlay(pl, "new", f.new),
            overlay(pl, "accepted", accepted), bonus_trace(rt, pl, strings, style, bool(accepted)),
            overlay(pl, "selected", [])]
    return out


def edge_traces(t, nodes: list[int], pl: Placement, accepted: set[int]) -> list:
    out = []
    for on_path, color, width in ((False, "#c8c8c8", 1), (True, COLORS["accepted"], 4)):
        xs, ys = [], []
        for v in nodes:
            p = t.parent[v]
            if p < 0 or p not in pl.pos or (v in accepted and p in accepted) != on_path:
                continue
            xs += [pl.pos[p][0], pl.pos[v][0], None]
            ys += [pl.pos[p][1], pl.pos[v][1], None]
        out.append(dict(type="scatter", x=xs or [None], y=ys or [None], mode="lines", hoverinfo="skip",
                        showlegend=False, line={"color": color, "width": width},
                        name="accepted edge" if on_path else "edge"))
    return out


def node_trace(t, key: str, vs: list[int], pl: Placement, strings, style: Style) -> dict:
    faded = key in ("pruned", "overwritten")
    symbol = {"pruned": "circle-open", "overwritten": "x-thin-open"}.get(key, "circle")
    color = [COLORS[category(t, v)] for v in vs] or COLORS.get(key, "#999999")
    return dict(
        type="scatter", x=[pl.pos[v][0] for v in vs] or [None], y=[pl.pos[v][1] for v in vs] or [None],
        mode="markers+text",
        name=NAMES[key], legendgroup=key, text=[pl.labels.get(v, "") for v in vs], textposition="middle right",
        textfont={"size": style.font, "family": LABEL_FONT, "color": "#9a9a9a" if faded else "#222222"},
        marker={"size": [pl.size[v] for v in vs] or 12, "color": color, "symbol": symbol,
                "opacity": 0.6 if faded else 1.0, "line": {"width": 1.5 if faded else 0.5, "color": color}},
        hovertext=[hover(t, v, strings) for v in vs], hoverinfo="text", customdata=vs)


def overlay(pl: Placement, key: str, vs) -> dict:
    name, symbol, color, extra, width = OVERLAYS[key]
    vs = [v for v in vs if v in pl.pos]
    return dict(type="scatter", x=[pl.pos[v][0] for v in vs] or [None], y=[pl.pos[v][1] for v in vs] or [None],
                mode="markers", name=name, hoverinfo="skip",
                marker={"size": [pl.size[v] + extra for v in vs] or 12 + extra, "symbol": symbol, "color": color,
                        "line": {"width": width, "color": color}})


def bonus_trace(rt: RoundTrace, pl: Placement, strings, style: Style, shown: bool) -> dict:
    at = pl.pos.get(BONUS) if shown else None
    token = strings.get(rt.bonus_token, str(rt.bonus_token))
    return dict(type="scatter", x=[at[0]] if at else [None], y=[at[1]] if at else [None], mode="markers+text",
                      name="bonus token (from the target)", text=[pl.labels.get(BONUS, "")] if at else [""],
                      textposition="middle right",
                      textfont={"size": style.font, "family": LABEL_FONT, "color": "#222222"},
                      marker={"size": 18, "symbol": "star", "color": COLORS["accepted"]},
                      hovertext=[f"bonus token {token!r} (id {rt.bonus_token}): the target's own next token"],
                      hoverinfo="text")


def hover(t, v: int, strings) -> str:
    who = {-1: "root", 0: "small (n-gram)", 1: "mid"}[int(t.drafter[v])]
    state = "kept (verified)" if t.kept[v] else "pruned" if t.alive[v] else "overwritten"
    site = ", graft site" if t.graft_site[v] else ""
    return (f"{strings.get(t.token[v], t.token[v])!r} (id {t.token[v]}), node {v}<br>depth {t.depth[v]}, "
            f"step {t.step[v]}, by {who}{site}<br>p = {math.exp(t.logp[v]):.3f}, s = {math.exp(t.score[v]):.4f}"
            f"{own_scores(t, v)}<br>{state}")


def own_scores(t, v: int) -> str:
    """Each drafter's own p of a node, where the trace has them (p above may be the calibrated one)."""
    if t.p_small is None or v == 0:
        return ""
    parts = [f"{name} {p:.3f}" for name, p in (("n-gram", t.p_small[v]), ("mid", t.p_mid[v])) if p is not None]
    return f"<br>own p: {', '.join(parts)}" if parts else ""
