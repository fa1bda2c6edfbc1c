"""Is a category's low head agreement the head's or the target's? Per category of a prompt suite, on the target's own
greedy answers: how sure the target is of its greedy token (its probability), and the head's depth-1 top-1
agreement within bands of that probability. Where agreement at equal target confidence is level across categories,
a category's lower agreement comes from the target's uncertainty (its answers are less predictable), which more
training data for the head cannot remove.

    PYTHONPATH=. HF_HUB_OFFLINE=1 .venv/bin/python scripts/target_confidence.py [--head models/smollm2-head]
"""
import argparse
from collections import defaultdict
from pathlib import Path

import torch

from treegraft.config import load_pair
from treegraft.distill_head import target_features, unrolled
from treegraft.drafters.head import load_head
from treegraft.models import load_draft_vocab, load_model, load_tokenizer
from treegraft.prompts import chat_ids, load_prompts, select
from treegraft.target import final_part

BANDS = (0.0, 0.3, 0.6, 0.9, 1.01)  # the target's probability of its greedy token


@torch.no_grad()
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pair", default="default")
    ap.add_argument("--head", default=None, help="head folder (default: the pair's)")
    ap.add_argument("--suite", default="bench")
    ap.add_argument("--per-category", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    args = ap.parse_args()
    pair = load_pair(args.pair)
    tok = load_tokenizer(pair.target)
    target = load_model(pair.target, torch.float32, torch.device("cpu"))
    head = load_head(Path(args.head or pair.mid.path), target, torch.float32, torch.device("cpu"))
    vocab = load_draft_vocab(pair.mid, len(tok))
    rows = target.get_output_embeddings().weight[vocab].float()  # [S, H]
    out_w = target.get_output_embeddings().weight.float()  # [V, H]
    stats = defaultdict(lambda: [[0, 0] for _ in BANDS[1:]])  # category -> per band [positions, head hits]
    for p in select(load_prompts(args.suite), args.per_category):
        x = torch.tensor([chat_ids(tok, list(p.messages))])  # [1, n]
        full = target.generate(x, max_new_tokens=args.max_new_tokens, do_sample=False)  # [1, T]
        feats = target_features(target, full, taps=head.taps, dtype=torch.float32)  # [1, T, F]
        probs = (final_part(feats[0], rows.shape[-1]) @ out_w.T).softmax(-1)  # [T, V]: position i -> token i + 1
        greedy_p, greedy = probs.max(-1)  # [T]
        f = unrolled(head, feats, full, 1)[0]  # [1, T, H]: depth 1, position i predicts token i + 1
        n = x.shape[1]
        lo = n - 1
        guess = vocab[(f[0, lo:-1] @ rows.T).argmax(-1)]  # [m]
        hit, conf = (guess == greedy[lo:-1]).tolist(), greedy_p[lo:-1].tolist()
        for h, c in zip(hit, conf):
            b = next(i for i in range(len(BANDS) - 1) if c < BANDS[i + 1])
            stats[p.category][b][0] += 1
            stats[p.category][b][1] += int(h)
    bands = [f"{BANDS[i]:.1f}-{min(BANDS[i + 1], 1.0):.1f}" for i in range(len(BANDS) - 1)]
    print("| category | positions | head top-1 | " + " | ".join(f"p {b}: share, head top-1" for b in bands) + " |")
    print("|---" * (3 + len(bands)) + "|")
    for cat in sorted(stats) + ["all"]:
        per = stats[cat] if cat != "all" else [[sum(stats[c][i][k] for c in stats) for k in (0, 1)]
                                               for i in range(len(bands))]
        total, hits = sum(b[0] for b in per), sum(b[1] for b in per)
        cells = [f"{b[0] / total:.2f}, {b[1] / b[0]:.2f}" if b[0] else "0.00, -" for b in per]
        print(f"| {cat} | {total} | {hits / total:.3f} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
