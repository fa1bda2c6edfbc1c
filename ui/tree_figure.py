"""RoundTrace -> Plotly figure of the shared draft tree (pure: trace in, figure out).

Layout: root on the left, depth to the right; leaves in depth-first order
(networkx) spread vertically, every parent centred on its children.

Encodings (each one a legend entry):
  fill colour   which drafter created the node: small (n-gram), mid, or both (proposed by each)
  diamond       graft site: a node a mid step chose as frontier
  hollow        pruned: drafted but not sent to verification (beyond B_ver)
  cross         overwritten: deleted by the w/o-ND ablation
  gold ring     accepted path; the gold star after it is the bonus token
"""
from __future__ import annotations

import networkx as nx
import plotly.graph_objects as go

from treegraft.trace import RoundTrace

COLORS = {"root": "#444444", "small": "#1f77b4", "mid": "#d62728", "both": "#9467bd", "accepted": "#f2b705"}
SMALL_BIT, MID_BIT = 1, 2


def layout(parents: list[int], nodes: list[int]) -> dict[int, tuple[float, float]]:
    """(x = depth, y) for the given nodes (a subset closed under parents), tidy: parents centred."""
    g = nx.DiGraph()
    g.add_nodes_from(nodes)
    g.add_edges_from((parents[v], v) for v in nodes if parents[v] >= 0 and parents[v] in g)
    y: dict[int, float] = {}
    next_leaf = 0.0
    for v in reversed(list(nx.dfs_postorder_nodes(g, 0))):  # preorder: leaves top to bottom
        if g.out_degree(v) == 0:
            y[v] = next_leaf
            next_leaf += 1
    for v in nx.dfs_postorder_nodes(g, 0):
        kids = list(g.successors(v))
        if kids:
            y[v] = sum(y[c] for c in kids) / len(kids)
    depth = nx.single_source_shortest_path_length(g, 0)
    return {v: (float(depth[v]), -y[v]) for v in g.nodes if v in y}


def category(tree, v: int) -> str:
    if v == 0:
        return "root"
    if tree.confirmed[v] == SMALL_BIT | MID_BIT:
        return "both"
    return "mid" if tree.drafter[v] == 1 else "small"


def removed_by(rt: RoundTrace, upto_step: int | None) -> set[int]:
    """Nodes overwritten (w/o ND) by the end of step upto_step (None: the whole round)."""
    return {v for s in rt.steps if upto_step is None or s.k <= upto_step for v in s.removed}


def visible_nodes(rt: RoundTrace, show: str, upto_step: int | None) -> list[int]:
    """show "kept": the verified tree (or, while replaying a step, the live tree); "all": every drafted node."""
    t = rt.tree
    gone = removed_by(rt, upto_step)
    out = []
    for v in range(t.size):
        if upto_step is not None and t.step[v] > upto_step:
            continue
        if show == "kept" and (v in gone or (upto_step is None and not t.kept[v])):
            continue
        out.append(v)
    return out


def label(token_strings: dict[int, str], tok: int) -> str:
    s = token_strings.get(tok, str(tok))
    return s.replace("\n", "\\n").replace(" ", "\u00b7") or "\u2205"


NAMES = {"root": "root (last committed token)", "small": "small drafter (n-gram)", "mid": "mid drafter",
         "both": "proposed by both drafters", "pruned": "pruned (not verified)", "overwritten": "overwritten (w/o ND)"}
SYMBOLS = {"pruned": "circle-open", "overwritten": "x-thin-open"}


def tree_figure(rt: RoundTrace, token_strings: dict[int, str], show: str = "kept",
                upto_step: int | None = None, title: str | None = None) -> go.Figure:
    """The round's tree. show: "kept" (verified nodes) or "all" (everything drafted, pruned faded);
    upto_step: draw the tree as it stood after draft step k (replay), before pruning and verification."""
    t = rt.tree
    nodes = visible_nodes(rt, show, upto_step)
    pos = layout(t.parent, nodes)
    final = upto_step is None
    fig = go.Figure()
    _edges(fig, t, nodes, pos, set(rt.accepted_path) if final else set())
    _node_traces(fig, t, node_groups(rt, nodes, upto_step), pos, token_strings)
    _overlay(fig, [v for v in nodes if t.graft_site[v] and (final or t.step[v] <= upto_step)], pos,
             "graft site (mid frontier)", "diamond-open", "#d62728", 20)
    frontier = set(rt.steps[upto_step - 1].frontier) if upto_step else set()
    if frontier:
        _overlay(fig, [v for v in frontier if v in pos], pos, f"frontier of step {upto_step}", "square-open",
                 "#2ca02c", 22)
    _accepted(fig, rt, pos, token_strings, final)
    fig.update_layout(title=title or _title(rt, upto_step), showlegend=True, template="plotly_white",
                      legend={"orientation": "h", "y": -0.08}, margin={"l": 10, "r": 10, "t": 40, "b": 10},
                      xaxis={"visible": False}, yaxis={"visible": False}, height=560)
    return fig


