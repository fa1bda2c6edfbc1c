"""The benchmark command end to end on a tiny setting: all three files, every field, exact outputs."""
import json

import numpy as np
import pytest

from treegraft.cli import main

ROW_FIELDS = {"prompt_id", "category", "method", "new_tokens", "wall_s", "rounds", "mean_accepted",
              "tokens_per_round", "tokens_per_s", "draft_s", "verify_s", "mid_calls", "sched_s", "speedup", "decode_speedup",
              "exact", "mid_pool", "mid_nk", "reselect_rate"}
SUMMARY_FIELDS = {"speedup", "speedup_ci95", "decode_speedup", "mid_ms_per_call", "mean_accepted", "tokens_per_round", "tokens_per_s", "draft_share", "verify_share",
                  "mid_calls_per_round", "mid_call_rate_per_step", "sched_ms_per_step", "mid_pool",
                  "pool_over_nk", "reselect_rate", "exact_rate"}


def test_bench_tiny_run_writes_everything(tmp_path, capsys):
    out = tmp_path / "bench"
    methods = "ar,all-small,all-small:span=0,all-mid,fixed,csd,treegraft,treegraft:no-eg,treegraft:no-nd,hf-pld"
    assert main(["bench", "--methods", methods, "--suite", "default", "--limit", "2", "--max-new-tokens", "8",
                 "--dtype", "float32", "--out", str(out), "--json", "--no-png"]) == 0
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert set(printed["overall"]) == set(methods.split(","))
    data = json.loads((out / "results.json").read_text())
    assert len(data["rows"]) == 2 * len(methods.split(","))
    for row in data["rows"]:
        assert ROW_FIELDS <= set(row), ROW_FIELDS - set(row)
        assert row["exact"], (row["method"], row["prompt_id"])  # greedy: every method equals AR, CSD included
    for method, cats in data["summary"]["overall"].items():
        assert SUMMARY_FIELDS <= set(cats["all"])
    assert data["summary"]["overall"]["ar"]["all"]["speedup"] == 1.0
    for method, cats in data["summary"]["overall"].items():  # a 95% bootstrap interval around each mean speedup
        lo, hi = cats["all"]["speedup_ci95"]
        assert lo <= cats["all"]["speedup"] <= hi
    assert (out / "results.csv").read_text().count("\n") == len(data["rows"]) + 1
    report = (out / "report.md").read_text()
    assert "| csd |" in report and "Speedup over AR per category" in report
    assert "Where a round's time goes" in report and "bookkeeping share" in report
    assert "## Mid step cost" in report and data["summary"]["overall"]["all-mid"]["all"]["mid_ms_per_call"] > 0
    for method in ("all-small", "treegraft", "csd"):  # the overhead profile of the engine's methods
        s = data["summary"]["overall"][method]["all"]
        assert s["profile_ms_per_round"]["target_forward"] > 0 and 0 < s["overhead_share"] < 1


def test_bench_runs_hf_assisted_on_the_lm_pair(tmp_path, capsys):
    out = tmp_path / "bench-lm"
    assert main(["bench", "--pair", "smollm2-lm", "--methods", "ar,hf-assisted,all-mid,all-mid@default", "--suite", "default",
                 "--limit", "1", "--max-new-tokens", "8", "--dtype", "float32", "--out", str(out), "--json",
                 "--no-png"]) == 0
    capsys.readouterr()
    data = json.loads((out / "results.json").read_text())
    rows = {r["method"]: r for r in data["rows"]}
    assert set(rows) == {"ar", "hf-assisted", "all-mid", "all-mid@default"}  # two mids side by side
    assert all(r["exact"] for r in rows.values()) and rows["hf-assisted"]["wall_s"] > 0


