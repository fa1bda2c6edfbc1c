"""A Llama-class draft head's forward as one C++ call (`kernels/head_layer.cpp`), for the few rows of a drafting step.

A head step runs right after the target's verification has streamed ~0.5 GB through every cache, so each of the
stock layer's ~45 small tensor ops pays for a cold interpreter, dispatcher and allocator: on a 2-core Zen 4 in fp32
a live forward took 1.5 ms, of which its products were ~0.7 (docs/tuning.md). The kernel runs the whole forward
(fc over [feature; embedding], each decoder layer, the final norm) in one call: its products are the packed
kernels' (`packed_micro.h`, the same FMA chain per output as the routed Linear's `packed*` paths), the small ops
plain loops. It rounds the norms, the rotary table and the attention's sums in its own order, so it is close to
the stock forward, not bit-equal: `DraftHead.check_fused` turns it on only where it agrees with the stock forward
within `FUSED_RTOL` on a tree probe. A head's output steers drafting only; the target's output never depends on it.

Where it applies: CPU, fp32, no gradients, a head whose layers are all `LlamaDecoderLayer` without biases, a static
rotary table (not "dynamic" / "longrope"), fp32 embeddings, every product's output a multiple of the kernel's block,
a `GrowingCache` (the head's own). The packed weights are fp16 where the head's weights are fp16-exact (the pair's
`half_drafter` rounds them), else fp32, and are packed again whenever a weight changes (training).
"""
from __future__ import annotations

from pathlib import Path

import torch

from ..kv import GrowingCache

SOURCE = Path(__file__).parent.parent / "kernels" / "head_layer.cpp"
FUSED_RTOL = 1e-3  # check_fused: |fused - stock| <= FUSED_RTOL * max|stock| on the probe


def fused_ops():
    """The kernel's module, built like the packed kernels (`cpu_kernels._extra_ops`: once per machine, serial where
    they are) for this CPU's widest vector ISA, or None where it cannot be built here (`fused_unavailable()`)."""
    from ..cpu_kernels import _extra_ops

    wide = torch.backends.cpu.get_cpu_capability() == "AVX512"
    return _extra_ops("head_layer_512" if wide else "head_layer_avx2",
                      f"treegraft_head_layer_v2_{'avx512' if wide else 'avx2'}", SOURCE,
                      ["-mavx512f"] if wide else ["-mavx2", "-mf16c"])


def fused_unavailable() -> str:
    """'' where the kernel is built here, else why not."""
    from ..cpu_kernels import packed_unavailable

    return "" if fused_ops() is not None else packed_unavailable() or "could not build kernels/head_layer.cpp"


def _linears(layer) -> list[torch.nn.Linear]:
    a, m = layer.self_attn, layer.mlp
    return [a.q_proj, a.k_proj, a.v_proj, a.o_proj, m.gate_proj, m.up_proj, m.down_proj]


def fusable(head) -> str:
    """'' where the fused forward can run this head, else why not."""
    from .head import LEAN_LAYERS

    ops = fused_ops()
    if ops is None:
        return fused_unavailable()
    p = next(head.parameters())
    if p.device.type != "cpu" or p.dtype != torch.float32:
        return f"the head runs on {p.device.type} in {p.dtype}; the kernel is fp32 on a CPU"
    if not all(type(layer).__name__ in LEAN_LAYERS for layer in head.body.layers):
        return f"its layers are not all of {LEAN_LAYERS}"
    rotary = head.body.rotary_emb
    if any(t in str(getattr(rotary, "rope_type", "default")) for t in ("dynamic", "longrope")):
        return f"its rotary table changes with length ({rotary.rope_type})"
    if head.body.embed_tokens.weight.dtype != torch.float32:
        return "its embeddings are not fp32"
    block = int(ops.block_rows())
    for m in [head.fc] + [lin for layer in head.body.layers for lin in _linears(layer)]:
        if m.bias is not None or m.out_features % block:
            return f"a product has a bias or an output size not a multiple of {block}"
    if head.config.num_attention_heads % head.config.num_key_value_heads:
        return "its query heads do not group evenly over its key/value heads"
    return ""


class FusedHead:
    """The head's weights as the kernel reads them (packed products, fp32 norms), packed again when any changes."""

    def __init__(self, head):
        self.head, self.key, self.weights = head, None, None

    def _params(self) -> list[torch.Tensor]:
        h = self.head
        out = [h.fc.weight]
        for layer in h.body.layers:
            out += [layer.input_layernorm.weight, layer.post_attention_layernorm.weight]
            out += [lin.weight for lin in _linears(layer)]
        return out + [h.body.norm.weight]

    def packed(self) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """(fc, [9 per layer: input norm, q, k, v, o, post-attention norm, gate, up, down])."""
        params = self._params()
        key = tuple((p.data_ptr(), p._version) for p in params)
        if key != self.key:
            ops, h = fused_ops(), self.head
            linear = [h.fc.weight] + [lin.weight for layer in h.body.layers for lin in _linears(layer)]
            half = all(torch.equal(w, w.half().float()) for w in linear)  # fp16-exact: stream half the bytes

            def pack(w: torch.Tensor) -> torch.Tensor:
                return ops.pack(w.detach().contiguous(), half)

            layers = []
            for layer in h.body.layers:
                q, k, v, o, g, u, d = (pack(lin.weight) for lin in _linears(layer))
                layers += [layer.input_layernorm.weight.detach(), q, k, v, o,
                           layer.post_attention_layernorm.weight.detach(), g, u, d]
            self.weights, self.key = (pack(h.fc.weight), layers), key
        return self.weights

    def forward(self, feats: torch.Tensor, ids: torch.Tensor, attention_mask: torch.Tensor,
                position_ids: torch.Tensor, cache: GrowingCache, prefetch: int) -> torch.Tensor:
        """feats [1, n, H], ids [1, n], attention_mask [1, 1, n, past + n] (additive), position_ids [1, n] ->
        [1, n, H]; appends the n rows' keys and values to every layer of `cache`."""
        h = self.head
        cfg = h.config
        n = ids.shape[-1]
        fc, weights = self.packed()
        kv, d = cfg.num_key_value_heads, h.body.layers[0].self_attn.head_dim
        like = feats.new_empty(1, kv, n, d)
        kbufs, vbufs, past = [], [], None
        for i in range(len(h.body.layers)):
            layer = cache.layer(i)
            k, v, held = layer.room(like, like)
            if past is not None and held != past:
                raise ValueError(f"the head's cache layers hold {past} and {held} slots")
            past = held
            kbufs.append(k[0])
            vbufs.append(v[0])
        norm = h.body.norm
        out = fused_ops().head_forward(
            feats.reshape(n, -1).contiguous(), ids.reshape(n), h.body.embed_tokens.weight, fc, position_ids.reshape(n),
            h.body.rotary_emb.inv_freq, float(h.body.rotary_emb.attention_scaling),
            attention_mask.reshape(n, -1).contiguous(), weights, kbufs, vbufs, past, norm.weight.detach(),
            float(norm.variance_epsilon), cfg.num_attention_heads, kv, float(h.body.layers[0].self_attn.scaling),
            prefetch)
        for i in range(len(h.body.layers)):
            cache.layers[i].extend(past + n)
        return out[None]
