"""The draft head: a mid drafter of the EAGLE family that reads the target's own features.

Feature of a position: the target's final (normed) hidden state there; its product
with the target's output rows is the target's next-token logits. For a node v whose
parent is u:

    x(v)  = fc([feature(u); E(token(v))])          [H]   (E: the target's frozen embeddings)
    f(v)  = norm(decoder_layer(x(v) | ancestors))   [H]   (one layer of the target's architecture)
    log q(. | path to v) = log_softmax(f(v) @ W_S^T)  [S]  (W_S: the target's frozen output rows
                                                           of the draft vocabulary)

Taps (EAGLE-3's fused features, optional: `taps`, e.g. (2, 15)): a committed
token's input feature may also carry the target's residual stream after a few
lower layers (each RMS-normalised without weights, `target.with_taps`); `fuse` maps the
concatenation [final; tap_1; ...] [(1 + k) H] to H before fc, once per committed
token (it starts as "take the final feature", so a head grown from an untapped one
starts as that head). Draft nodes still read the head's own outputs [H].

The decoder layer is a stock Hugging Face model of the target's class cut to one
layer, so tree attention is the same 4-D mask + position ids + KV cache (growing layers) as the
target's. Where features come from:

- committed tokens: the target's real features, from forwards the engine already
  runs (the prefill, and the accepted rows of each verification); no extra target
  forward. The head's cache holds one slot per committed token but the last,
  computed from real features (position 0 gets a zero feature).
- the root (the last committed token): its target feature is not known before the
  verification that computes it, so the head computes f(root) from the last real
  feature, as for any node.
- draft nodes: the head's own outputs at their parents (EAGLE's feature
  autoregression), whichever drafter grew the node.

n-gram-grown nodes in a mid step's pool (SPEC 2.1: the mid scores every node it
has not evaluated) have parents with no head feature yet. A node's feature depends
only on its ancestors, so the batch (pool + unvisited ancestors) is evaluated in
*levels*: level 0 = nodes whose parent the head has evaluated (or the root), level
l = nodes whose parent is at level l-1; one batched forward per level, each level
attending to the cache slots the earlier ones wrote. A pool grown by small steps
costs one forward per unvisited depth (measured: see the README's model card);
the alternative, a learned stand-in feature for unvisited parents, would need
its own training and gives up the exactness of `test_head_matches_sequential`
(every node's score equals a sequential computation over its path), so it was
not taken.

How a tree batch runs (`DraftHead.path`, chosen at load by `check_direct` and `check_fused`): on a CPU in fp32, a Llama-class head's
whole forward as one C++ call (`fused`, `drafters/fused.py`: a drafting step's ~45 small tensor ops cost a cold
interpreter and dispatcher each), checked to agree with the stock forward to float rounding; else the body's layers
called directly, each as the lean sequence of its own stock submodules (`lean_layer`), where bit-equal to the
body's forward; else the body's own forward.

At the end of a round the node slots are dropped and the newly committed tokens
are fed at the next call with the target's real features (as EAGLE does), so the
head's committed cache always holds what training saw.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import torch
from torch import nn
from transformers import AutoConfig, AutoModel
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from ..kv import GrowingCache, keep_slots
from ..profile import profiled
from ..tree import DraftTree, node_levels
from .neural import MidScores, committed_layout, draft_output, tree_layout

HEAD_WEIGHTS = "head.safetensors"
HEAD_CONFIG = "config.json"


class DraftHead(nn.Module):
    """fc([feature; embedding]) -> `layers` stock decoder layers (one by default) -> the target's final norm type;
    with `taps`, committed tokens' features [(1 + k) H] go through `fuse` first (module docstring)."""

    def __init__(self, config, embeddings: nn.Embedding, layers: int = 1, taps: tuple[int, ...] = ()):
        super().__init__()
        cfg = config.__class__.from_dict({**config.to_dict(), "num_hidden_layers": layers, "vocab_size": 1,
                                            "pad_token_id": None, "bos_token_id": None, "eos_token_id": None})
        h = cfg.hidden_size
        self.config = cfg
        self.fc = nn.Linear(2 * h, h, bias=False)
        self.taps = tuple(int(t) for t in taps)  # the target's layers whose outputs a committed feature carries
        if self.taps:
            self.fuse = nn.Linear((1 + len(self.taps)) * h, h, bias=False)
            with torch.no_grad():  # start as "the final feature alone"
                self.fuse.weight.zero_()
                self.fuse.weight[:, :h].copy_(torch.eye(h))
        self.body = AutoModel.from_config(cfg, dtype=torch.float32)  # a `layers`-layer model of the target's class
        self.body.embed_tokens = embeddings  # the target's own, frozen, not saved
        self.direct = False  # call the body's layers directly (`check_direct`)
        self.lean = False  # and each layer's own submodules in turn (`lean_layer`; `check_direct`)
        self.fused = None  # or the whole forward in one C++ call (`fused.FusedHead`; `check_direct`)

    @property
    def in_features(self) -> int:
        """Width of a committed token's target feature: H, or (1 + len(taps)) H with taps."""
        return (1 + len(self.taps)) * self.config.hidden_size

    def fuse_features(self, feats: torch.Tensor) -> torch.Tensor:
        """[..., in_features] target features -> [..., H] input features (the identity without taps)."""
        return self.fuse(feats) if self.taps else feats

    def forward(self, feats: torch.Tensor, ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None, cache=None, use_cache: bool = False) -> torch.Tensor:
        """feats [b, n, H] (the parents' features), ids [b, n], attention_mask [b, 1, n, keys] (additive; None:
        causal), position_ids [b, n] -> predicted features [b, n, H]."""
        tree = attention_mask is not None and attention_mask.ndim == 4 and position_ids is not None
        if (self.fused is not None and tree and use_cache and isinstance(cache, GrowingCache)
                and not torch.is_grad_enabled()):
            return self.fused.forward(feats, ids, attention_mask, position_ids, cache, self.prefetch(ids.shape[-1]))
        x = self.fc(torch.cat([feats, self.body.embed_tokens(ids).to(feats.dtype)], dim=-1))  # [b, n, H]
        kw = dict(attention_mask=attention_mask, position_ids=position_ids, cache=cache, use_cache=use_cache)
        if self.direct and tree:
            return self.layers_forward(x, **kw)
        return self.body(inputs_embeds=x, **kw).last_hidden_state

    def layers_forward(self, x: torch.Tensor, attention_mask, position_ids, cache, use_cache) -> torch.Tensor:
        """The body's own stock modules called in turn (rotary embedding, decoder layers, norm), without its model
        forward's wrapping: its mask builder (a 4-D mask passes through it unchanged), keyword merging and output
        hooks (on a 2-core Zen 5 in fp32, one forward of 1 / 4 / 8 tree rows over a 150-token cache: 0.41 / 0.47 /
        0.55 ms against 0.48 / 0.55 / 0.65). Used only where `check_direct` found it bit-equal to `body(...)`;
        with `lean`, each layer too (`lean_layer`)."""
        position_embeddings = self.body.rotary_emb(x, position_ids=position_ids)
        for layer in self.body.layers:
            if self.lean:
                x = lean_layer(layer, x, attention_mask, position_embeddings, cache)
            else:
                x = layer(x, attention_mask=attention_mask, position_ids=position_ids, cache=cache,
                          use_cache=use_cache, position_embeddings=position_embeddings)
        return self.body.norm(x)

    @property
    def path(self) -> str:
        """How a tree batch runs (`check_direct`): fused, lean, direct or stock."""
        return "fused" if self.fused is not None else "lean" if self.lean else "direct" if self.direct else "stock"

    def prefetch(self, rows: int) -> int:
        """The packed kernels' prefetch distance at this many rows: what the head's Linear layers' table measured."""
        from ..cpu_kernels import PREFETCH

        table = getattr(self.fc, "kernels", None)
        return table.distance("body", rows) if table is not None else PREFETCH[0]

    @torch.no_grad()
    def check_direct(self) -> bool:
        """Set `direct` (and `lean`): whether `layers_forward` equals the body's own forward, bit for bit, on a
        probe (a tree mask over a cache), first with `lean` layers (where every layer is of a class `lean_layer`
        knows), then without: true for bodies whose forward is rotary -> layers -> norm (Llama, Qwen2/3, Mistral);
        false where the model's forward does more (e.g. Gemma scales its inputs), which then keeps `body(...)`."""
        from transformers import DynamicCache

        self.direct = self.lean = False
        p = next(self.parameters())
        g = torch.Generator().manual_seed(0)
        h, n, past = self.config.hidden_size, 5, 7
        x = torch.randn(1, past + n, h, generator=g).to(p.dtype)
        causal, mask, first, second = tree_probe(past, n, g, p)

        def run(fn) -> torch.Tensor:
            cache = DynamicCache()
            fn(x[:, :past].to(p.device), attention_mask=causal, position_ids=first, cache=cache, use_cache=True)
            return fn(x[:, past:].to(p.device), attention_mask=mask, position_ids=second, cache=cache, use_cache=True)

        ref = run(lambda y, **kw: self.body(inputs_embeds=y, **kw).last_hidden_state)
        for lean in ((True, False) if all(type(layer).__name__ in LEAN_LAYERS for layer in self.body.layers)
                     else (False,)):
            self.lean = lean
            if torch.equal(run(self.layers_forward), ref):
                self.direct = True
                break
        else:
            self.lean = False
        return self.direct

    @torch.no_grad()
    def check_fused(self) -> bool:
        """Set `fused` (`fused.FusedHead`, the whole forward in one C++ call) where `fused.fusable` allows it and
        it agrees with the stock forward within `FUSED_RTOL` on a tree probe over a cache; else None. The loader
        calls it where the pair's `small_batch_linear` is on, after the weights are rounded (`half_drafter`), so the
        probe packs them as they will run."""
        from .fused import FUSED_RTOL, FusedHead, fusable

        self.fused = None
        if fusable(self):
            return False
        p = next(self.parameters())
        g = torch.Generator().manual_seed(1)
        h, past, n = self.config.hidden_size, 9, 6
        feats = torch.randn(1, past + n, h, generator=g).to(p.dtype)
        ids = torch.randint(0, self.body.embed_tokens.num_embeddings, (1, past + n), generator=g)
        causal, mask, first, second = tree_probe(past, n, g, p)

        def run(fused) -> torch.Tensor:
            self.fused, cache = fused, GrowingCache()
            self(feats[:, :past], ids[:, :past], causal, first, cache, True)
            return self(feats[:, past:], ids[:, past:], mask, second, cache, True)

        ref = run(None)
        out = run(FusedHead(self))
        if not (out - ref).abs().max() <= FUSED_RTOL * ref.abs().max():
            self.fused = None
        return self.fused is not None

    def own_state(self) -> dict[str, torch.Tensor]:
        return {k: v for k, v in self.state_dict().items() if not k.startswith("body.embed_tokens")}

    @property
    def layers(self) -> int:
        return len(self.body.layers)

    def load_weights(self, path: Path, grown: bool = False) -> None:
        """Load a saved head's weights (its file holds all but the target's embeddings); ValueError on a mismatch.
        grown: the saved head may have fewer layers than this one (`distill --head-layers`), or no taps where this
        one has them (`distill --head-taps`); the layers it lacks keep their identity start (`from_target`), the
        fuse its "final feature alone" start."""
        from safetensors.torch import load_file

        saved = load_file(str(path))
        if any(k.startswith(f"body.layers.{self.layers}.") for k in saved):
            raise ValueError(f"{path} has more than the {self.layers} layer(s) asked for (--head-layers)")
        has = {k.split(".")[2] for k in saved if k.startswith("body.layers.")}  # the saved head's layer indices
        result = self.load_state_dict(saved, strict=False)
        missing = [k for k in result.missing_keys if not k.startswith("body.embed_tokens")
                   and not (grown and k.startswith("body.layers.") and k.split(".")[2] not in has)
                   and not (grown and k == "fuse.weight")]
        if missing or result.unexpected_keys:
            raise ValueError(f"{path}: missing {missing[:3]}, unexpected {result.unexpected_keys[:3]}")

    @classmethod
    def from_target(cls, target, layers: int = 1, taps: tuple[int, ...] = ()) -> "DraftHead":
        """A fresh head for a target: its first layer and norm initialised from the target's last ones; any further
        layer from the target's last one too, with its two residual outputs (attention's o_proj, the MLP's
        down_proj) zeroed, so that it starts as the identity and a head grown from a trained one with fewer layers
        (`load_weights(..., grown=True)`) starts as that head."""
        if any(not 0 <= t < target.config.num_hidden_layers - 1 for t in taps):
            raise ValueError(f"taps {tuple(taps)}: each must be a layer index below the target's last "
                             f"({target.config.num_hidden_layers - 1}), whose output the final feature already is")
        head = cls(target.config, target.get_input_embeddings(), layers, taps)
        last = {k: v.float() for k, v in target.model.layers[-1].state_dict().items()}
        for i, layer in enumerate(head.body.layers):
            layer.load_state_dict(last)
            if i:
                identity(layer)
        head.body.norm.load_state_dict({k: v.float() for k, v in target.model.norm.state_dict().items()})
        with torch.no_grad():  # start as "feature + embedding" so the first steps already see both
            eye = torch.eye(head.config.hidden_size)
            head.fc.weight.copy_(torch.cat([eye, eye], dim=1) * 0.5)
        return head


