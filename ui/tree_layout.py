"""Where the tree's nodes and labels go (pure): a layered layout and non-overlapping short labels.

Layers: x = depth (root at 0). Within a layer, nodes follow a depth-first preorder of the tree
(children by path score, best first), so no two edges cross; each layer spreads its nodes over the
full height, kept nodes getting KEPT_WEIGHT times the room of pruned ones, so the verified tree stays
readable among hundreds of pruned nodes.

Labels: a short form of the token (at most LABEL_CHARS cells) is drawn only where its box, in the
figure's pixels, overlaps no other label and no other node; nodes are tried root first, then the
accepted path, graft sites, kept nodes and pruned nodes, each by path score. Every node keeps its
full token, p, s, depth, step and drafter on hover.
"""
from __future__ import annotations

import unicodedata
from dataclasses import dataclass

import networkx as nx

LABEL_CHARS = 6
CHAR_EM = 0.62  # a monospace cell's width, in font sizes (DejaVu Sans Mono: 0.602)
LINE_EM = 1.3
KEPT_WEIGHT, PRUNED_WEIGHT = 1.0, 0.3
ROOM = 1.4  # a kept node's slot, in label lines, when the height allows
MIN_WIDTH_PX = 640  # labels are placed so as not to overlap down to this plot width
MARGIN = {"l": 10, "r": 10, "t": 110, "b": 95}  # title above, Play and the frame slider below


@dataclass(frozen=True)
class Placement:
    pos: dict[int, tuple[float, float]]  # node -> (x = depth, y in [0, 1], 1 = top)
    size: dict[int, float]  # node -> marker diameter, px
    labels: dict[int, str]  # the nodes drawn with a text label -> that label
    height: int  # figure height, px
    x_range: tuple[float, float]
    font: int


def cells(text: str) -> int:
    """Monospace cells: East Asian wide characters take two."""
    return sum(2 if unicodedata.east_asian_width(ch) in "WF" else 1 for ch in text)


def short_label(token: str) -> str:
    """Spaces as middle dots, newlines as \\n, at most LABEL_CHARS cells (an ellipsis marks a cut)."""
    s = token.replace("\n", "\\n").replace("\t", "\\t").replace(" ", "\u00b7") or "\u2205"
    s = "".join(ch if ch.isprintable() else "?" for ch in s)
    if cells(s) <= LABEL_CHARS:
        return s
    out = ""
    for ch in s:
        if cells(out + ch) > LABEL_CHARS - 1:
            break
        out += ch
    return out + "\u2026"


def preorder(parents: list[int], score: list[float], nodes: list[int]) -> list[int]:
    """Depth-first preorder from the root over `nodes` (closed under parents), children best first."""
    g = nx.DiGraph()
    g.add_nodes_from(nodes)
    kids = sorted((v for v in nodes if v), key=lambda v: (parents[v], -score[v], v))
    g.add_edges_from((parents[v], v) for v in kids)
    return list(nx.dfs_preorder_nodes(g, 0))


def layer_positions(order: list[int], depth: list[int], weight: dict[int, float]) -> dict[int, tuple[float, float]]:
    layers: dict[int, list[int]] = {}
    for v in order:
        layers.setdefault(depth[v], []).append(v)
    pos = {}
    for d, vs in layers.items():
        total, acc = sum(weight[v] for v in vs), 0.0
        for v in vs:
            pos[v] = (float(d), 1.0 - (acc + weight[v] / 2) / total)
            acc += weight[v]
    return pos


def figure_height(depth: list[int], nodes: list[int], weight: dict[int, float], base: int, cap: int,
                  font: int) -> int:
    """Tall enough that a kept node's slot holds a label line, within [base, cap]."""
    per_layer: dict[int, float] = {}
    for v in nodes:
        per_layer[depth[v]] = per_layer.get(depth[v], 0.0) + weight[v]
    need = max(per_layer.values()) * font * LINE_EM * ROOM + MARGIN["t"] + MARGIN["b"]
    return int(min(cap, max(base, need)))


BONUS = -1  # the bonus token's key in a Placement: a column of its own right of the deepest layer


