#!/usr/bin/env bash
# GPU check (< 5 min): on a machine with an NVIDIA GPU and no network, installs nothing, runs the
# greedy-exactness and tree-attention tests on CUDA (float32) and a short side-by-side benchmark of the
# default pair (bf16 and fp32), and prints the figures. Needs the repo's .venv (or a python with the
# requirements) and the default pair's files (`make install` once, on any machine with the registries).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
export HF_HUB_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1 GRADIO_ANALYTICS_ENABLED=False
OUT=${OUT:-gpu_check_out}
mkdir -p "$OUT"
"$PY" - <<'PY'
import torch
assert torch.cuda.is_available(), "no CUDA GPU visible to torch"
print("GPU:", torch.cuda.get_device_name(0), "| torch", torch.__version__, "| bf16:", torch.cuda.is_bf16_supported())
PY
# the test fixtures load the default pair with device auto -> cuda here
timeout 240 "$PY" -m pytest -q -x tests/test_tree_attention.py tests/test_greedy_exact.py -k "not code-02 and not sum-01" \
    2>&1 | tail -5
for dtype in bfloat16 float32; do
  timeout 150 "$PY" -m treegraft bench --pair default --methods ar,all-small,all-mid,fixed,treegraft \
      --suite bench --limit 6 --max-new-tokens 64 --dtype "$dtype" --out "$OUT/$dtype" --json \
      | tail -1 | "$PY" -c "
import json, sys
d = json.load(sys.stdin)
print('dtype', d['meta']['dtype'], '|', d['meta']['machine']['cuda'])
for m, s in d['overall'].items():
    print(f\"  {m:12s} speedup {s['speedup']:.2f}x  mean A {s['mean_accepted']:.2f}  tok/s {s['tokens_per_s']:.1f}  exact {s['exact_rate']:.2f}\")
"
done
