"""Figure builders are pure: trace in, figure out (no server, no model)."""
import json
import math
from dataclasses import replace
from types import SimpleNamespace

import pytest

from treegraft.trace import GenerationResult, RoundTrace, StepTrace, TreeSnapshot, dumps
from treegraft.prune import prune
from treegraft.tree import MID, SMALL, DraftTree, add_child, delete_subtree
from ui.charts import counters_html, margin_figure, output_segments, speedup_figure
from ui.trace_io import TraceError, load_trace, parse_trace
from ui.tree_figure import COLORS, tree_figure

STRINGS = {100: "root", 1: " a", 2: " b", 3: " c", 4: " d", 5: " e", 6: " f", 9: "!"}


def hand_round():
    """root -> a(small) -> c(mid) ; root -> b(mid, graft child) ; a -> d(small, pruned); b -> e (both)."""
    t = DraftTree.new(100, 32)
    a, _ = add_child(t, 0, 1, math.log(.9), SMALL, 1)
    d, _ = add_child(t, a, 4, math.log(.01), SMALL, 2)
    t.graft_site[[0, a]] = True
    b, _ = add_child(t, 0, 2, math.log(.5), MID, 3)
    c, _ = add_child(t, a, 3, math.log(.8), MID, 3)
    e, _ = add_child(t, b, 5, math.log(.4), MID, 3)
    add_child(t, b, 5, math.log(.6), SMALL, 4)  # confirmation: e proposed by both
    prune(t, 4)  # drops d (lowest score)
    steps = [StepTrace(1, "small", pool=[0], frontier=[0], added=[a], n_k=1, draft_s=.001, margin=-0.2),
             StepTrace(2, "small", pool=[a], frontier=[a], added=[d], n_k=1, draft_s=.001, margin=-0.1),
             StepTrace(3, "mid", pool=[0, a, d], frontier=[0, a], added=[b, c, e], n_k=1, reselect_rate=0.5,
                       draft_s=.02, margin=0.3),
             StepTrace(4, "small", pool=[b, c, e], frontier=[b], confirmed=[e], n_k=3, draft_s=.001, margin=-0.3)]
    return RoundTrace(index=0, prefix_len=10, tree=TreeSnapshot.of(t), bonus_token=9, steps=steps,
                      accepted_path=[0, a, c], accepted_tokens=[1, 3], draft_s=.03, verify_s=.05, commit_s=.001,
                      wall_s=.081), (a, b, c, d, e)


def trace_names(fig):
    return {tr.name: tr for tr in fig.data}


def points(tr) -> int:
    return sum(x is not None for x in tr.x)


def test_kept_view_counts_colours_and_accepted_path():
    rt, (a, b, c, d, e) = hand_round()
    fig = tree_figure(rt, STRINGS, show="kept")
    tr = trace_names(fig)
    assert points(tr["small drafter (n-gram)"]) == 1  # a
    assert points(tr["mid drafter"]) == 2  # b, c
    assert points(tr["proposed by both drafters"]) == 1  # e
    assert points(tr["pruned (not verified)"]) == 0  # kept view hides d (legend entry stays)
    assert list(tr["mid drafter"].marker.color) == [COLORS["mid"]] * 2
    assert points(tr["accepted path"]) == 3 and tr["bonus token (from the target)"].text == ("!",)
    assert points(tr["graft site (mid frontier)"]) == 2


def test_all_view_shows_pruned_nodes_hollow():
    rt, (a, b, c, d, e) = hand_round()
    tr = trace_names(tree_figure(rt, STRINGS, show="all"))
    pruned = tr["pruned (not verified)"]
    assert len(pruned.x) == 1 and pruned.marker.symbol == "circle-open" and pruned.marker.opacity < 1


def frame(fig, name):
    """A frame's traces by name (frames are plain dicts in the figure's meta)."""
    f = next(f for f in fig.layout.meta["tg"]["frames"] if f["name"] == name)
    return {t["name"]: SimpleNamespace(**t) for t in f["data"]}, f["layout"]["title"]["text"]


def test_step_frames_show_the_tree_as_it_grew():
    rt, (a, b, c, d, e) = hand_round()
    fig = tree_figure(rt, STRINGS, show="all")
    tr, title = frame(fig, "2 small adds")
    assert sum(points(t) for n, t in tr.items() if n in ("root (last committed token)", "small drafter (n-gram)")) == 3
    assert points(tr["accepted path"]) == 0 and points(tr["mid drafter"]) == 0
    assert points(tr["pruned (not verified)"]) == 0  # not pruned yet while drafting
    assert points(tr["frontier of the step"]) == 1 and points(tr["added by the step"]) == 1
    assert "small step 2: the n-gram drafter added 1 node" in title
    tr, title = frame(fig, "3 frontier")
    assert points(tr["graft site (mid frontier)"]) == 2 and points(tr["pool of the step"]) == 3
    assert "mid step 3: re-scored 3 unvisited nodes, picked 2 graft sites" in title