def tree_probe(past: int, n: int, g: torch.Generator, like: torch.Tensor):
    """A probe of `check_direct` / `check_fused` (on `like`'s dtype and device): (causal mask [1, 1, past, past] of
    a prefix, a random tree mask [1, 1, n, past + n] over it (each row sees the prefix, itself and a random half of
    the other rows), the prefix's positions [1, past], the rows' positions [1, n] at depths 0, 1, 1, 2, 2, ...)."""
    low = torch.finfo(like.dtype).min
    causal = torch.triu(torch.full((past, past), low), 1)[None, None]
    mask = torch.zeros(1, 1, n, past + n)
    mask[..., past:] = torch.where(torch.rand(n, n, generator=g) < 0.5, low, 0.0)
    mask[..., past:].diagonal(dim1=-2, dim2=-1).zero_()
    second = past + (torch.arange(n) + 1) // 2
    return (causal.to(like), mask.to(like), torch.arange(past)[None].to(like.device), second[None].to(like.device))


LEAN_LAYERS = ("LlamaDecoderLayer",)  # the stock layer classes whose forward `lean_layer` repeats


def lean_layer(layer: nn.Module, x: torch.Tensor, mask: torch.Tensor, position_embeddings, cache) -> torch.Tensor:
    """One stock Llama-class decoder layer (`LEAN_LAYERS`) on x [b, n, H]: its own submodules and functions (its
    norms, projections and MLP activation, its modeling module's rotary function, the registered attention
    function, the cache's update) called in the order of its forward, without the wrapping of the layer's,
    the attention's and every submodule's module call (keyword merging, deprecation checks, hooks). A draft head
    runs one layer on a handful of rows, where that wrapping shows: the head's forward at 4 rows over 200 cached
    tokens 0.73 -> 0.66 ms warm, 1.11 -> 0.92 ms after 64 MB of other reads, 1.60 -> 1.50 ms live (2-core Zen 4,
    fp32). `check_direct` turns it on only where it is bit-equal to the stock forward."""
    a, mlp = layer.self_attn, layer.mlp
    shape = (*x.shape[:-1], -1, a.head_dim)
    h = layer.input_layernorm.forward(x)
    q = a.q_proj.forward(h).view(shape).transpose(1, 2)  # [b, heads, n, d]
    k = a.k_proj.forward(h).view(shape).transpose(1, 2)  # [b, kv_heads, n, d]
    v = a.v_proj.forward(h).view(shape).transpose(1, 2)
    modeling = sys.modules[type(layer).__module__]
    q, k = modeling.apply_rotary_pos_emb(q, k, *position_embeddings)
    if cache is not None:
        k, v = cache.update(k, v, a.layer_idx)  # [b, kv_heads, L, d]
    attention = ALL_ATTENTION_FUNCTIONS.get_interface(a.config._attn_implementation, modeling.eager_attention_forward)
    o, _ = attention(a, q, k, v, mask, dropout=a.attention_dropout if a.training else 0.0,
                     scaling=a.scaling)  # [b, n, heads, d]
    x = x + a.o_proj.forward(o.reshape(*x.shape[:-1], -1).contiguous())
    h = layer.post_attention_layernorm.forward(x)
    return x + mlp.down_proj.forward(mlp.act_fn(mlp.gate_proj.forward(h)) * mlp.up_proj.forward(h))


