"""A tiny Llama pair (vocab 16) built from a config, for vocabulary-level tests (no download)."""
from __future__ import annotations

import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from treegraft.config import ModelSource, PairConfig
from treegraft.models import LoadedPair

VOCAB = 16


def tiny_tokenizer() -> PreTrainedTokenizerFast:
    vocab = {f"t{i}": i for i in range(VOCAB)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok)


def tiny_model(seed: int, layers: int = 2, scale: float = 4.0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      bos_token_id=None, eos_token_id=None, pad_token_id=None, tie_word_embeddings=False)
    cfg._attn_implementation = "sdpa"
    model = LlamaForCausalLM(cfg).float().eval().requires_grad_(False)
    with torch.no_grad():
        model.lm_head.weight.mul_(scale)  # peaked distributions make the sampling test sharper
    model.generation_config.eos_token_id = None
    return model


def tiny_pair() -> LoadedPair:
    src = ModelSource(path="tiny")
    cfg = PairConfig(name="tiny", target=src, mid=src, chat_template=False, dtype="float32", device="cpu")
    return LoadedPair(cfg, tiny_tokenizer(), tiny_model(1), tiny_model(2, layers=1), torch.device("cpu"),
                      torch.float32)


def tiny_head(target, seed: int = 3, layers: int = 1, taps: tuple[int, ...] = ()):
    """A randomly initialised draft head on a tiny target (drafters/head.py); `taps`: a tapped head (fuse random too)."""
    from treegraft.drafters.head import DraftHead

    torch.manual_seed(seed)
    head = DraftHead(target.config, target.get_input_embeddings(), layers, taps).float().eval().requires_grad_(False)
    with torch.no_grad():
        for p in head.parameters():
            if p.dim() == 2 and p is not target.get_input_embeddings().weight:
                p.normal_(0, 0.3)
    return head


def tiny_head_pair(taps: tuple[int, ...] = ()) -> LoadedPair:
    """The tiny target with a draft head as its mid (mid kind: head); with taps: a 3-layer target, a tapped head."""
    target = tiny_model(1, layers=3 if taps else 2)
    cfg = PairConfig(name="tiny-head", target=ModelSource(path="tiny"), mid=ModelSource(path="tiny", kind="head"),
                     chat_template=False, dtype="float32", device="cpu")
    return LoadedPair(cfg, tiny_tokenizer(), target, tiny_head(target, taps=taps), torch.device("cpu"), torch.float32)