def layout(tree, nodes: list[int], kept: set[int], token_strings: dict[int, str], base_height: int = 560,
           max_height: int = 900, font: int = 11, accepted: list[int] | None = None,
           bonus_token: int | None = None, width: int = MIN_WIDTH_PX) -> Placement:
    """Positions, marker sizes and labels of `nodes` (a subset of `tree`'s, closed under parents).
    kept: the nodes drawn as verified (more room); accepted: the path labelled first, and the bonus token
    (placed at BONUS, level with the path's last node) when bonus_token is given; width: the narrowest plot
    width (px) the labels must not overlap at."""
    order = preorder(tree.parent, tree.score, nodes)
    weight = {v: KEPT_WEIGHT if v in kept or v == 0 else PRUNED_WEIGHT for v in order}
    pos = layer_positions(order, tree.depth, weight)
    depth = {v: tree.depth[v] for v in order}
    height = figure_height(tree.depth, order, weight, base_height, max_height, font)
    max_d = max(depth.values())
    x_range = (-0.3, max_d + 1.9)  # one column to spare for the bonus token and its label
    plot_h = height - MARGIN["t"] - MARGIN["b"]
    totals: dict[int, float] = {}
    for v in order:
        totals[depth[v]] = totals.get(depth[v], 0.0) + weight[v]
    size = {v: max(5.0, min(12.0, 0.7 * plot_h * weight[v] / totals[depth[v]])) for v in order}
    ranked = label_priority(tree, order, kept, accepted or [])
    texts = {v: short_label(token_strings.get(tree.token[v], str(tree.token[v]))) for v in ranked}
    if bonus_token is not None and accepted and accepted[-1] in pos:
        pos[BONUS], depth[BONUS], size[BONUS] = (max_d + 1.0, pos[accepted[-1]][1]), max_d + 1, 14.0
        texts[BONUS] = short_label(token_strings.get(bonus_token, str(bonus_token)))
        ranked.insert(1 + sum(v in accepted for v in ranked[1:]), BONUS)
    path = {0, BONUS} | set(accepted or [])
    labels = place_labels(ranked, texts, pixel_xy(pos, x_range, plot_h, width), size, font, depth, path)
    return Placement(pos, size, labels, height, x_range, font)


def label_priority(tree, order: list[int], kept: set[int], first: list[int]) -> list[int]:
    def rank(v):
        group = 0 if v == 0 else 1 if v in first else 2 if tree.graft_site[v] else 3 if v in kept else 4
        return group, -tree.score[v], v

    return sorted(order, key=rank)


def pixel_xy(pos, x_range, plot_h: int, width: int = MIN_WIDTH_PX) -> dict[int, tuple[float, float]]:
    """Node centres in pixels of the plot area (y down), at the narrowest width labels are placed for."""
    plot_w = width - MARGIN["l"] - MARGIN["r"]
    x0, x1 = x_range
    return {v: ((x - x0) / (x1 - x0) * plot_w, (1.0 - y) * plot_h) for v, (x, y) in pos.items()}


def label_box(xy, size: float, text: str, font: int) -> tuple[float, float, float, float]:
    """(left, top, right, bottom) of a label drawn right of its marker ('middle right')."""
    x, y = xy
    half = font * LINE_EM / 2
    left = x + size / 2 - 0.5  # Plotly starts the text a few px right of the marker: this box is wider
    return left, y - half, left + cells(text) * CHAR_EM * font + 3, y + half


def marker_box(xy, size: float) -> tuple[float, float, float, float]:
    x, y = xy
    return x - size / 2, y - size / 2, x + size / 2, y + size / 2


def overlaps(a, b) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def place_labels(ranked: list[int], texts: dict[int, str], xy, size, font: int, depth,
                 path: set[int] = frozenset()) -> dict[int, str]:
    """Greedy: a node gets its label if the box hits no label placed before it and no other node (the path's
    labels, placed first, may touch a neighbour's marker). A label reaches at most into the next layer, so
    only layers d-1..d+1 are compared."""
    markers: dict[int, list] = {}
    for v in ranked:
        markers.setdefault(depth[v], []).append((v, marker_box(xy[v], size[v])))
    placed: dict[int, list] = {}
    out = {}
    for v in ranked:
        d, box = depth[v], label_box(xy[v], size[v], texts[v], font)
        near = [b for e in (d - 1, d, d + 1) for b in placed.get(e, [])]
        if any(overlaps(box, b) for b in near):
            continue
        if v not in path and any(u != v and overlaps(box, m) for e in (d, d + 1) for u, m in markers.get(e, [])):
            continue
        placed.setdefault(d, []).append(box)
        out[v] = texts[v]
    return out