def identity(layer: nn.Module) -> None:
    """Zero a pre-norm decoder layer's residual outputs: the layer then passes its input through unchanged."""
    with torch.no_grad():
        layer.self_attn.o_proj.weight.zero_()
        layer.mlp.down_proj.weight.zero_()


def save_head(head: DraftHead, out: Path, meta: dict) -> None:
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    cfg = head.config.to_dict()
    cfg["treegraft_head"] = {"kind": "eagle", "layers": head.layers, **({"taps": list(head.taps)} if head.taps else {})}
    (out / HEAD_CONFIG).write_text(json.dumps(cfg, indent=2))
    state = {k: v.detach().float().contiguous() for k, v in head.own_state().items()}
    save_file(state, str(out / HEAD_WEIGHTS), metadata={"format": "pt"})
    (out / "distill.json").write_text(json.dumps(meta, indent=2))


def load_head(folder: Path, target, dtype: torch.dtype, device: torch.device) -> DraftHead:
    """A saved head on a loaded target (its embeddings shared); raises ValueError on a mismatch."""
    cfg = json.loads((folder / HEAD_CONFIG).read_text())
    if "treegraft_head" not in cfg:
        raise ValueError(f"{folder / HEAD_CONFIG} is not a draft head (no 'treegraft_head' entry)")
    if cfg.get("hidden_size") != target.config.hidden_size:
        raise ValueError(f"the head in {folder} has hidden size {cfg.get('hidden_size')}, "
                         f"the target {target.config.hidden_size}")
    drop = ("treegraft_head", "bos_token_id", "eos_token_id", "pad_token_id")  # no vocabulary of its own
    config = AutoConfig.for_model(**{k: v for k, v in cfg.items() if k not in drop},
                                  bos_token_id=None, eos_token_id=None, pad_token_id=None)
    head = DraftHead(config, target.get_input_embeddings(), int(cfg["treegraft_head"].get("layers", 1)),
                     tuple(cfg["treegraft_head"].get("taps", ())))
    head.load_weights(folder / HEAD_WEIGHTS)
    head.body.embed_tokens = target.get_input_embeddings()
    head = head.to(device=device, dtype=dtype).eval().requires_grad_(False)
    head.check_direct()
    return head