def test_overwritten_nodes_are_marked():
    t = DraftTree.new(100, 16)
    a, _ = add_child(t, 0, 1, -0.1, SMALL, 1)
    c, _ = add_child(t, a, 3, -0.1, SMALL, 2)
    removed = delete_subtree(t, a)
    add_child(t, a, 6, -0.2, MID, 3)
    prune(t, 8)
    steps = [StepTrace(1, "small", pool=[0], frontier=[0], added=[a], n_k=1),
             StepTrace(2, "small", pool=[a], frontier=[a], added=[c], n_k=1),
             StepTrace(3, "mid", pool=[a, c], frontier=[a], added=[3], removed=removed, n_k=1, reselect_rate=0.0)]
    rt = RoundTrace(index=0, prefix_len=5, tree=TreeSnapshot.of(t), bonus_token=9, steps=steps)
    fig = tree_figure(rt, STRINGS, show="all")
    assert points(trace_names(fig)["overwritten (w/o ND)"]) == 1
    assert points(frame(fig, "2 small adds")[0]["overwritten (w/o ND)"]) == 0
    tr, title = frame(fig, "3 mid adds")
    assert points(tr["overwritten (w/o ND)"]) == 1 and "overwrote 1 node (w/o ND)" in title


def test_legend_explains_every_encoding():
    rt, _ = hand_round()
    fig = tree_figure(rt, STRINGS, show="all")
    for names in ({tr.name for tr in tree_figure(rt, STRINGS, show="kept").data if tr.showlegend is not False},
                  {tr.name for tr in fig.data if tr.showlegend is not False},
                  set(frame(fig, "1 pool")[0])):
        assert {"root (last committed token)", "small drafter (n-gram)", "mid drafter", "proposed by both drafters",
                "pruned (not verified)", "overwritten (w/o ND)", "graft site (mid frontier)", "accepted path",
                "bonus token (from the target)"} <= names


def test_margin_trace_marks_calls_and_threshold():
    rt, _ = hand_round()
    fig = margin_figure([rt, rt])
    tr = trace_names(fig)
    assert len(tr["mid called"].x) == 2 and len(tr["small step"].x) == 6
    assert "mid-call rate 25%" in fig.layout.title.text
    assert any(s.y0 == 0 for s in fig.layout.shapes)


def test_yield_gate_margin_reads_in_tokens_per_second_per_round():
    """The gate decides step 1 only: its margin (tokens per ms) is drawn per round, in tokens per second."""
    rounds = []
    for i, (m, act) in enumerate([(None, "mid"), (0.004, "mid"), (-0.002, "small"), (-0.003, "small")]):
        steps = [StepTrace(1, act, margin=m, decided_by="yield" if m is not None else "")]
        steps += [StepTrace(k, "small") for k in (2, 3)]
        rounds.append(RoundTrace(index=i, prefix_len=10 + i, tree=hand_round()[0].tree, bonus_token=5, steps=steps))
    fig = margin_figure(rounds)
    tr = trace_names(fig)
    assert list(tr["yield bound"].y) == [4.0, -2.0, -3.0] and len(tr["mid called"].x) == 1
    assert "tokens/s" in fig.layout.title.text and "33% of rounds" in fig.layout.title.text


def test_speedups_counters_and_output_segments():
    runs = {"ar": {"wall_s": 2.0, "tokens": 10, "done": True, "new_tokens": list(range(10))},
            "treegraft": {"wall_s": 1.0, "tokens": 10, "done": True, "mean_accepted": 1.5, "rounds": 4,
                          "new_tokens": list(range(10))},
            "all-small": {"wall_s": 0.5, "tokens": 4, "done": True, "new_tokens": [0, 1, 9, 9]}}
    bar = speedup_figure(runs).data[0]
    # time per token: AR 200 ms, treegraft 100 ms, all-small 125 ms (fewer tokens, not a 4x speedup)
    assert list(bar.y) == [2.0, 1.6] and list(bar.x) == ["treegraft", "all-small"]
    html = counters_html(runs, ["treegraft", "ar", "all-small", "all-mid"], "float32")
    assert "2.00x" in html and "1.60x" in html and "queued" in html
    assert ">identical</td>" in html and ">first 2 of 10</td>" in html
    assert "identical to AR" in html
    assert "may differ" in counters_html(runs, ["treegraft", "ar"], "bfloat16")


def test_every_row_is_timed_undrawn_in_an_order_that_rotates():
    from ui.app_blocks import compare_order
    from ui.generation import timing_order

    order = compare_order("treegraft", True)
    assert order == ["treegraft", "ar", "all-small", "all-mid"]
    runs = [timing_order(order) for _ in range(4)]
    assert all(sorted(r) == sorted(order) for r in runs)  # the chosen method is timed again too
    assert len({tuple(r) for r in runs}) == 4
    assert compare_order("all-small", True) == ["all-small", "ar", "all-mid"]
    assert compare_order("fixed", False) == ["fixed"] and timing_order(["fixed"]) == []


