"""Drafters: the small n-gram drafter and the two kinds of mid drafter (an LM, or a draft head)."""
from __future__ import annotations


def make_mid_drafter(pair):
    """The mid drafter of a loaded pair: `MidDrafter` (a causal LM) or `HeadDrafter` (a draft head).

    Both offer start(features), begin_round(), evaluate(tree, committed, nodes) -> MidScores,
    end_round(path, features), snapshot() / rollback(state); the engine does not know which it drives."""
    from .head import DraftHead, HeadDrafter
    from .neural import MidDrafter

    from ..models import half_drafter

    small_batch = pair.config.small_batch_linear and pair.device.type == "cpu"  # the scores' few-row products
    half = half_drafter(pair.config, pair.dtype, pair.device)  # its scorer's rows rounded to fp16 too
    if isinstance(pair.mid, DraftHead):
        return HeadDrafter(pair.mid, pair.target.get_output_embeddings().weight, len(pair.tokenizer), pair.mid_vocab,
                           small_batch, half)
    return MidDrafter(pair.mid, len(pair.tokenizer), pair.mid_vocab, small_batch, half)