def node_groups(rt: RoundTrace, nodes: list[int], upto_step: int | None) -> dict[str, list[int]]:
    """Nodes by legend entry: overwritten, pruned (final tree only), else the drafter category."""
    t, gone, groups = rt.tree, removed_by(rt, upto_step), {}
    for v in nodes:
        key = "overwritten" if v in gone else "pruned" if upto_step is None and not t.kept[v] else category(t, v)
        groups.setdefault(key, []).append(v)
    return groups


def _node_traces(fig: go.Figure, t, groups: dict[str, list[int]], pos, token_strings) -> None:
    for key in ("root", "small", "mid", "both", "pruned", "overwritten"):
        vs = groups.get(key, [])
        symbol = SYMBOLS.get(key, "circle")
        if not vs:  # the legend always explains every encoding
            _legend_only(fig, NAMES[key], symbol, COLORS.get(key, "#999"))
            continue
        faded = key in ("pruned", "overwritten")
        color = [COLORS[category(t, v)] for v in vs]
        fig.add_trace(go.Scatter(
            x=[pos[v][0] for v in vs], y=[pos[v][1] for v in vs], mode="markers+text", name=NAMES[key],
            text=[label(token_strings, t.token[v]) for v in vs], textposition="middle right",
            textfont={"size": 11, "color": "#999" if faded else "#222"},
            marker={"size": 12, "color": color, "symbol": symbol, "opacity": 0.45 if faded else 1.0,
                    "line": {"width": 1, "color": color}},
            hovertext=[_hover(t, v, token_strings) for v in vs], hoverinfo="text", customdata=vs, legendgroup=key))


def _accepted(fig: go.Figure, rt: RoundTrace, pos, token_strings, final: bool) -> None:
    """The accepted path and the bonus token (legend entries only while replaying a draft step)."""
    if not final:
        _legend_only(fig, "accepted path", "circle-open", COLORS["accepted"])
        _legend_only(fig, "bonus token (from the target)", "star", COLORS["accepted"])
        return
    _overlay(fig, [v for v in rt.accepted_path if v in pos], pos, "accepted path", "circle-open",
             COLORS["accepted"], 22, width=4)
    last = rt.accepted_path[-1]
    if last in pos:
        x, y = pos[last]
        fig.add_trace(go.Scatter(x=[x + 1], y=[y], mode="markers+text", name="bonus token (from the target)",
                                 text=[label(token_strings, rt.bonus_token)], textposition="middle right",
                                 marker={"size": 18, "symbol": "star", "color": COLORS["accepted"]},
                                 hovertext=[f"bonus token {token_strings.get(rt.bonus_token, '')!r}"],
                                 hoverinfo="text"))


def _title(rt: RoundTrace, upto_step: int | None) -> str:
    if upto_step:
        s = rt.steps[upto_step - 1]
        return (f"Round {rt.index + 1}, after step {upto_step}/{len(rt.steps)}: {s.action} step, "
                f"pool {len(s.pool)}, frontier {len(s.frontier)}, +{len(s.added)} nodes")
    kept = sum(rt.tree.kept) - 1
    return (f"Round {rt.index + 1}: {rt.tree.size - 1} drafted, {kept} verified, "
            f"{rt.accepted} accepted + 1 bonus")


def _hover(t, v: int, token_strings) -> str:
    import math

    who = {-1: "root", 0: "small", 1: "mid"}[int(t.drafter[v])]
    return (f"{token_strings.get(t.token[v], t.token[v])!r} (id {t.token[v]})<br>depth {t.depth[v]}, step {t.step[v]}, "
            f"by {who}<br>p = {math.exp(t.logp[v]):.3f}, s = {math.exp(t.score[v]):.4f}")


def _edges(fig, t, nodes, pos, accepted) -> None:
    for on_path, name, color, width in ((False, "edge", "#bbbbbb", 1), (True, "accepted edge", COLORS["accepted"], 4)):
        xs, ys = [], []
        for v in nodes:
            p = t.parent[v]
            if p < 0 or p not in pos or (v in accepted and p in accepted) != on_path:
                continue
            xs += [pos[p][0], pos[v][0], None]
            ys += [pos[p][1], pos[v][1], None]
        if xs:
            fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", line={"color": color, "width": width},
                                     hoverinfo="skip", showlegend=False, name=name))


def _legend_only(fig, name, symbol, color) -> None:
    """A legend entry with no points, so the legend always explains every encoding."""
    fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=name, hoverinfo="skip",
                             marker={"size": 12, "symbol": symbol, "color": color}))


def _overlay(fig, vs, pos, name, symbol, color, size, width=2) -> None:
    if not vs:
        _legend_only(fig, name, symbol, color)
        return
    fig.add_trace(go.Scatter(x=[pos[v][0] for v in vs], y=[pos[v][1] for v in vs], mode="markers", name=name,
                             marker={"size": size, "symbol": symbol, "color": color, "line": {"width": width,
                                                                                                "color": color}},
                             hoverinfo="skip"))
