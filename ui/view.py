"""What one browser session is looking at (gr.State), and the values its panels show (pure: View in, values out)."""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from treegraft.trace import GenerationResult, RoundTrace

from .charts import cost_figure, counters_html, margin_figure, output_segments, speedup_figure
from .style import style_of
from .timeline import timeline_figure
from .tree_figure import latest_drafting_round, tree_figure


@dataclass
class View:
    """The run being shown, the side-by-side runs of the counters, and how it is shown."""

    result: GenerationResult | None = None
    runs: dict = field(default_factory=dict)
    order: list = field(default_factory=list)
    dtype: str = ""  # the engine's, for the counters' caption
    round_no: int = 0  # 1-based; 0 = the default (the latest round that drafted anything)
    show: str = "all"  # "all" drafted nodes (pruned hollow) or the "kept" (verified) tree
    present: bool = False  # presentation mode: larger figures and text


def run_record(res: GenerationResult, done: bool, drawn: bool = False) -> dict:
    """A counters row. `drawn`: the run was drawn live (its time shared the CPU with its frames: shown, not compared)."""
    s = res.summary()
    return {"wall_s": s["wall_s"], "tokens": len(res.new_tokens), "mean_accepted": s["mean_accepted"],
            "rounds": s["rounds"], "done": done, "drawn": drawn, "new_tokens": list(res.new_tokens)}


def replay_view(res: GenerationResult, old: View | None = None) -> View:
    """A View of a finished trace (loaded, uploaded or from the gallery): its own counters row only."""
    keep = {"show": old.show, "present": old.present} if old else {}
    return View(result=res, runs={res.method: run_record(res, True)}, order=[res.method], dtype=res.dtype, **keep)


def with_round(view: View, round_no) -> View:
    return replace(view, round_no=int(round_no or 0))


def current_round(view: View) -> RoundTrace | None:
    res = view.result
    if res is None or not res.rounds:
        return None
    n = view.round_no or latest_drafting_round(res.rounds)
    return res.rounds[min(max(n, 1), len(res.rounds)) - 1]


def limit_of(res: GenerationResult) -> int | None:
    """The output's length, where the trace is finished (live partial results have no tokens yet)."""
    return len(res.new_tokens) if res.new_tokens else None


def tree_value(view: View, animate: bool = True):
    rt = current_round(view)
    if rt is None:
        return None
    return tree_figure(rt, view.result.token_strings, show=view.show, style=style_of(view.present), animate=animate)


def timeline_value(view: View):
    res = view.result
    if res is None:
        return None
    rt = current_round(view)
    return timeline_figure(res.rounds, limit_of(res), rt.index + 1 if rt else None, style_of(view.present))


def round_caption(view: View) -> str:
    """The shown round, step by step, in one line each."""
    rt = current_round(view)
    if rt is None:
        return ""
    n = len(view.result.rounds)
    lines = [f"**Round {rt.index + 1}** of {n}: A = {rt.accepted}, t_D = {1000 * rt.draft_s:.1f} ms, "
             f"t_V = {1000 * rt.verify_s:.1f} ms. Play the tree (or press space; arrows step) to watch it grow."]
    for s in rt.steps:
        margin = f", margin {s.margin:+.4f}" if s.margin is not None else ""
        resel = f", reselected {s.reselect_rate:.0%}" if s.reselect_rate is not None else ""
        lines.append(f"step {s.k}: **{s.action}**, pool {len(s.pool)}, frontier {len(s.frontier)}, "
                     f"+{len(s.added)} new{resel}{margin}")
    return "  \n".join(lines)


def counters_value(view: View) -> str:
    return counters_html(view.runs, view.order, view.dtype)


def speed_value(view: View, done_only: bool = True):
    runs = {k: v for k, v in view.runs.items() if v.get("done") or not done_only}
    return speedup_figure(runs, style_of(view.present))


def margin_value(view: View):
    return margin_figure(view.result.rounds if view.result else [], style_of(view.present))


def cost_value(view: View):
    res = view.result
    return cost_figure(res.host if res else {}, res.rounds if res else [], style_of(view.present))


def output_value(view: View):
    res = view.result
    return output_segments(res.rounds, res.token_strings, limit=limit_of(res)) if res else []