def test_bench_isolates_methods_and_reports_statistics(engine):
    """Every timed generation starts from the same calibrated engine state, whichever method ran before it;
    peers show no per-round figures; per-category intervals and mid-call rates are in the report."""
    from treegraft.bench import parse_methods, report, run_bench, summarise
    from treegraft.config import GenerationConfig, load_pair
    from treegraft.prompts import load_prompts, select

    pair = load_pair("default")
    methods = parse_methods("ar,all-mid,treegraft,all-small,hf-pld", pair.drafting)
    prompts = select(load_prompts("bench"), per_category=1, limit=2)
    seen = []
    real = engine.generate

    def watched(*args, **kwargs):
        p = engine.pruner
        seen.append((sorted(p.verify_cost.ms.items()), p.acceptance.hits.tolist(), sorted(engine.timing_ms.items())))
        return real(*args, **kwargs)

    engine.generate = watched
    try:
        rows = run_bench(engine, prompts, methods, GenerationConfig(max_new_tokens=8), repeats=2, progress=False)
    finally:
        del engine.generate
    timed = seen[len(methods):]  # after the warm-ups
    assert len(timed) == len(prompts) * len(methods) * 2 and all(s == timed[0] for s in timed)
    assert all(r["exact"] for r in rows)
    from treegraft.bench import paired

    summary = {"overall": summarise(rows), "per_category": summarise(rows, "category"), "paired": paired(rows)}
    by = {(r["method"], r["prompt_id"], r["repeat"]): r for r in rows}
    after = [(b["wall_s"] - b["prefill_s"]) / (r["wall_s"] - r["prefill_s"])  # after the prefill, per prompt and repeat
             for (m, *k), r in by.items() if m == "treegraft" for b in [by[("all-small", *k)]]]
    tg = summary["paired"]["treegraft / all-small"]
    assert tg["all"]["n"] == len(after) == 2 * len(prompts) and abs(tg["all"]["decode"] - np.mean(after)) < 1e-12
    assert set(summary["paired"]) == {f"{m} / {b}" for m in ("treegraft", "hf-pld", "all-mid", "all-small")
                                      for b in ("all-small", "all-mid") if m != b} - {"all-small / all-mid"}
    assert all(r["decode_speedup"] > 0 for r in rows)
    pld = summary["overall"]["hf-pld"]["all"]
    assert pld["mean_accepted"] is None and pld["mid_calls_per_round"] is None and pld["speedup"] > 0
    assert summary["overall"]["all-small"]["all"]["pool_over_nk"] is None  # no mid step: no ratio
    assert summary["overall"]["all-mid"]["all"]["mid_call_rate_per_step"] == 1.0
    for cat in summary["per_category"]["treegraft"].values():
        assert cat["speedup_ci95"] is not None and 0 <= cat["mid_call_rate_per_step"] <= 1
    from treegraft.bench import kernel_paths, runtime

    meta = {"pair": "default", "command": "test", "machine": "here", "dtype": "float32", "prompts": 2,
            "max_new_tokens": 8, "repeats": 2, "date": "today", "kernels": kernel_paths(engine),
            "runtime": runtime(engine)}
    assert {"target layers", "target head", "mid layers", "mid rows"} <= set(meta["kernels"])  # as measured at load
    text = report(summary, meta)
    assert "## CPU paths chosen at load" in text
    threads = meta["runtime"]["packed_threads"] or "none (not built)"
    assert f"the packed kernel runs on {threads}; the target's attention: `treegraft_sdpa`" in text
    from treegraft.drafters.fused import fused_unavailable

    head_path = "lean" if fused_unavailable() else "fused"  # the default pair's head, in one C++ call where it builds
    assert meta["runtime"]["head_forward"] == head_path and f"the draft head's forward: `{head_path}`" in text
    rows_line = next(ln for ln in text.splitlines() if ln.startswith("| mid rows (cold) |"))  # timed as a call meets it
    assert next(ln for ln in text.splitlines() if ln.startswith("| target layers |"))
    rows = meta["kernels"]["mid rows"]
    chosen = rows["chosen"][8]
    label = f"packed@{rows['prefetch'][8]}" if chosen == "packed" else chosen  # the kernel with its measured lead
    assert f"{label} {rows['ms'][8][chosen]:.3f}" in rows_line
    assert "## Mid calls per draft step, per category" in text and "## 95% interval of the speedup per category" in text
    assert "| hf-pld | " in text and "1000000000" not in text
    pld_line = next(ln for ln in text.splitlines() if ln.startswith("| hf-pld |"))
    assert pld_line.split("|")[5].strip() == "-"  # mean A does not apply to prompt lookup
    assert "## Paired against each single drafter" in text
    assert f"| treegraft / all-small | {tg['all']['ratio']:.3f}x | " in text


