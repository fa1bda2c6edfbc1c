"""The tree panel, its animation and the round timeline as pure functions of traces, on a big synthetic round
(63 kept + 300 pruned nodes, mid grafts at earlier depths) and on the shipped gallery (no model, no server)."""
import math
import random

import pytest

from treegraft.prune import prune
from treegraft.trace import GenerationResult, RoundTrace, StepTrace, TreeSnapshot
from treegraft.tree import MID, SMALL, DraftTree, add_child
from ui.animation import round_frames
from ui.gallery import MAX_ENTRY_BYTES, entries, load_entry, GALLERY_DIR
from ui.timeline import round_commits, timeline_figure
from ui.tree_figure import NODE_KEYS, NAMES, latest_drafting_round, tree_figure
from ui.style import COMPARE_LABEL_WIDTH
from ui.tree_layout import CHAR_EM, LINE_EM, MARGIN, MIN_WIDTH_PX, cells, layout, short_label

WORDS = ["\u00b7the", "\u00b7a", "ing", "\n", "\u00b7tree", "<|im_end|>", "\u00b7assistant", "\u4f60\u597d", "ly", ",",
         "\u00b7speculative", "ed"]


def big_round(seed: int = 0, kept: int = 63):
    """D = 5 steps (small, small, mid, small, mid) growing 363 drafted nodes; prune keeps `kept`."""
    rng = random.Random(seed)
    t = DraftTree.new(1000, 512)
    steps, last, budget = [], [0], [10, 50, 100, 100, 103]
    for k, action in enumerate(["small", "small", "mid", "small", "mid"], start=1):
        if action == "mid":  # pool: every node so far; frontier: the best of them, some at earlier depths
            pool = list(range(t.n))
            frontier = sorted(pool, key=lambda v: -t.score[v])[:20]
        else:
            pool, frontier = list(last), sorted(last, key=lambda v: -t.score[v])[:20]
        added, n_new = [], budget[k - 1]
        while len(added) < n_new:
            p = frontier[len(added) % len(frontier)]
            v, created = add_child(t, p, rng.randrange(5000), math.log(rng.uniform(0.01, 0.9)),
                                   MID if action == "mid" else SMALL, k)
            if created:
                added.append(v)
        if action == "mid":
            t.graft_site[frontier] = True
        steps.append(StepTrace(k, action, pool=pool, frontier=frontier, added=added, n_k=len(last)))
        last = added
    prune(t, kept)
    snap = TreeSnapshot.of(t)
    path = [0]
    while True:  # accept the best kept child down to depth 3
        kids = [v for v in range(snap.size) if snap.parent[v] == path[-1] and snap.kept[v]]
        if not kids or len(path) > 3:
            break
        path.append(max(kids, key=lambda v: snap.score[v]))
    strings = {tok: WORDS[tok % len(WORDS)] for tok in snap.token}
    rt = RoundTrace(index=6, prefix_len=40, tree=snap, bonus_token=7, steps=steps, accepted_path=path,
                    accepted_tokens=[snap.token[v] for v in path[1:]])
    strings[7] = "\u00b7bonus"
    return rt, strings


def boxes(pl, rt, strings, width: int = MIN_WIDTH_PX):
    """Label and marker boxes in the plot's pixels, recomputed here from the placement (not the module's helpers)."""
    plot_w = width - MARGIN["l"] - MARGIN["r"]
    plot_h = pl.height - MARGIN["t"] - MARGIN["b"]
    x0, x1 = pl.x_range

    def px(v):
        x, y = pl.pos[v]
        return (x - x0) / (x1 - x0) * plot_w, (1 - y) * plot_h

    labels, markers = {}, {}
    for v in pl.pos:
        cx, cy = px(v)
        r = pl.size[v] / 2
        markers[v] = (cx - r, cy - r, cx + r, cy + r)
        if v in pl.labels:
            w = cells(pl.labels[v]) * CHAR_EM * pl.font
            h = pl.font * LINE_EM / 2
            labels[v] = (cx + r, cy - h, cx + r + w, cy + h)
    return labels, markers


