"""The app's components, grouped, and the updates each group returns, keyed by component.

Each group places its components (inside the caller's Blocks context) and turns a View into a
{component: value or gr.update} dict; the values come from ui/view.py's pure functions.
"""
from __future__ import annotations

import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

import gradio as gr

from treegraft.trace import GenerationResult, dumps

from . import view as v
from .charts import OUTPUT_COLORS
from .gallery import entries
from .generation import METHOD_CHOICES
from .style import COMPARE_LABEL_WIDTH, style_of
from .timeline import timeline_figure
from .tree_figure import latest_drafting_round, tree_figure, write_html

HIDE_PRESENT = "tg-hide-present"  # components folded away in presentation mode


@dataclass
class Controls:
    """The Generate button's inputs (API order), the buttons, and the status line."""

    prompt: gr.Textbox
    pair: gr.Dropdown
    method: gr.Radio
    schedule: gr.Textbox
    no_eg: gr.Checkbox
    no_nd: gr.Checkbox
    paper_scores: gr.Checkbox
    max_new: gr.Slider
    temperature: gr.Slider
    seed: gr.Number
    depth: gr.Slider
    width: gr.Slider
    budget: gr.Slider
    adaptive: gr.Checkbox
    compare: gr.Checkbox
    corpus: gr.Checkbox
    paper_pools: gr.Checkbox
    paper_scheduler: gr.Checkbox
    depth_gate: gr.Checkbox
    go_btn: gr.Button
    stop_btn: gr.Button

    def inputs(self) -> list:
        return [self.prompt, self.pair, self.method, self.schedule, self.no_eg, self.no_nd, self.paper_scores,
                self.max_new, self.temperature, self.seed, self.depth, self.width, self.budget, self.adaptive,
                self.compare, self.corpus, self.paper_pools, self.paper_scheduler, self.depth_gate]

    @classmethod
    def place(cls, examples: list[str], pair_choices, default_pair: str, drafting) -> "Controls":
        prompt = gr.Textbox(label="Prompt", lines=5, elem_id="prompt")
        gr.Examples(examples, inputs=prompt, label="Examples (one per category)")
        pair = gr.Dropdown(pair_choices, value=default_pair, label="Model pair (models.yaml)", elem_id="pair")
        method = gr.Radio(METHOD_CHOICES, value="treegraft", label="Method", elem_id="method")
        schedule = gr.Textbox(value="1,0,1,0,1", label="Fixed schedule (1 = mid step)", elem_id="schedule")
        with gr.Row():
            no_eg = gr.Checkbox(label="w/o EG (ablation)", elem_id="no-eg")
            no_nd = gr.Checkbox(label="w/o ND (ablation)", elem_id="no-nd")
            paper_scores = gr.Checkbox(label="Paper scores (a mid score replaces the n-gram's)",
                                       value=drafting.scores == "paper", elem_id="paper-scores")
            paper_scheduler = gr.Checkbox(label="Paper scheduler (TreeGraft: g_psi at every step, not step 1 by "
                                                "the measured yield)", value=drafting.mid_gate == "off",
                                          elem_id="paper-scheduler")
        max_new = gr.Slider(1, 512, value=64, step=1, label="Max new tokens", elem_id="max-new")
        temperature = gr.Slider(0.0, 2.0, value=0.0, step=0.05, label="Temperature (0 = greedy)")
        seed = gr.Number(value=0, precision=0, label="Seed")
        with gr.Accordion("Tree settings", open=False):
            depth = gr.Slider(1, 8, value=drafting.depth, step=1, label="D: draft steps per round")
            depth_gate = gr.Checkbox(value=drafting.depth_gate == "yield", elem_id="depth-gate",
                                     label="Depth gate: a round takes only the steps (of D) whose nodes have paid for "
                                           "their time in this request, and all D every few rounds")
            width = gr.Slider(1, 16, value=drafting.width, step=1, label="W: frontier width")
            budget = gr.Slider(1, 127, value=drafting.budget, step=1, label="B_ver: nodes verified per round")
            adaptive = gr.Checkbox(value=drafting.adaptive_budget,
                                   label="Adaptive B_ver: verify only the nodes that pay for their time "
                                         "(0 = a plain decoding step; dropped nodes show as pruned)")
            corpus = gr.Checkbox(value=drafting.corpus, elem_id="corpus",
                                 label="The n-gram drafter also reads the target's earlier answers (the pair's "
                                       "corpus, where it has one), not only this prompt and reply")
            paper_pools = gr.Checkbox(value=drafting.small_pool == "paper" and drafting.expand == "all",
                                      elem_id="paper-pools",
                                      label="Paper's pools (ablation): a small step extends only the last step's "
                                            "nodes, and a step expands its whole pool, not only the nodes the "
                                            "prune to B_ver could keep")
        compare = gr.Checkbox(value=True, label="Also run AR, All-Small and All-Mid for the counters")
        with gr.Row():
            go_btn = gr.Button("Generate", variant="primary", elem_id="generate")
            stop_btn = gr.Button("Stop", elem_id="stop")
        return cls(prompt, pair, method, schedule, no_eg, no_nd, paper_scores, max_new, temperature, seed, depth,
                   width, budget, adaptive, compare, corpus, paper_pools, paper_scheduler, depth_gate, go_btn,
                   stop_btn)


