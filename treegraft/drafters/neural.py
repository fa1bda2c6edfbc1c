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
from transformers import DynamicCache

from ..kv import additive_mask, keep_slots
from ..profile import Profile
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
    """`draft_vocab` (optional): restrict the mid's head to these token ids (a frequency-ranked subset,
    as in FR-Spec): on a small CPU pair the 49k-row head is most of the mid's cost. Children whose token
    lies outside it keep the p they had (the mid has no opinion on them)."""

    def __init__(self, model, vocab_size: int, draft_vocab: torch.Tensor | None = None):
        self.model = model
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self.vocab_size = vocab_size  # the shared tokenizer's size; padded embedding rows are ignored
        head = model.get_output_embeddings().weight[:vocab_size]  # [V, hidden]
        self.vocab = self.col_of = None
        if draft_vocab is not None:
            self.vocab = draft_vocab.to(self.device)
            self.col_of = torch.full((vocab_size,), -1, dtype=torch.long, device=self.device)
            self.col_of[self.vocab] = torch.arange(len(self.vocab), device=self.device)
            head = head[self.vocab]
        self.head = head.detach().contiguous()  # [S, hidden]
        self.profile = Profile(self.device)  # the engine shares its own
        self.cache = DynamicCache()
        self.cached = 0  # committed tokens held in the cache
        self.slots: dict[int, int] = {}  # node -> cache slot, this round

    def start(self) -> None:
        self.cache, self.cached, self.slots = DynamicCache(), 0, {}

    def begin_round(self) -> None:
        self.slots = {}

    @torch.no_grad()
    def evaluate(self, tree: DraftTree, committed: list[int], nodes: np.ndarray) -> MidScores:
        """log q_mid(. | path to u) for every u in `nodes` (index order; unvisited ancestors included)."""
        with self.profile.part("mask"):
            pending = committed[self.cached: len(committed) - 1]
            ids, mask, positions = self._layout(tree, pending, nodes)
        with self.profile.part("mid_forward"):
            out = self.model.model(input_ids=ids, attention_mask=mask, position_ids=positions,
                                   cache=self.cache, use_cache=True)  # the stock decoder; the head is ours
            p = len(pending)
            logits = out.last_hidden_state[0, p:] @ self.head.T  # [n, S]
            logq = torch.log_softmax(logits.float(), dim=-1)
        cache_len = self.cache.get_seq_length() - p - len(nodes)
        for i, v in enumerate(nodes):
            self.slots[int(v)] = cache_len + p + i
        self.cached += p
        return MidScores(logq, self.vocab, self.col_of)

    def _layout(self, tree: DraftTree, pending: list[int], nodes: np.ndarray):
        """ids [1, p + n], additive mask [1, 1, p + n, cache + p + n], positions [1, p + n] for pending + nodes."""
        base, cache_len, p, n = self.cached, self.cache.get_seq_length(), len(pending), len(nodes)
        visible = np.zeros((p + n, cache_len + p + n), dtype=bool)
        visible[:, :base] = True
        visible[:p, cache_len:cache_len + p] = np.tril(np.ones((p, p), dtype=bool))
        visible[p:, cache_len:cache_len + p] = True
        row = {int(v): p + i for i, v in enumerate(nodes)}
        for i, v in enumerate(nodes):
            for a in path_to(tree, int(v)):
                visible[p + i, self.slots[a] if a in self.slots else cache_len + row[a]] = True
        root_pos = base + p
        positions = np.concatenate([np.arange(base, base + p), root_pos + tree.depth[nodes]])
        ids = torch.tensor([pending + tree.token[nodes].tolist()], device=self.device)  # [1, p + n]
        return (ids, additive_mask(visible, self.dtype, self.device),
                torch.from_numpy(positions)[None].to(self.device))

    def rollback(self, cached: int) -> None:
        """Back to a state holding `cached` committed tokens and no node slots."""
        keep_slots(self.cache, torch.arange(cached, device=self.device))
        self.cached, self.slots = cached, {}

    def end_round(self, accepted_path: list[int]) -> None:
        """Keep the committed part and the accepted nodes the mid evaluated, in path order."""
        if not self.slots:
            return
        kept = []
        for v in accepted_path:
            if v not in self.slots:
                break
            kept.append(self.slots[v])
        with self.profile.part("kv"):
            keep = torch.cat([torch.arange(self.cached), torch.tensor(kept, dtype=torch.long)]).to(self.device)
            keep_slots(self.cache, keep)
        self.cached += len(kept)
        self.slots = {}