def hit(a, b) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def test_labels_are_placed_for_the_width_they_are_drawn_at():
    """A compare side is about half the run view's width: layers come closer, so labels placed for the run view
    would cover each other there; placed for the compare side's width, none do and most stay."""
    rng = random.Random(0)
    t = DraftTree.new(1000, 64)
    while t.n < 40:
        add_child(t, rng.randrange(t.n), rng.randrange(5000), math.log(rng.uniform(0.05, 0.9)), SMALL, 1)
    prune(t, 63)
    snap = TreeSnapshot.of(t)
    rt = RoundTrace(index=0, prefix_len=8, tree=snap, bonus_token=None, steps=[], accepted_path=[0],
                    accepted_tokens=[])
    strings = {tok: "\u00b7tree\u00b7" for tok in snap.token}

    def drawn(placed_for: int, drawn_at: int) -> tuple[int, int]:
        pl = layout(snap, list(range(snap.size)), set(range(snap.size)), strings, width=placed_for)
        items = list(boxes(pl, rt, strings, drawn_at)[0].values())
        return sum(hit(a, b) for i, a in enumerate(items) for b in items[i + 1:]), len(items)

    assert drawn(MIN_WIDTH_PX, MIN_WIDTH_PX) == (0, 40)
    assert drawn(MIN_WIDTH_PX, COMPARE_LABEL_WIDTH)[0] > 0
    overlapping, labelled = drawn(COMPARE_LABEL_WIDTH, COMPARE_LABEL_WIDTH)
    assert overlapping == 0 and labelled >= 15


def test_big_round_has_63_kept_and_300_pruned():
    rt, _ = big_round()
    assert rt.tree.size == 364 and sum(rt.tree.kept) - 1 == 63


@pytest.mark.parametrize("width,readable", [(MIN_WIDTH_PX, 40), (COMPARE_LABEL_WIDTH, 15)])
def test_layout_labels_never_overlap_on_63_kept_plus_300_pruned(width, readable):
    """At the run view's narrowest width and at a compare side's (half as wide: fewer labels, none overlapping)."""
    rt, strings = big_round()
    t = rt.tree
    kept = {v for v in range(t.size) if t.kept[v]}
    pl = layout(t, list(range(t.size)), kept, strings, accepted=rt.accepted_path, bonus_token=rt.bonus_token,
                width=width)
    labels, markers = boxes(pl, rt, strings, width)
    items = list(labels.items())
    for i, (u, a) in enumerate(items):
        for w, b in items[i + 1:]:
            assert not hit(a, b), (u, w, pl.labels[u], pl.labels[w])
        for w, m in markers.items():  # the accepted path's labels (placed first) may touch a neighbour's marker
            assert w == u or u in rt.accepted_path or u == -1 or not hit(a, m), (u, w)
    assert set(rt.accepted_path) <= set(pl.labels) and -1 in pl.labels  # the path and the bonus are named
    assert len(labels) >= readable  # most of the verified tree stays readable
    assert all(cells(s) <= 6 for s in pl.labels.values())
    # layered: x is the depth; within a layer the order follows the parents' (no crossing edges)
    assert all(pl.pos[v][0] == t.depth[v] for v in range(t.size))
    for v in range(1, t.size):
        for u in range(1, t.size):
            pu, pv = t.parent[u], t.parent[v]
            if t.depth[u] == t.depth[v] and pu != pv and pl.pos[pu][1] > pl.pos[pv][1]:
                assert pl.pos[u][1] > pl.pos[v][1]