@dataclass
class RunPanel:
    """The shown run: tree (animated), round slider, timeline, counters, charts, output, files."""

    status: gr.Markdown
    tree_plot: gr.Plot
    round_slider: gr.Slider
    show: gr.Radio
    caption: gr.Markdown
    timeline_plot: gr.Plot
    counters: gr.HTML
    speed_plot: gr.Plot
    margin_plot: gr.Plot
    output: gr.HighlightedText
    trace_dl: gr.File
    fig_dl: gr.File
    state: gr.State
    cost_plot: gr.Plot

    @classmethod
    def place(cls, state: gr.State, status: gr.Markdown) -> "RunPanel":
        tree_plot = gr.Plot(show_label=False, elem_id="tree-plot")
        with gr.Row(elem_classes=[HIDE_PRESENT]):
            round_slider = gr.Slider(1, 2, value=1, step=1, label="Round (arrow keys scrub once focused)",
                                     elem_id="round-slider")
            show = gr.Radio(["all", "kept"], value="all", label="Nodes (all: pruned drawn hollow)", elem_id="show")
        caption = gr.Markdown(elem_id="step-caption", elem_classes=[HIDE_PRESENT])
        timeline_plot = gr.Plot(show_label=False, elem_id="timeline-plot")
        counters = gr.HTML(elem_id="counters")
        with gr.Row(elem_classes=[HIDE_PRESENT]):
            speed_plot = gr.Plot(show_label=False, elem_id="speedup-plot")
            margin_plot = gr.Plot(show_label=False, elem_id="margin-plot")
            cost_plot = gr.Plot(show_label=False, elem_id="cost-plot")
        output = gr.HighlightedText(label="Output (accepted draft tokens by drafter; bonus tokens from the target)",
                                    color_map=OUTPUT_COLORS, combine_adjacent=False, show_legend=True,
                                    show_inline_category=False, elem_id="output", elem_classes=[HIDE_PRESENT])
        with gr.Row(elem_classes=[HIDE_PRESENT]):
            trace_dl = gr.File(label="Download the run's trace (JSON)", elem_id="trace-file")
            fig_dl = gr.File(label="Download the tree (HTML, with its animation)", elem_id="figure-file")
        return cls(status, tree_plot, round_slider, show, caption, timeline_plot, counters, speed_plot, margin_plot,
                   output, trace_dl, fig_dl, state, cost_plot)

    def api_outputs(self) -> list:
        """The /generate outputs, in the API's order (status first, counters 5th, output 8th, trace 9th, the host's
        cost curve last)."""
        return [self.status, self.tree_plot, self.round_slider, self.timeline_plot, self.counters, self.speed_plot,
                self.margin_plot, self.output, self.trace_dl, self.fig_dl, self.state, self.caption, self.cost_plot]

    def slider(self, view: v.View) -> gr.Slider:
        n = len(view.result.rounds) if view.result else 0
        shown = v.current_round(view)
        return gr.Slider(minimum=1, maximum=max(n, 2), value=shown.index + 1 if shown else 1, step=1)

    def round_view(self, view: v.View) -> dict:
        """The shown round: its tree, caption, slider position and the timeline's outline."""
        return {self.tree_plot: v.tree_value(view), self.caption: v.round_caption(view),
                self.round_slider: self.slider(view), self.timeline_plot: v.timeline_value(view), self.state: view}

    def live(self, view: v.View) -> dict:
        n = len(view.result.rounds)
        return {self.status: f"Round {n}...", self.tree_plot: v.tree_value(replace_round(view, n), animate=False),
                self.round_slider: gr.Slider(minimum=1, maximum=max(n, 2), value=n, step=1),
                self.timeline_plot: v.timeline_value(replace_round(view, n)), self.counters: v.counters_value(view),
                self.speed_plot: v.speed_value(view), self.margin_plot: v.margin_value(view),
                self.output: v.output_value(view), self.state: view}

    def final(self, view: v.View, status: str) -> dict:
        """Everything, for a finished (or loaded) trace."""
        notes = "".join(f"  \nNote: {x}" for x in view.result.notes) if view.result and view.result.notes else ""
        return {**self.round_view(view), self.status: status + notes, self.counters: v.counters_value(view),
                self.speed_plot: v.speed_value(view), self.margin_plot: v.margin_value(view),
                self.output: v.output_value(view), self.cost_plot: v.cost_value(view)}

    def counters_update(self, view: v.View, status: str, with_files: bool = False) -> dict:
        """After each compared method: the counters (and at the end the files), the tree untouched."""
        out = {self.status: status, self.counters: v.counters_value(view), self.speed_plot: v.speed_value(view),
               self.output: v.output_value(view), self.state: view}
        if with_files and view.result:
            out[self.trace_dl] = gr.File(value=trace_file(view.result))
            out[self.fig_dl] = gr.File(value=figure_file(view))
        return out

    def restyle(self, view: v.View) -> dict:
        """Presentation mode on or off: the figures again at the new size."""
        out = {self.tree_plot: v.tree_value(view), self.timeline_plot: v.timeline_value(view), self.state: view}
        if view.result:
            out.update({self.speed_plot: v.speed_value(view), self.margin_plot: v.margin_value(view),
                        self.cost_plot: v.cost_value(view)})
        return out


