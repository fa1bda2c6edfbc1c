"""Where a verification forward's time goes, by tree size: the default pair's target verifying chains of 1 / 4 / 8 / 12
/ 16 tokens on the prefilled caches of the bench suite's first prompt of four categories (the calibration's probe
trees, `prune.probe_chain`), each size 20 times after 3 warm-ups, the lead rows those of the chain up to 8; medians
(ms) of the whole forward, of the decoder layers' Linear products (every routed call timed as it runs), of the
attention calls (`treegraft_sdpa`), of the output head's calls (root + lead rows), and the rest (norms, rotary,
activation, residual adds, cache appends, Python). Run alone on the host (it times forwards).

    PYTHONPATH=. HF_HUB_OFFLINE=1 .venv/bin/python scripts/verify_parts.py
"""
import time

import numpy as np
import torch
from transformers import AttentionInterface

from treegraft import attention
from treegraft.config import DEFAULT_MODELS_YAML, load_pair
from treegraft.engine import Engine
from treegraft.models import load_pair_models
from treegraft.prompts import load_prompts, select
from treegraft.prune import probe_chain

PARTS = ("linear", "attention", "head")
spent = dict.fromkeys(PARTS, 0.0)


def timing(fn, part: str):
    def call(*args, **kwargs):
        t0 = time.perf_counter()
        out = fn(*args, **kwargs)
        spent[part] += time.perf_counter() - t0
        return out
    return call


def main() -> None:
    AttentionInterface.register(attention.NAME, timing(attention.packed_gqa_attention, "attention"))
    pair = load_pair("default", DEFAULT_MODELS_YAML)
    engine = Engine(load_pair_models(pair, "float32"))
    target = engine.target
    for m in target.model.model.layers.modules():
        if isinstance(m, torch.nn.Linear):
            m.forward = timing(m.forward, "linear")
    head = target.model.get_output_embeddings()
    head.forward = timing(head.forward, "head")
    table: dict[int, list[list[float]]] = {}
    for p in select(load_prompts("bench"), per_category=1)[:4]:
        ids = engine.encode(p.messages)
        target.start(ids)
        for n in (0, 3, 7, 11, 15):  # non-root nodes: a chain of n + 1 tokens with the root
            chain = probe_chain(ids[-1], n)
            nodes, lead = np.arange(n + 1), list(range(1, min(n, 8) + 1))
            for i in range(23):
                for part in PARTS:
                    spent[part] = 0.0
                t0 = time.perf_counter()
                target.verify(chain, nodes, lead)
                wall = time.perf_counter() - t0
                target.rollback()
                if i >= 3:  # the first three warm up
                    table.setdefault(n + 1, []).append([wall] + [spent[part] for part in PARTS])
    print("tokens  forward  linears  attention  head  rest (ms, medians)")
    for n, samples in table.items():
        wall, lin, att, hd = (1000 * np.median(np.array(samples), axis=0)).tolist()
        print(f"{n:6d} {wall:8.2f} {lin:8.2f} {att:10.2f} {hd:5.2f} {wall - lin - att - hd:5.2f}")


if __name__ == "__main__":
    main()