def test_bench_method_suffixes_set_the_tree_shape_and_reject_bad_values():
    from treegraft.bench import parse_methods
    from treegraft.config import ConfigError, DraftingConfig

    base = DraftingConfig()
    ar, small, tg = parse_methods("all-small:d=3:w=4:k=2:span=0,treegraft:cap=2.5:b=15:no-eg:ml=2", base)
    assert ar.spec.name == "ar" and ar.drafting == base  # AR is added, on the bench's own settings
    assert (small.drafting.depth, small.drafting.width, small.drafting.top_k, small.drafting.span_max) == (3, 4, 2, 0)
    assert (tg.drafting.verify_cost_cap, tg.drafting.budget, tg.spec.eg, tg.drafting.mid_lead) == (2.5, 15, False, 2)
    assert small.drafting.ngram_max == base.ngram_max  # what a label does not set stays
    for bad, words in [("all-small:d=0", "depth"), ("all-small:w=x", "width"), ("all-small:cap=0.5", "verify_cost_cap"),
                       ("all-small:zz", "unknown suffix"), ("fixed:s=12", "0/1"), ("treegraft:ml=0", "mid_lead")]:
        with pytest.raises(ConfigError, match=words):
            parse_methods(bad, base)


def test_engines_of_one_target_verify_alike_in_a_bench(fp32_pair, engine):
    """A method run on another pair's engine (@PAIR) with the same target starts every timed generation from the
    bench pair's measured costs (T(n), B_ver, threads), its own acceptance model kept: an A/B of two schedulers or
    mids compares them, not two calibrations."""
    from treegraft.bench import parse_methods, run_bench
    from treegraft.config import GenerationConfig, load_pair
    from treegraft.engine import Engine
    from treegraft.prompts import load_prompts, select

    twin = Engine(fp32_pair)  # the same target: its own calibration would time other probes
    methods = parse_methods("ar,all-small,all-small@twin", load_pair("default").drafting)
    seen = {"main": [], "twin": []}
    for name, e in (("main", engine), ("twin", twin)):
        real = e.generate

        def watched(*args, _e=e, _real=real, _name=name, **kwargs):
            p = _e.pruner
            seen[_name].append((sorted(p.verify_cost.ms.items()), p.host_b, p.threads))
            return _real(*args, **kwargs)

        e.generate = watched
    try:
        rows = run_bench(engine, select(load_prompts("bench"), per_category=1, limit=1), methods,
                         GenerationConfig(max_new_tokens=8), progress=False, others={"twin": twin})
    finally:
        del engine.generate, twin.generate
    assert all(r["exact"] for r in rows)
    main_timed, twin_timed = seen["main"][2:], seen["twin"][1:]  # after the warm-ups (ar and all-small; the twin's)
    assert twin_timed and main_timed[-1][0]  # the twin ran, from a measured curve
    assert all(t == main_timed[-1] for t in twin_timed)
    assert twin.pruner.acceptance is not engine.pruner.acceptance


def test_warm_up_runs_each_method_briefly_and_returns_the_calibrated_state(engine):
    """The scripts' warm-up (bench.warm_up): each method once, 8 new tokens, then the state timed runs restore."""
    from treegraft.bench import warm_up
    from treegraft.config import GenerationConfig, load_pair
    from treegraft.engine import EngineState
    from treegraft.prompts import load_prompts, select

    drafting = load_pair("default").drafting
    ids = engine.encode(select(load_prompts("bench"), per_category=1)[0].messages)
    ran = []
    real = engine.generate

    def watched(prompt_ids, method, *args, **kwargs):
        res = real(prompt_ids, method, *args, **kwargs)
        ran.append((method.name, len(res.new_tokens)))
        return res

    engine.generate = watched
    try:
        state = warm_up(engine, ids, drafting, GenerationConfig(max_new_tokens=64), methods=("ar", "all-small"))
    finally:
        del engine.generate
    assert [name for name, _ in ran] == ["ar", "all-small"] and all(0 < n <= 8 for _, n in ran)
    assert isinstance(state, EngineState) and state.pruner.verify_cost  # T(n) calibrated, off the clock
    assert state.pruner is not engine.pruner  # a frozen copy: later generations do not move it