def test_layout_gives_kept_nodes_more_room_than_pruned_ones():
    rt, strings = big_round()
    t = rt.tree
    pl = layout(t, list(range(t.size)), {v for v in range(t.size) if t.kept[v]}, strings)
    for d in range(1, 6):  # within each layer, a kept node's marker is at least a pruned one's, larger on average
        kept_sizes = [pl.size[v] for v in range(1, t.size) if t.kept[v] and t.depth[v] == d]
        pruned_sizes = [pl.size[v] for v in range(1, t.size) if not t.kept[v] and t.depth[v] == d]
        if kept_sizes and pruned_sizes:
            assert min(kept_sizes) >= max(pruned_sizes)
            assert sum(kept_sizes) / len(kept_sizes) > sum(pruned_sizes) / len(pruned_sizes) or min(pruned_sizes) == 12


def test_short_labels():
    assert short_label(" the") == "\u00b7the" and short_label("\n") == "\\n" and short_label("") == "\u2205"
    assert short_label("<|im_end|>") == "<|im_\u2026" and cells(short_label("\u4f60\u597d\u4f60\u597d")) <= 6


def drawn(fig_data, names=None) -> int:
    return sum(sum(x is not None for x in tr["x"]) for tr in fig_data
               if tr.get("name") in (names or [NAMES[k] for k in NODE_KEYS]))


def test_tree_figure_draws_every_drafted_node_pruned_hollow_and_labels_from_the_layout():
    rt, strings = big_round()
    fig = tree_figure(rt, strings)
    data = [tr.to_plotly_json() for tr in fig.data]
    assert drawn(data) == 364
    pruned = next(tr for tr in data if tr["name"] == NAMES["pruned"])
    assert len(pruned["x"]) == 300 and pruned["marker"]["symbol"] == "circle-open"
    shown = [s for tr in data if tr["name"] in [NAMES[k] for k in NODE_KEYS] for s in tr["text"] if s]
    assert 40 <= len(shown) < 364
    hover = next(tr for tr in data if tr["name"] == NAMES["small"])["hovertext"][0]
    for word in ("depth", "step", "by small", "p = ", "s = "):
        assert word in hover
    assert "63 verified" in fig.layout.title.text and "300" not in fig.layout.title.text.split("<br>")[0].split(":")[0]


def test_animation_frames_and_captions():
    rt, strings = big_round()
    frames = round_frames(rt)
    assert [f.stage for f in frames] == ["pool", "frontier", "grow"] * 5 + ["prune", "verify"]
    mid3 = frames[8]
    assert mid3.stage == "grow" and mid3.k == 3
    before = [rt.tree.depth[v] for v in range(rt.tree.size) if rt.tree.step[v] < 3]
    earlier = sum(rt.tree.depth[v] < max(before) for v in rt.steps[2].frontier)
    assert 0 < earlier < 20
    assert mid3.caption == (f"mid step 3: re-scored {len(rt.steps[2].pool)} unvisited nodes, grafted at 20 sites, "
                            f"{earlier} of them at earlier depths: +100 nodes")
    assert frames[0].caption == "small step 1: the pool is the root"
    assert frames[-2].caption.startswith("prune: keep the 63 nodes") and "300 of 363" in frames[-2].caption
    a = len(rt.accepted_path) - 1
    assert frames[-1].caption == (f"verify: one target forward over the root + 63 nodes; accepted {a} draft tokens "
                                  f"+ 1 bonus token = {a + 1} committed")
    fig = tree_figure(rt, strings)
    fr = fig.layout.meta["tg"]["frames"]
    assert [f["name"] for f in fr] == [f.name for f in frames]
    by_name = {f["name"]: f for f in fr}
    # the tree grows step by step: a step's pool frame shows the nodes of earlier steps, its grow frame adds its own
    for k in range(1, 6):
        upto = sum(rt.tree.step[v] <= k for v in range(rt.tree.size))
        assert drawn(by_name[f"{k} {rt.steps[k - 1].action} adds"]["data"]) == upto
        assert drawn(by_name[f"{k} pool"]["data"]) == upto - len(rt.steps[k - 1].added)
        pool = next(t for t in by_name[f"{k} pool"]["data"] if t["name"] == "pool of the step")
        assert sum(x is not None for x in pool["x"]) == len(rt.steps[k - 1].pool)
    # before the prune nothing is hollow; after it the 300 pruned nodes are; only verify shows the accepted path
    hollow = lambda f: drawn(f["data"], [NAMES["pruned"]])  # noqa: E731
    path = lambda f: drawn(f["data"], ["accepted path"])  # noqa: E731
    assert hollow(by_name["5 mid adds"]) == 0 and hollow(by_name["prune"]) == 300
    assert path(by_name["prune"]) == 0 and path(by_name["verify"]) == len(rt.accepted_path)
    assert all(f["layout"]["title"]["text"].endswith(c.caption.split(" ")[-1]) for f, c in zip(fr, frames))
    assert [b["label"] for b in fig.layout.updatemenus[0].buttons] == ["\u25b6 Play", "\u275a\u275a Pause"]
    assert len(fig.layout.sliders[0].steps) == len(frames)