class HeadDrafter:
    """The mid-drafter interface (start, begin_round, evaluate, end_round, snapshot/rollback) for a head.

    State: `prev` [1 + L - 1, H] (grown by doubling), a zero row then the target's features of every
    committed token but the last, so `prev[i]` is the input feature of committed position i (the
    feature of position i - 1); the cache holds `cached` committed slots and, during a round, node slots.
    """

    needs_target_features = True

    @property
    def taps(self) -> tuple[int, ...]:
        """The target layers whose outputs the engine must hand over with the final features."""
        return self.head.taps

    def __init__(self, head: DraftHead, output_weight: torch.Tensor, vocab_size: int,
                 draft_vocab: torch.Tensor | None = None, small_batch: bool = False, half: bool = False):
        self.head = head
        self.device = output_weight.device
        self.dtype = next(head.parameters()).dtype
        # the target's frozen output rows of the draft vocabulary (half: a copy rounded to fp16)
        self.scorer, self.vocab, self.col_of = draft_output(output_weight, vocab_size, draft_vocab, small_batch, half)
        self.start(torch.zeros(0, head.in_features, dtype=self.dtype, device=self.device))

    def start(self, target_features: torch.Tensor) -> None:
        """A new generation: the prefill's features [L - 1, in_features] of every committed token but the last."""
        self.cache, self.cached, self.n_feats = GrowingCache(), 0, 0
        self.prev = torch.zeros(1 + max(256, 2 * len(target_features)), self.head.config.hidden_size,
                                dtype=self.dtype, device=self.device)
        self._append(target_features)
        self.begin_round()

    @property
    def feats(self) -> torch.Tensor:
        """[L - 1, H] the target's features of every committed token but the last."""
        return self.prev[1: 1 + self.n_feats]

    def _append(self, features: torch.Tensor) -> None:
        """Keep committed tokens' target features [m, in_features], fused to [m, H] once here."""
        features = self.head.fuse_features(features)
        n, m = self.n_feats, len(features)
        if 1 + n + m > len(self.prev):
            grown = torch.zeros(2 * (1 + n + m), self.prev.shape[1], dtype=self.dtype, device=self.device)
            grown[: 1 + n] = self.prev[: 1 + n]
            self.prev = grown
        self.prev[1 + n: 1 + n + m] = features
        self.n_feats = n + m

    @torch.no_grad()
    def prefill(self, committed: list[int]) -> None:
        """Feed the committed tokens but the last (the prompt, at the start) with their real features now, as
        EAGLE does in the target's prefill, so a first call pays only for what was committed after it (the
        same rows, inputs and cache as that call's first level would have fed). Called between rounds."""
        pending = committed[self.cached: len(committed) - 1]
        if pending:
            feats = self.prev[self.cached: self.cached + len(pending)][None]  # [1, p, H]
            ids, mask, positions = committed_layout(pending, self.cached, self.cache.get_seq_length(), self.dtype,
                                                    self.device)
            self._forward(feats, ids, mask, positions)
            self.cached += len(pending)

    def begin_round(self) -> None:
        self.slots: dict[int, int] = {}  # node -> cache slot, this round
        self.node_feat: dict[int, torch.Tensor] = {}  # node -> the head's feature f(v) [H], this round

    @torch.no_grad()
    def evaluate(self, tree: DraftTree, committed: list[int], nodes: np.ndarray) -> MidScores:
        """log q(. | path to u) over the draft vocabulary for every u in `nodes` (index order, closed
        under unvisited ancestors): one forward per level (module docstring)."""
        levels = node_levels(tree, nodes, set(self.node_feat))
        out = torch.empty(len(nodes), self.head.config.hidden_size, dtype=self.dtype, device=self.device)
        for lvl in range(int(levels.max()) + 1 if len(nodes) else 0):
            at = np.flatnonzero(levels == lvl)
            out[torch.from_numpy(at)] = self._forward_level(tree, committed, nodes[at], first=lvl == 0)
        return MidScores(self._scores(out), self.vocab, self.col_of)

    @profiled("mid_forward")
    def _scores(self, feats: torch.Tensor) -> torch.Tensor:
        """[n, H] features -> [n, S] log q over the draft vocabulary (the target's frozen rows)."""
        return torch.log_softmax(self.scorer(feats).float(), dim=-1)

    def _forward_level(self, tree: DraftTree, committed: list[int], nodes: np.ndarray, first: bool) -> torch.Tensor:
        """Features [len(nodes), H] of one level's nodes; the first level also feeds pending committed tokens."""
        pending = committed[self.cached: len(committed) - 1] if first else []
        p = len(pending)
        feats, ids, mask, positions = self._layout(tree, committed, pending, nodes)
        f = self._forward(feats, ids, mask, positions)  # [p + n, H]
        base = self.cache.get_seq_length() - len(nodes)
        for i, v in enumerate(nodes.tolist()):
            self.slots[v] = base + i
            self.node_feat[v] = f[p + i]
        self.cached += p
        return f[p:]

    @profiled("mask")
    def _layout(self, tree: DraftTree, committed: list[int], pending: list[int], nodes: np.ndarray):
        """(parent features [1, p + n, H], ids, mask, positions): pending tokens read the target's real
        features, the root the last real one, other nodes their parent's head feature."""
        prev = self.prev  # prev[i] = the input feature of committed position i
        parent_feats = [prev[self.cached: self.cached + len(pending)]]
        for v in nodes.tolist():
            u = int(tree.parent[v])
            parent_feats.append(prev[len(committed) - 1][None] if u < 0 else self.node_feat[u][None])
        ids, mask, positions = tree_layout(tree, pending, nodes, self.cached, self.cache.get_seq_length(),
                                           self.slots, self.dtype, self.device)
        return torch.cat(parent_feats)[None], ids, mask, positions

    @profiled("mid_forward")
    def _forward(self, feats, ids, mask, positions) -> torch.Tensor:
        return self.head(feats, ids, attention_mask=mask, position_ids=positions, cache=self.cache,
                         use_cache=True)[0]

    @profiled("kv")
    def end_round(self, accepted_path: list[int], target_features: torch.Tensor | None) -> None:
        """Drop the node slots; keep the target's features of the accepted rows (root first) [A + 1, in_features]."""
        if self.slots:
            keep_slots(self.cache, self.cached)
        self._append(target_features)
        self.begin_round()

    def snapshot(self) -> tuple[int, int]:
        return self.cached, self.n_feats

    def rollback(self, state: tuple[int, int]) -> None:
        cached, n_feats = state
        keep_slots(self.cache, cached)
        self.cached, self.n_feats = cached, n_feats
        self.begin_round()
