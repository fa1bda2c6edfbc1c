"""The `generate` command's JSON contract, for every method on the default pair."""
import json
import os
import subprocess
import sys

import pytest

from treegraft.cli import main

FIELDS = {"pair": str, "method": str, "prompt_tokens": int, "new_tokens": list, "text": str, "rounds": int,
          "accepted": list, "wall_s": float, "draft_s": float, "verify_s": float, "mid_calls": int}
PROMPT = "List three colours of the rainbow."


def run_json(capsys, *args):
    assert main(["generate", "--json", "--dtype", "float32", "--max-new-tokens", "12", "--prompt", PROMPT,
                 *args]) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_every_method_prints_the_contract_and_agrees_with_ar(capsys):
    ar = run_json(capsys, "--method", "ar")
    for args in (["--method", "all-small"], ["--method", "all-mid"], ["--method", "fixed"],
                 ["--method", "fixed", "--schedule", "0,1,0,1,1", "--no-eg"], ["--method", "fixed", "--no-nd"],
                 ["--method", "treegraft"], ["--method", "treegraft", "--mid-gate", "off"], ["--method", "oracle"],
                 ["--method", "hf-pld"]):
        out = run_json(capsys, *args)
        for key, typ in FIELDS.items():
            assert isinstance(out[key], typ), (key, out[key])
        assert out["pair"] == "default" and out["method"].startswith(args[1])
        assert out["new_tokens"] == ar["new_tokens"], args
        assert len(out["accepted"]) == out["rounds"]
        if args[1] == "all-small":
            assert out["mid_calls"] == 0
        if args[1] in ("treegraft", "oracle"):
            assert not out["notes"], out["notes"]  # the shipped scheduler is used, no fallback
            gate = out["settings"]["drafting"]["mid_gate"]
            assert gate == ("off" if "off" in args else "yield")  # the pair's, unless set (oracle ignores it)
    assert ar["mid_calls"] == 0 and ar["rounds"] == len(ar["new_tokens"])


def test_real_entry_point_text_mode_and_trace(tmp_path):
    trace = tmp_path / "trace.json"
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-m", "treegraft", "generate", "--method", "fixed", "--max-new-tokens",
                           "8", "--prompt", PROMPT, "--trace", str(trace)], capture_output=True, text=True,
                          env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() and "[fixed]" in proc.stderr
    data = json.loads(trace.read_text())
    assert data["round_traces"] and {"tree", "steps", "accepted_path"} <= set(data["round_traces"][0])


def test_bad_arguments_give_clear_errors(capsys):
    assert main(["generate", "--pair", "nope", "--prompt", "x"]) == 2
    assert "unknown pair 'nope'" in capsys.readouterr().err
    assert main(["generate", "--schedule", "1,2", "--prompt", "x"]) == 2
    assert "--schedule must be comma-separated 0/1" in capsys.readouterr().err
    assert main(["generate", "--budget", "0", "--prompt", "x"]) == 2
    assert "budget" in capsys.readouterr().err


def test_adaptive_budget_switch(capsys):
    for value, want in (("off", False), ("on", True)):
        assert main(["generate", "--method", "all-small", "--adaptive-budget", value, "--max-new-tokens", "4",
                     "--prompt", "Say hi.", "--json"]) == 0
        out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        assert out["settings"]["drafting"]["adaptive_budget"] is want


def test_hf_assisted_through_the_cli(capsys):
    """Assisted generation needs an LM mid: it runs on the LM pair (same target) and is refused, clearly, on
    the default pair's draft head."""
    ar = run_json(capsys, "--method", "ar")
    out = run_json(capsys, "--method", "hf-assisted", "--pair", "smollm2-lm")
    assert out["pair"] == "smollm2-lm" and out["method"] == "hf-assisted"
    assert out["new_tokens"] == ar["new_tokens"] and out["wall_s"] > 0
    assert main(["generate", "--method", "hf-assisted", "--prompt", PROMPT, "--max-new-tokens", "4"]) == 2
    err = capsys.readouterr().err
    assert "hf-assisted needs a causal-LM mid" in err and "smollm2-lm" in err