def test_kept_view_has_no_animation_and_only_the_verified_tree():
    rt, strings = big_round()
    fig = tree_figure(rt, strings, show="kept")
    assert fig.layout.meta["tg"]["frames"] == [] and not fig.layout.updatemenus
    assert drawn([tr.to_plotly_json() for tr in fig.data]) == 64


def ar_round(i: int) -> RoundTrace:
    t = DraftTree.new(5, 4)
    t.kept[0] = True
    return RoundTrace(index=i, prefix_len=10 + i, tree=TreeSnapshot.of(t), bonus_token=6)


def test_default_round_is_the_latest_that_drafted_anything():
    rt, _ = big_round()
    rounds = [ar_round(0), rt, ar_round(7), ar_round(8)]
    assert latest_drafting_round(rounds) == 7  # rt.index + 1
    assert latest_drafting_round([ar_round(0), ar_round(1)]) == 2


def test_timeline_totals_equal_the_committed_tokens():
    rt, _ = big_round()
    rounds = [ar_round(0), rt, ar_round(7)]
    commits = round_commits(rounds)
    assert [sum(c.values()) for c in commits] == [1, len(rt.accepted_path), 1]
    assert sum(c["bonus"] for c in commits) == 3
    fig = timeline_figure(rounds)
    bars = {tr.name: list(tr.y) for tr in fig.data if tr.type == "bar"}
    assert [sum(col) for col in zip(*bars.values())] == [1, len(rt.accepted_path), 1]
    mids = next(tr for tr in fig.data if tr.name == "mid called (steps)")
    assert list(mids.x) == [7] and list(mids.text) == ["2"]
    # cut at the output's length (the last round may commit past max_new_tokens)
    assert sum(sum(c.values()) for c in round_commits(rounds, limit=3)) == 3


@pytest.mark.skipif(not entries(), reason="no gallery recorded")
def test_gallery_traces_are_small_load_offline_and_their_timelines_add_up():
    es = entries()
    cats = {e.category for e in es if e.method == "treegraft"}
    assert cats == {"chat", "code", "math", "qa", "summarisation", "translation"}
    trio = [e for e in es if e.method.startswith("fixed")]
    assert sorted(e.method for e in trio) == ["fixed", "fixed --no-eg", "fixed --no-nd"]
    assert len({e.prompt for e in trio}) == 1
    for e in es:
        assert (GALLERY_DIR / e.file).stat().st_size <= MAX_ENTRY_BYTES, e.file
        res = load_entry(e.name)
        assert isinstance(res, GenerationResult) and res.new_tokens
        total = sum(sum(c.values()) for c in round_commits(res.rounds, len(res.new_tokens)))
        assert total == len(res.new_tokens), e.name
        fig = timeline_figure(res.rounds, len(res.new_tokens))
        assert sum(sum(tr.y) for tr in fig.data if tr.type == "bar") == len(res.new_tokens)