def replace_round(view: v.View, n: int) -> v.View:
    return v.with_round(view, n)


def trace_file(res: GenerationResult) -> str:
    path = Path(tempfile.mkdtemp(prefix="treegraft-")) / "treegraft-trace.json"
    path.write_text(dumps(res))
    return str(path)


def figure_file(view: v.View) -> str:
    rt = v.current_round(view)
    path = Path(tempfile.mkdtemp(prefix="treegraft-")) / f"treegraft-round-{rt.index + 1}.html"
    write_html(tree_figure(rt, view.result.token_strings, show="all"), str(path))
    return str(path)


@dataclass
class GalleryPanel:
    """Recorded traces (one click loads one, no model needed) and the upload of a saved trace."""

    pick: gr.Radio
    upload: gr.File

    @classmethod
    def place(cls) -> "GalleryPanel":
        names = [e.name for e in entries()]
        pick = gr.Radio(names, value=None, label="Gallery: recorded runs of the default pair (one click, no models)",
                        elem_id="gallery")
        upload = gr.File(label="Replay a saved trace (no models needed)", file_types=[".json"], elem_id="trace-upload")
        return cls(pick, upload)


THIS_RUN = "this session's run"


@dataclass
class ComparePanel:
    """Two traces side by side: trees, timelines, counters."""

    a: gr.Dropdown
    b: gr.Dropdown
    tree_a: gr.Plot
    tree_b: gr.Plot
    timeline_a: gr.Plot
    timeline_b: gr.Plot
    table: gr.HTML

    @classmethod
    def place(cls) -> "ComparePanel":
        names = [e.name for e in entries()] + [THIS_RUN]
        first = next((n for n in names if n.endswith(": fixed")), names[0])
        second = next((n for n in names if n.endswith("w/o ND")), names[min(1, len(names) - 1)])
        with gr.Row():
            a = gr.Dropdown(names, value=first, label="Left", elem_id="compare-a")
            b = gr.Dropdown(names, value=second, label="Right", elem_id="compare-b")
        with gr.Row():
            with gr.Column():
                tree_a = gr.Plot(show_label=False, elem_id="compare-tree-a")
                timeline_a = gr.Plot(show_label=False, elem_id="compare-timeline-a")
            with gr.Column():
                tree_b = gr.Plot(show_label=False, elem_id="compare-tree-b")
                timeline_b = gr.Plot(show_label=False, elem_id="compare-timeline-b")
        table = gr.HTML(elem_id="compare-counters")
        return cls(a, b, tree_a, tree_b, timeline_a, timeline_b, table)

    def side(self, which: str, res: GenerationResult | None, round_no: int, present: bool) -> dict:
        tree, timeline = (self.tree_a, self.timeline_a) if which == "a" else (self.tree_b, self.timeline_b)
        if res is None or not res.rounds:
            return {tree: None, timeline: None}
        n = round_no or latest_drafting_round(res.rounds)
        rt = res.rounds[min(max(n, 1), len(res.rounds)) - 1]
        style = style_of(present)
        side_style = replace(style, wrap=style.wrap * 2 // 3, label_width=COMPARE_LABEL_WIDTH)
        return {tree: tree_figure(rt, res.token_strings, style=side_style, legend=False,
                                  title=f"{res.method}, round {rt.index + 1}"),
                timeline: timeline_figure(res.rounds, v.limit_of(res), rt.index + 1, style,
                                          title=f"{res.method}: {len(res.rounds)} rounds (click a bar)")}