def test_a_run_drawn_live_is_shown_but_never_compared():
    runs = {"ar": {"wall_s": 2.0, "tokens": 10, "done": True, "new_tokens": list(range(10))},
            "treegraft": {"wall_s": 3.0, "tokens": 10, "done": True, "drawn": True, "new_tokens": list(range(10))}}
    html = counters_html(runs, ["treegraft", "ar"], "float32")
    assert "<b>treegraft</b> <i>(drawn live)</i>" in html and "id='speedup-treegraft'>-<" in html
    assert speedup_figure(runs).data == ()  # no bar for it
    runs["treegraft"] = {**runs["treegraft"], "wall_s": 1.0, "drawn": False}  # its undrawn timed run
    assert "id='speedup-treegraft'>2.00x<" in counters_html(runs, ["treegraft", "ar"], "float32")
    alone = counters_html({"treegraft": {**runs["treegraft"], "drawn": True}}, ["treegraft"], "float32")
    assert "drawn live" in alone and "without drawing" in alone
    recorded = counters_html({"treegraft": runs["treegraft"]}, ["treegraft"], "float32")  # a gallery trace
    assert "as it was recorded" in recorded and "drawn live" not in recorded


def test_output_segments_by_drafter():
    rt, _ = hand_round()
    assert output_segments([rt], STRINGS) == [(" a", "draft: small"), (" c", "draft: mid"), ("!", "bonus (target)")]


def result_with(rt):
    return GenerationResult("p", "fixed", 10, [1, 3, 9], "x", 1.0, 0.1, "float32", "cpu", {}, [rt], STRINGS)


def test_trace_round_trip_and_validation(tmp_path):
    rt, _ = hand_round()
    f = tmp_path / "t.json"
    f.write_text(dumps(result_with(rt)))
    res = load_trace(f)
    assert res.rounds[0].tree.token == rt.tree.token and res.token_strings[9] == "!"
    data = json.loads(f.read_text())
    bad = json.loads(json.dumps(data))
    bad["round_traces"][0]["tree"]["parent"][2] = 7
    with pytest.raises(TraceError, match="parent must be an earlier node"):
        parse_trace(bad)
    with pytest.raises(TraceError, match="version"):
        parse_trace({"hello": 1})
    f.write_bytes(b"\x80\x81 not json")
    with pytest.raises(TraceError, match="not a JSON trace"):
        load_trace(f)


def test_cost_figure_shows_the_hosts_curve_floor_and_b_ver():
    from ui.charts import cost_figure

    host = {"verify_ms": {"1": 100.0, "2": 101.0, "4": 103.0, "8": 112.0, "16": 170.0}, "memory_floor_ms": 37.0,
            "row_ms": 9.0, "b_ver": 7, "threads": 2}
    fig = cost_figure(host)
    curve = fig.data[0]
    assert list(curve.x) == [1, 2, 4, 8, 16] and list(curve.y) == [100.0, 101.0, 103.0, 112.0, 170.0]
    shapes = {(s.type, s.y0 if s.y0 == s.y1 else s.x0) for s in fig.layout.shapes}
    assert ("line", 100.0) in shapes and ("line", 37.0) in shapes and ("line", 8) in shapes  # T(1), floor, B_ver + root
    assert "T(8) = 1.12 x T(1)" in fig.layout.title.text
    empty = cost_figure({})
    assert not empty.data and "not measured" in empty.layout.title.text


def test_round_views_follow_the_presentation_checkbox_not_a_stale_state():
    """A round opened while presentation mode was toggled (its state still saying 'normal') is drawn in the
    checkbox's style, so a round click racing the toggle cannot shrink the tree back."""
    import gradio as gr

    from ui import view as v
    from ui.app_blocks import on_plot_click, open_round, place, set_show
    from ui.runtime import Runtime
    from ui.style import NORMAL, PRESENT

    res = GenerationResult(pair="default", method="treegraft", prompt_tokens=10, new_tokens=[1, 3, 9], text=" a c!",
                           wall_s=.1, prefill_s=.01, dtype="float32", device="cpu", settings={},
                           rounds=[hand_round()[0]], token_strings=STRINGS)
    runtime = Runtime()
    with gr.Blocks():
        app = place(runtime, runtime.statuses())
    run, stale = app.run, v.replay_view(res)  # stale: present=False
    for out in (open_round(run)(stale, 1, True), set_show(run)(stale, "all", True),
                on_plot_click(run, app.compare)("timeline-plot:1:0", "", "", stale, True)):
        assert out[run.state].present and out[run.tree_plot].layout.height >= PRESENT.tree_height
    out = open_round(run)(replace(stale, present=True), 1, False)
    assert not out[run.state].present and out[run.tree_plot].layout.height < PRESENT.tree_height
    assert NORMAL.tree_height < PRESENT.tree_height
