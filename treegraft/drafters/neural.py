"""The mid drafter: one tree-masked batched forward over a candidate pool, with its own KV cache (SPEC 2.1).

Cache layout during a round: [committed tokens 0..cached) [node slots added by
this round's mid steps]. Committed tokens the mid has not seen yet ("pending")
are fed in front of the pool at the round's first mid call, so a run that never
calls the mid never pays for it. At the round's end the cache keeps the
committed part plus the slots of the accepted path that the mid evaluated.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from ..kv import GrowingCache, additive_mask, keep_slots
from ..profile import profiled
from ..tree import DraftTree, path_to


@dataclass
class MidScores:
    """The mid's log-probabilities at a batch of nodes, over its draft vocabulary."""

    logq: torch.Tensor  # [n, S] log q_mid over the draft vocabulary
    vocab: torch.Tensor | None  # [S] token ids of the columns (None: the whole vocabulary, S = V)
    col_of: torch.Tensor | None  # [V] column of each token id, -1 outside the draft vocabulary

    def of(self, rows: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(log q [m], known [m]) for tokens at rows; tokens outside the draft vocabulary are not known."""
        if self.col_of is None:
            return self.logq[rows, tokens], torch.ones_like(tokens, dtype=torch.bool)
        cols = self.col_of[tokens]
        known = cols >= 0
        return self.logq[rows, cols.clamp(min=0)], known

    def topk(self, rows: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(tokens [m, k], log q [m, k]), best first."""
        top = self.logq[rows].topk(k, dim=-1)
        tokens = top.indices if self.vocab is None else self.vocab[top.indices]
        return tokens, top.values


class MidDrafter:
    """A causal-LM mid drafter (the paper's kind). `draft_vocab` (optional) restricts its head to a
    frequency-ranked subset of token ids (`draft_output`)."""

    needs_target_features = False
    taps: tuple[int, ...] = ()  # no target layers read

    def __init__(self, model, vocab_size: int, draft_vocab: torch.Tensor | None = None, small_batch: bool = False,
                 half: bool = False):
        self.model = model
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self.scorer, self.vocab, self.col_of = draft_output(model.get_output_embeddings().weight, vocab_size,
                                                            draft_vocab, small_batch, half)
        self.cache = GrowingCache()
        self.cached = 0  # committed tokens held in the cache
        self.slots: dict[int, int] = {}  # node -> cache slot, this round

    def start(self, target_features: torch.Tensor | None = None) -> None:
        self.cache, self.cached, self.slots = GrowingCache(), 0, {}

    @torch.no_grad()
    def prefill(self, committed: list[int]) -> None:
        """Feed the committed tokens but the last (the prompt, at the start) now, as the target's prefill does,
        so a first call pays only for what was committed after it. Called between rounds (no node slots)."""
        pending = committed[self.cached: len(committed) - 1]
        if pending:
            ids, mask, positions = committed_layout(pending, self.cached, self.cache.get_seq_length(), self.dtype,
                                                    self.device)
            self.model.model(input_ids=ids, attention_mask=mask, position_ids=positions, cache=self.cache,
                             use_cache=True)
            self.cached += len(pending)

    def begin_round(self) -> None:
        self.slots = {}

    @torch.no_grad()
    def evaluate(self, tree: DraftTree, committed: list[int], nodes: np.ndarray) -> MidScores:
        """log q_mid(. | path to u) for every u in `nodes` (index order; unvisited ancestors included)."""
        pending = committed[self.cached: len(committed) - 1]
        ids, mask, positions = tree_layout(tree, pending, nodes, self.cached, self.cache.get_seq_length(),
                                           self.slots, self.dtype, self.device)
        logq = self._forward(ids, mask, positions, len(pending))  # [n, S]
        p = len(pending)
        cache_len = self.cache.get_seq_length() - p - len(nodes)
        for i, v in enumerate(nodes):
            self.slots[int(v)] = cache_len + p + i
        self.cached += p
        return MidScores(logq, self.vocab, self.col_of)

    @profiled("mid_forward")
    def _forward(self, ids, mask, positions, p: int) -> torch.Tensor:
        out = self.model.model(input_ids=ids, attention_mask=mask, position_ids=positions,
                               cache=self.cache, use_cache=True)  # the stock decoder; the head is ours
        return torch.log_softmax(self.scorer(out.last_hidden_state[0, p:]).float(), dim=-1)  # [n, S]

    def snapshot(self) -> int:
        return self.cached

    def rollback(self, cached: int) -> None:
        """Back to a state holding `cached` committed tokens and no node slots."""
        keep_slots(self.cache, cached)
        self.cached, self.slots = cached, {}

    @profiled("kv")
    def end_round(self, accepted_path: list[int], target_features: torch.Tensor | None = None) -> None:
        """Keep the committed part and the accepted nodes the mid evaluated, in path order."""
        if not self.slots:
            return
        kept = []
        for v in accepted_path:
            if v not in self.slots:
                break
            kept.append(self.slots[v])
        keep_slots(self.cache, self.cached, kept)
        self.cached += len(kept)
        self.slots = {}


def draft_output(output_weight: torch.Tensor, vocab_size: int, draft_vocab: torch.Tensor | None, small_batch: bool,
                 half: bool = False):
    """(scorer, vocab [S] | None, col_of [V] | None): the output layer a drafter scores with, over its rows.

    `draft_vocab` restricts the rows to a frequency-ranked subset (as in FR-Spec): on a small CPU pair the
    49k-row head is most of a drafter's cost. col_of maps a token id to its column (-1: outside). The scorer
    is an `nn.Linear` on those rows (a view of the target's head when there is no subset, never a second copy):
    hidden [n, H] -> logits [n, S]. A mid call scores a pool of 1-20 nodes, the few-row case where BLAS's
    general kernel is slowest on a CPU (the draft head's 8,192 rows: 2.7x slower at 8 rows than the packed path
    here), so `small_batch` (the pair's `small_batch_linear`, CPU) routes it through the paths `cpu_kernels`
    measures at load (cold: as a call meets them, after the target's forward), as the target's own head is.
    `half` (`PairConfig.half_drafter`): its rows are a copy rounded to fp16, never the target's own, and the fp16
    kernel is one of those paths."""
    rows = output_weight[:vocab_size]  # [V, hidden]; padded embedding rows are ignored
    vocab = col_of = None
    if draft_vocab is not None:
        vocab = draft_vocab.to(rows.device)
        col_of = torch.full((vocab_size,), -1, dtype=torch.long, device=rows.device)
        col_of[vocab] = torch.arange(len(vocab), device=rows.device)
        rows = rows[vocab]
    scorer = nn.Linear(rows.shape[1], rows.shape[0], bias=False, device="meta")  # no weight of its own
    weight = rows.detach().half().to(rows.dtype) if half else rows.detach().contiguous()  # half: a rounded copy
    scorer.weight = nn.Parameter(weight, requires_grad=False)
    if small_batch:
        from ..cpu_kernels import HALF_PATHS, PATHS, use_cpu_kernels

        use_cpu_kernels(scorer, allowed=PATHS + (HALF_PATHS if half else ()), prefill=False, cold=True)
    return scorer.requires_grad_(False), vocab, col_of


def committed_layout(pending: list[int], base: int, cache_len: int, dtype: torch.dtype, device: torch.device):
    """`tree_layout` for committed tokens alone (a prefill): causal over them, after the cache's `base` slots."""
    return tree_layout(None, pending, np.zeros(0, dtype=np.int64), base, cache_len, {}, dtype, device)


@profiled("mask")
def tree_layout(tree: DraftTree | None, pending: list[int], nodes: np.ndarray, base: int, cache_len: int,
                slots: dict[int, int], dtype: torch.dtype, device: torch.device):
    """ids [1, p + n], additive mask [1, 1, p + n, cache_len + p + n], positions [1, p + n] for a drafter
    forward over `pending` committed tokens then `nodes` (index order). The cache holds `base` committed
    slots, then this round's node slots (`slots`: node -> slot); a node sees the committed prefix, the
    pending tokens and its ancestors (from their slots, or from this batch)."""
    p, n = len(pending), len(nodes)
    visible = np.zeros((p + n, cache_len + p + n), dtype=bool)
    visible[:, :base] = True
    visible[:p, cache_len:cache_len + p] = np.tril(np.ones((p, p), dtype=bool))
    visible[p:, cache_len:cache_len + p] = True
    row = {int(v): p + i for i, v in enumerate(nodes)}
    for i, v in enumerate(nodes):
        for a in path_to(tree, int(v)):
            visible[p + i, slots[a] if a in slots else cache_len + row[a]] = True
    depth, tokens = (tree.depth[nodes], tree.token[nodes].tolist()) if n else (np.zeros(0, dtype=np.int64), [])
    positions = np.concatenate([np.arange(base, base + p), base + p + depth])
    ids = torch.tensor([pending + tokens], device=device)  # [1, p + n]
    return ids, additive_mask(visible, dtype, device), torch.from_numpy(positions)[None].to(device)
