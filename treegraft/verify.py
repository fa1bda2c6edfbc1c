"""The target: prefill, one tree-masked verification forward, lossless acceptance, KV compaction (SPEC 3).

The target's cache always holds every committed token but the last; the last one
is the tree's root, fed at the head of each verification so that its output is
the distribution of the first new token.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from transformers import DynamicCache

from .config import GenerationConfig
from .kv import additive_mask, keep_slots
from .profile import Profile
from .sampling import draw, processed_probs
from .tree import DraftTree, batch_layout


class TargetModel:
    def __init__(self, model):
        self.model = model
        self.device = model.get_input_embeddings().weight.device
        self.dtype = next(model.parameters()).dtype
        self.profile = Profile(self.device)  # the engine shares its own
        self.cache = DynamicCache()
        self.cached = 0

    def forward(self, ids: torch.Tensor, **kw) -> torch.Tensor:
        """[1, n] ids -> [n, vocab] logits (the stock forward)."""
        with self.profile.part("target_forward"):
            return self.model(input_ids=ids, cache=self.cache, use_cache=True, **kw).logits[0]

    @torch.no_grad()
    def start(self, committed: list[int]) -> None:
        """Prefill every committed token but the last."""
        self.cache, self.cached = DynamicCache(), 0
        if len(committed) > 1:
            ids = torch.tensor([committed[:-1]], device=self.device)
            self.model(input_ids=ids, cache=self.cache, use_cache=True, logits_to_keep=1)
            self.cached = len(committed) - 1

    @torch.no_grad()
    def decode_one(self, token: int) -> torch.Tensor:
        """Plain autoregressive step (no custom mask): [vocab] logits of the token after `token`."""
        ids = torch.tensor([[token]], device=self.device)
        logits = self.forward(ids)  # [1, vocab]
        self.cached += 1
        return logits[-1]

    @torch.no_grad()
    def verify(self, tree: DraftTree, nodes: np.ndarray) -> torch.Tensor:
        """One forward over root + kept nodes (index order): [n, vocab] target logits at each node."""
        with self.profile.part("mask"):
            anc, depth = batch_layout(tree, nodes)
            n, L = len(nodes), self.cached
            visible = np.concatenate([np.ones((n, L), dtype=bool), anc], axis=1)  # [n, L + n]
            ids = torch.from_numpy(tree.token[nodes])[None].to(self.device)  # [1, n]
            positions = torch.from_numpy(L + depth)[None].to(self.device)  # root sits at L = len(committed) - 1
            mask = additive_mask(visible, self.dtype, self.device)  # [1, 1, n, L + n]
        return self.forward(ids, attention_mask=mask, position_ids=positions)

    def rollback(self) -> None:
        """Drop whatever a verification appended (the cache holds the committed prefix again)."""
        keep_slots(self.cache, torch.arange(self.cached, device=self.device))

    def commit(self, rows: list[int]) -> None:
        """Keep the prefix and the accepted rows (root first) of the last verification."""
        with self.profile.part("kv"):
            keep = torch.cat([torch.arange(self.cached), self.cached + torch.tensor(rows, dtype=torch.long)])
            keep_slots(self.cache, keep.to(self.device))
        self.cached += len(rows)


@dataclass
class Acceptance:
    path: list[int]  # accepted nodes, root first
    rows: list[int]  # their rows in the verification batch
    bonus: int  # the token the target emits after the last accepted node

    @property
    def accepted_tokens(self) -> int:
        return len(self.path) - 1


def _walk(tree: DraftTree, nodes: np.ndarray, choose) -> Acceptance:
    row = {int(v): i for i, v in enumerate(nodes)}
    v, path, rows = 0, [0], [0]
    while True:
        y = choose(row[v])
        c = tree.child_of.get((v, y))
        if c is None or not tree.kept[c]:
            return Acceptance(path, rows, y)
        v = c
        path.append(v)
        rows.append(row[v])


def accept(tree: DraftTree, nodes: np.ndarray, logits: torch.Tensor, gen: GenerationConfig,
           generator: torch.Generator | None) -> Acceptance:
    """Greedy: follow the target's argmax. Sampling: at each node draw y from the target's processed
    distribution and descend into the child carrying y (siblings carry distinct tokens, so this is
    exactly sampling from the target)."""
    if gen.temperature == 0:
        best = logits.argmax(-1).tolist()  # [n]
        return _walk(tree, nodes, lambda r: best[r])
    return _walk(tree, nodes, lambda r: draw(processed_probs(logits[r:r + 1], gen)[0], generator))
