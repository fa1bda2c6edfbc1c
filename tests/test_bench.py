"""The benchmark command end to end on a tiny setting: all three files, every field, exact outputs."""
import json

from treegraft.cli import main

ROW_FIELDS = {"prompt_id", "category", "method", "new_tokens", "wall_s", "rounds", "mean_accepted",
              "tokens_per_round", "tokens_per_s", "draft_s", "verify_s", "mid_calls", "sched_s", "speedup",
              "exact", "mid_pool", "mid_nk", "reselect_rate"}
SUMMARY_FIELDS = {"speedup", "speedup_ci95", "mid_ms_per_call", "mean_accepted", "tokens_per_round", "tokens_per_s", "draft_share", "verify_share",
                  "mid_calls_per_round", "mid_call_rate_per_step", "sched_ms_per_step", "mid_pool",
                  "pool_over_nk", "reselect_rate", "exact_rate"}


def test_bench_tiny_run_writes_everything(tmp_path, capsys):
    out = tmp_path / "bench"
    methods = "ar,all-small,all-mid,fixed,csd,treegraft,treegraft:no-eg,treegraft:no-nd,hf-pld"
    assert main(["bench", "--methods", methods, "--suite", "default", "--limit", "2", "--max-new-tokens", "8",
                 "--dtype", "float32", "--out", str(out), "--json"]) == 0
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
                 "--limit", "1", "--max-new-tokens", "8", "--dtype", "float32", "--out", str(out), "--json"]) == 0
    capsys.readouterr()
    data = json.loads((out / "results.json").read_text())
    rows = {r["method"]: r for r in data["rows"]}
    assert set(rows) == {"ar", "hf-assisted", "all-mid", "all-mid@default"}  # two mids side by side
    assert all(r["exact"] for r in rows.values()) and rows["hf-assisted"]["wall_s"] > 0
