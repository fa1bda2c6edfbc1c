"""CPU paths for the small batches of speculative decoding, on the stock modules, chosen by measurement.

A verification feeds the target a few to a few dozen tokens. On a CPU, `F.linear(x, W)`
with a few rows runs BLAS's general matrix-matrix kernel, which costs much more than the
1-row matrix-vector kernel of plain decoding (measured on a 2-core AVX2 machine, fp32: a
forward of 8 tokens 1.8x one token). Four paths compute the same products:

- `stock`: F.linear;
- `weight_left`: `W @ x.T` (the weight as the left operand), or for one row of the tall
  output head a product against a transposed copy of W: faster on some hosts, row
  counts and dtypes, slower on others;
- `packed` (fp32, x86 with AVX2 + FMA): W packed once at load into contiguous blocks
  of 8 output rows, read once per 8 rows of x by a small C++ kernel
  (`kernels/packed_gemm.cpp`, built on first use with torch's extension builder and
  cached). Every output is the same FMA chain over k whatever the batch, so a tree row
  equals the row of a one-token forward. Built with OpenMP, so that ATen's intra-op threads
  split its blocks (`packed_threads()`; without the flag `at::parallel_for` in an extension
  runs on one thread, which left half of a 2-core host idle at 8 rows). Where it cannot be
  built the other two remain.
- `packed16` (fp32, CPUs with AVX-512; pair switch `wide_kernel`): the same on blocks of 16
  output rows, up to 16 rows of x a pass (`kernels/packed16_gemm.cpp`); the same FMA chain
  per output, so its rows are bit-equal to `packed`'s and a table may mix the two.
- `packed16f`: `packed16` on the same packed weight with a batch's rows in passes of 12 and the rest last
  (16 = 12 + 4) rather than as even as possible (8 + 8): bit-equal; which split a host takes per bucket is
  measured like the rest (a 2-core Zen 4: 16 rows of a 1,536 x 576 layer 0.185 -> 0.158 ms).
- `packed16h` / `packed8h` (a drafter's only, pair switch `half_drafter`; AVX-512 / AVX2 + F16C):
  `packed16` / `packed` reading fp16 copies of the weights (`kernels/packed16h_gemm.cpp`,
  `kernels/packed8h_gemm.cpp`), fp32 FMA chains. The drafter's weights are rounded to fp16 at load
  (`half_weights`), so every path computes on the same weights and these stream half the bytes; the
  target never takes them, so output stays exact.

A drafter's paths (`use_cpu_kernels(..., cold=True)`) are timed *cold*: every timed call starts after a read through
`STREAM_BYTES` of other memory, because a call meets the drafter's weights after the target's forward has streamed
its own (~0.5 GB here) through every cache. Timed warm, one layer shape of a drafter sits in the L3 and the fp32 paths
win at 4+ rows; cold, the fp16 copies do (a 2-core Zen 4, the head's layers at 4 rows: 0.48 against 0.70 ms, its
scorer 0.38 against 0.63; a live head step 2.65 -> 2.30 ms: `scripts/cold_paths.py`).

Nothing is assumed: at load, `use_cpu_kernels` times every available path for the
body's largest layer shape and for the head, at every row bucket (1, 2, 4, ... 64) in
the model's dtype, and routes each bucket to the fastest path that beats stock by 10%
(`KernelTable`). The body is timed streaming through every layer of that shape (as a
forward does: the weights come from memory, not from a cache that one probe layer
would sit in), and the packed path at each of its prefetch distances (`PREFETCH`;
the kernel's lead on the weight stream, which more rows need longer), keeping the
best; candidates are timed in interleaved rounds and read by their median. A prompt's
prefill feeds the body far more rows: one more bucket (`PREFILL_ROWS`) times stock
against the packed kernels for the body alone (at their longest prefetch distance,
over a few layers: at that many rows the product is bound by arithmetic, not by the
weight stream), and every longer batch takes its path (on a 2-core Zen 5, fp32: the
AVX-512 kernel 1.4-2x stock from 64 to 512 rows, a bench prompt's prefill 199 -> 120
ms; the AVX2 kernel level with stock there). The head's rows above 64 stay stock (a
lazy prefill reads one logits row). Results agree with F.linear to float rounding, as
any batched forward does. No modeling code is changed; whatever the model does after
its head still runs. Every method that runs the model uses them, the Hugging Face
peers and AR included. Pair setting `small_batch_linear` (on by default;
CPU only).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, NamedTuple

import numpy as np
import torch
import torch.nn.functional as F

from .huge_pages import into_huge_pages, release_free_heap

BUCKETS = (1, 2, 4, 8, 16, 32, 64)  # row counts measured at load; a batch uses the smallest bucket >= its rows
PREFILL_ROWS = 256  # the body's bucket for every batch above BUCKETS[-1] (a prompt's prefill), measured at load
PREFILL_LAYERS, PREFILL_ROUNDS = 2, 3  # its timing: a few layers (bound by arithmetic there), a few rounds
MIN_GAIN = 0.9  # another path must take at most 90% of the stock time to be chosen
TRANSPOSED_COPY_MAX_BYTES = 512 << 20  # the head's transposed copy (for 1 row), if it is this small
PATHS = ("stock", "weight_left", "packed", "packed16", "packed16f")
WIDE_PATHS = ("packed16", "packed16f")  # the AVX-512 kernel's paths (pair switch `wide_kernel`)
PREFETCH = (128, 512, 1024)  # the packed kernel's prefetch distances (floats ahead on the weight stream) measured
STREAM_BYTES = 64 << 20  # the body's timing streams through at least this many bytes of weights (well past an L3)
SOURCE = Path(__file__).parent / "kernels" / "packed_gemm.cpp"
SOURCE16 = Path(__file__).parent / "kernels" / "packed16_gemm.cpp"
SOURCE16H = Path(__file__).parent / "kernels" / "packed16h_gemm.cpp"
SOURCE8H = Path(__file__).parent / "kernels" / "packed8h_gemm.cpp"
HALF_PATHS = ("packed16h", "packed8h")  # a drafter's paths only (`half_weights`): fp16 weights, fp32 products


@dataclass
class KernelTable:
    """Per row bucket, the path each part takes; ms measured per path."""

    body: dict[int, str] = field(default_factory=dict)
    head: dict[int, str] = field(default_factory=dict)
    ms: dict[str, dict[int, dict[str, float]]] = field(default_factory=dict)  # part -> rows -> path -> ms
    prefetch: dict[str, dict[int, int]] = field(default_factory=dict)  # part -> rows -> the packed path's distance
    cold: bool = False  # timed with the caches emptied before each call (a drafter's: `cold_clock`)

    @staticmethod
    def bucket(rows: int) -> int:
        return next((b for b in BUCKETS if rows <= b), PREFILL_ROWS)

    def path(self, part: str, rows: int) -> str:
        return getattr(self, part).get(self.bucket(rows), "stock")

    def distance(self, part: str, rows: int) -> int:
        """The packed kernel's prefetch distance at this row count (the first of PREFETCH where not measured)."""
        return self.prefetch.get(part, {}).get(self.bucket(rows), PREFETCH[0])


_ops: dict[str, object] = {}


def packed_ops():
    """The packed kernel's module (built once per machine, then loaded from torch's extension cache), or None
    where it cannot run here (the reason in `packed_unavailable()`)."""
    if "ops" not in _ops:
        _ops["ops"], _ops["why"] = None, ""
        cap = torch.backends.cpu.get_cpu_capability()
        if cap not in ("AVX2", "AVX512"):
            _ops["why"] = f"this CPU's vector capability is {cap}, the kernel needs AVX2 + FMA"
        else:
            from torch.utils.cpp_extension import load

            for name, omp in (("treegraft_packed_gemm_v10", ["-fopenmp"]), ("treegraft_packed_gemm_v10_serial", [])):
                try:  # a compiler without OpenMP (Apple clang) builds the serial variant
                    _ops["ops"] = load(name, [str(SOURCE)], extra_cflags=["-O3", "-mavx2", "-mfma", *omp],
                                       extra_ldflags=omp, verbose=False)
                    break
                except Exception as err:  # no compiler, no ninja, a read-only cache: the other paths remain
                    error = err
            else:
                _ops["why"] = f"could not build kernels/packed_gemm.cpp ({type(error).__name__}: {str(error)[:200]})"
    return _ops["ops"]


def _extra_ops(key: str, name: str, source: Path, isa: list[str]):
    """Another kernel's module, built once per machine like the AVX2 one (serial where that one is, with the ISA
    flags `isa`), or None where the AVX2 kernel is not built here, the CPU lacks AVX-512 for an AVX-512 kernel, or
    the build fails (the other paths remain)."""
    if key not in _ops:
        _ops[key] = None
        avx512_ok = "-mavx512f" not in isa or torch.backends.cpu.get_cpu_capability() == "AVX512"
        if avx512_ok and packed_ops() is not None:
            from torch.utils.cpp_extension import load

            omp = ["-fopenmp"] if "serial" not in getattr(_ops["ops"], "__name__", "") else []
            try:
                _ops[key] = load(name + ("" if omp else "_serial"), [str(source)],
                                 extra_cflags=["-O3", *isa, "-mfma", *omp], extra_ldflags=omp, verbose=False)
            except Exception:
                _ops[key] = None
    return _ops[key]


def packed16_ops():
    """The AVX-512 packed kernel's module (kernels/packed16_gemm.cpp: blocks of 16 output rows, up to 16 rows of x a
    pass, bit-equal to the AVX2 kernel), or None where the CPU lacks AVX-512 or the build fails."""
    return _extra_ops("ops16", "treegraft_packed16_gemm_v16", SOURCE16, ["-mavx512f"])


def packed16h_ops():
    """The AVX-512 packed kernel on fp16 copies of the weights (kernels/packed16h_gemm.cpp; a drafter's path, see
    `half_weights`), or None where the CPU lacks AVX-512 or the build fails."""
    return _extra_ops("ops16h", "treegraft_packed16h_gemm_v14", SOURCE16H, ["-mavx512f"])


def packed8h_ops():
    """The AVX2 + F16C packed kernel on fp16 copies of the weights (kernels/packed8h_gemm.cpp; a drafter's path, see
    `half_weights`; bit-equal to the AVX2 kernel on rounded weights), or None where that kernel is not built here."""
    return _extra_ops("ops8h", "treegraft_packed8h_gemm_v3", SOURCE8H, ["-mavx2", "-mf16c"])


@torch.no_grad()
def half_weights(model: torch.nn.Module, keep: set[int] = frozenset()) -> int:
    """Round the fp32 weights of the model's Linear layers to fp16 precision, in place (fp32 tensors still), and
    return how many were rounded: a drafter's setting (`PairConfig.half_drafter`), so that every path computes on
    the same weights and `packed16h` / `packed8h` can read them as fp16, half the bytes. Layers whose weight shares
    storage with `keep` (data pointers of the target's parameters: a mid LM's shared output head) are left as they
    are; the target is never rounded, so its greedy output stays exact."""
    n = 0
    for m in model.modules():
        if isinstance(m, torch.nn.Linear) and m.weight.dtype == torch.float32 \
                and m.weight.untyped_storage().data_ptr() not in keep:
            m.weight.copy_(m.weight.half().float())
            n += 1
    return n


class PackedKernel(NamedTuple):
    """A packed path (it takes a prefetch distance)."""

    attr: str  # the layer attribute holding its packed weight
    ops: Callable  # () -> the kernel's built module, or None
    block: int  # output rows per packed block
    fn: str = "packed_linear"  # the module's function


# "packed16f" is packed16 on the same packed weight with its rows in passes of 12 and the rest last (packed_micro.h)
PACKED_KERNELS = {"packed": PackedKernel("weight_packed", packed_ops, 8),
                  "packed16": PackedKernel("weight_packed16", packed16_ops, 16),
                  "packed16f": PackedKernel("weight_packed16", packed16_ops, 16, "packed_linear_full_first"),
                  "packed16h": PackedKernel("weight_packed16h", packed16h_ops, 16),
                  "packed8h": PackedKernel("weight_packed8h", packed8h_ops, 8)}
PACKED_ATTRS = tuple(dict.fromkeys(k.attr for k in PACKED_KERNELS.values()))  # each packed copy a layer may hold


def packed_threads() -> int:
    """How many of torch's intra-op threads the packed kernel runs on here (0 where it is not built)."""
    ops = packed_ops()
    return 0 if ops is None else int(ops.threads_used())


def packed_unavailable() -> str:
    packed_ops()
    return _ops["why"]


def packable(layer: torch.nn.Linear, block: int = 8) -> bool:
    return layer.weight.dtype == torch.float32 and layer.out_features % block == 0


def _product(layer: torch.nn.Linear, path: str, prefetch: int, rows: int):
    """x [rows, in] -> x . W^T [rows, out] on `path` for that many rows (bias aside), as one call with its operands
    bound: a decoding forward runs ~200 of these, so the per-call Python is what is cut. A packed path whose
    packed weight this layer lacks runs stock."""
    k = PACKED_KERNELS.get(path)
    if k is not None and getattr(layer, k.attr, None) is not None:
        kernel, packed = getattr(k.ops(), k.fn), getattr(layer, k.attr)
        return lambda x: kernel(x, packed, prefetch)
    w = layer.weight
    if path == "weight_left":
        if rows == 1 and getattr(layer, "weight_t", None) is not None:  # the tall head's transposed copy
            wt = layer.weight_t
            return lambda x: x @ wt
        return lambda x: (w @ x.T).T
    return lambda x: F.linear(x, w)


def run_path(layer: torch.nn.Linear, path: str, x: torch.Tensor, prefetch: int = PREFETCH[0]) -> torch.Tensor:
    """The layer's output for x [..., in] on `path` (what `measure` times; a routed forward binds the same
    products once, `routed_forward`)."""
    rows = x.numel() // x.shape[-1]
    y = _product(layer, path, prefetch, rows)(x.reshape(rows, -1))  # [rows, out]
    if layer.bias is not None:
        y = y + layer.bias
    return y.reshape(*x.shape[:-1], -1)


def routed_forward(layer: torch.nn.Linear, part: str, table: KernelTable):
    """The layer's forward routed by `table`: each row count's product (`_product`) looked up by index."""
    by_rows = [lambda x: x.new_zeros(0, layer.out_features)] + [  # no rows (an empty prompt's features)
        _product(layer, table.path(part, r), table.distance(part, r), r) for r in range(1, BUCKETS[-1] + 1)]
    longer = _product(layer, table.path(part, PREFILL_ROWS), table.distance(part, PREFILL_ROWS), PREFILL_ROWS)
    k, n, bias = layer.in_features, layer.out_features, layer.bias

    def forward(x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // k
        y = (by_rows[rows] if rows <= BUCKETS[-1] else longer)(x.reshape(rows, k))  # [rows, out]
        if bias is not None:
            y = y + bias
        return y.reshape(*x.shape[:-1], n)

    return forward


def _once_ms(fn, rows: int, candidate: tuple[str, int]) -> float:
    t0 = time.perf_counter()
    fn()
    return 1000 * (time.perf_counter() - t0)


def cold_clock(evict_bytes: int = STREAM_BYTES):
    """A clock (as `_once_ms`) that first reads through `evict_bytes` of other memory, untimed, so the weights come
    from memory as they do in a drafter's call right after a target forward (module docstring)."""
    other = torch.ones(evict_bytes // 4)

    def clock(fn, rows: int, candidate: tuple[str, int]) -> float:
        _evict(other)
        return _once_ms(fn, rows, candidate)

    return clock


def _evict(other: torch.Tensor) -> None:
    float(other.sum())  # reads every byte: the caches now hold this, not the weights


@torch.no_grad()
def measure(layers: torch.nn.Linear | list[torch.nn.Linear], part: str, rounds: int = 5, clock=_once_ms,
            paths=PATHS, prefill: bool = False) -> tuple[dict[int, dict[str, float]], dict[int, int]]:
    """({rows: {path: ms per layer}}, {rows: the packed path's best prefetch distance}) at every bucket, in the
    layers' dtype (one shape), for the paths they can take here. Each timing runs the path over every layer in
    turn, so that with enough of them the weights stream from memory as in a forward. Per bucket, the candidates
    (a path, at each of its distances) are timed in `rounds` interleaved rounds after one warm-up round and read
    by their median, so a burst of other load hits them alike. `prefill`: also the PREFILL_ROWS bucket (stock
    and the packed paths at their longest distance, over PREFILL_LAYERS layers, PREFILL_ROUNDS rounds).
    `clock(fn, rows, (path, distance))`: ms of one call."""
    layers = layers if isinstance(layers, list) else [layers]
    ms, prefetch = {}, {}
    for rows in BUCKETS:
        ms[rows], prefetch[rows] = _time_bucket(layers, rows, _candidates(paths), rounds, clock)
    if prefill:
        cands = [(p, PREFETCH[-1] if p in PACKED_KERNELS else PREFETCH[0]) for p in paths if p != "weight_left"]
        ms[PREFILL_ROWS], prefetch[PREFILL_ROWS] = _time_bucket(layers[:PREFILL_LAYERS], PREFILL_ROWS, cands,
                                                                PREFILL_ROUNDS, clock)
    return ms, {rows: d for rows, d in prefetch.items() if d is not None}


def _time_bucket(layers: list[torch.nn.Linear], rows: int, cands: list[tuple[str, int]], rounds: int,
                 clock) -> tuple[dict[str, float], int | None]:
    """({path: median ms per layer}, the fastest packed candidate's distance or None) at one row count."""
    probe = layers[0]
    x = torch.randn(1, rows, probe.in_features, dtype=probe.weight.dtype)
    times = {c: [] for c in cands}
    for r in range(rounds + 1):
        for p, d in cands:
            t = clock(lambda p=p, d=d: [run_path(m, p, x, d) for m in layers], rows, (p, d)) / len(layers)
            if r:  # round 0 warms up
                times[(p, d)].append(t)
    ms, fastest, distance = {}, float("inf"), None
    for (p, d), ts in times.items():
        t = float(np.median(ts))
        ms[p] = min(t, ms.get(p, float("inf")))
        if p in PACKED_KERNELS and t < fastest:  # the fastest packed kernel's distance (`choose` may pick it)
            distance, fastest = d, t
    return ms, distance


def choose(ms: dict[int, dict[str, float]]) -> dict[int, str]:
    """Per bucket: the fastest path, if it takes at most MIN_GAIN of the stock time; else stock."""
    out = {}
    for rows, t in ms.items():
        best = min(t, key=t.get)
        out[rows] = best if t[best] <= MIN_GAIN * t["stock"] else "stock"
    return out


def _pack(layer: torch.nn.Linear, path: str = "packed") -> None:
    k = PACKED_KERNELS[path]
    setattr(layer, k.attr, k.ops().pack(layer.weight.detach()))


def _candidates(paths) -> list[tuple[str, int]]:
    """(path, prefetch distance) pairs a bucket's timing tries: every distance of a packed path, one otherwise."""
    return [(p, d) for p in paths for d in (PREFETCH if p in PACKED_KERNELS else PREFETCH[:1])]


def _copies(paths) -> dict[str, str]:
    """{packed-weight attribute: a path of `paths` that reads it}: one copy serves every path on it (packed16 and
    packed16f share theirs)."""
    return {PACKED_KERNELS[p].attr: p for p in sorted(set(paths) & set(PACKED_KERNELS))}


def _pack_for(layers: list[torch.nn.Linear], paths) -> None:
    """Pack each layer's weight once for every packed copy the paths read (on huge pages, as a forward reads them)."""
    for path in _copies(paths).values():
        for m in layers:
            _pack(m, path)
    _onto_huge_pages(layers)


def _onto_huge_pages(layers: list[torch.nn.Linear]) -> None:
    """Every packed copy of these layers moved into one huge-page region (`huge_pages.py`; bit-equal values)."""
    held = [(m, attr) for m in layers for attr in PACKED_ATTRS if getattr(m, attr, None) is not None]
    for (m, attr), t in zip(held, into_huge_pages([getattr(m, attr) for m, attr in held])):
        setattr(m, attr, t)
    release_free_heap()  # the plain copies just dropped


def _paths_for(probe: torch.nn.Linear, can_pack: bool, allowed=PATHS) -> tuple[str, ...]:
    """The paths a layer of this shape can take here (of `allowed`)."""
    paths = ["stock", "weight_left"]
    if can_pack and packable(probe):
        paths.append("packed")
        if packed16_ops() is not None and packable(probe, 16):
            paths += list(WIDE_PATHS)
        if "packed16h" in allowed and packed16h_ops() is not None and packable(probe, 16):
            paths.append("packed16h")
        if "packed8h" in allowed and packed8h_ops() is not None:
            paths.append("packed8h")
    return tuple(p for p in paths if p in allowed or p == "stock")


def use_cpu_kernels(model: torch.nn.Module, table: KernelTable | None = None, allowed=PATHS,
                    prefill: bool = True, cold: bool = False) -> KernelTable:
    """Route the model's Linear layers and its output head through the fastest path per row bucket, measured
    here (or as `table` says). Returns the table (also at `model.kernel_table`). Copies of a weight (packed,
    transposed) are kept only where the table uses them. `prefill`: the body also gets the PREFILL_ROWS bucket
    (a model that reads prompts; not a drafter's scorer, which sees a pool of a few nodes). `cold`: time each call
    with the caches emptied first (`cold_clock`; a drafter's, module docstring)."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    head = head if isinstance(head, torch.nn.Linear) else None
    body = [m for m in model.modules() if isinstance(m, torch.nn.Linear) and m is not head]
    if head is not None:
        w = head.weight
        small = w.numel() * w.element_size() <= TRANSPOSED_COPY_MAX_BYTES
        head.weight_t = w.detach().t().contiguous() if small else None  # [hidden, V]
    parts = {"body": [m for m in body if packable(m)], "head": [head] if head is not None and packable(head) else []}
    can_pack = bool(parts["body"] or parts["head"]) and packed_ops() is not None
    if table is None:
        table = KernelTable(cold=cold)
        for part, layers in (("body", body), ("head", [head] if head is not None else [])):
            if not layers:
                continue
            probe = max(layers, key=lambda m: m.weight.numel())
            same = [m for m in layers if m.weight.shape == probe.weight.shape and m.weight.dtype == probe.weight.dtype]
            stream = same[:max(1, -(-STREAM_BYTES // (probe.weight.numel() * probe.weight.element_size())))]
            paths = _paths_for(probe, can_pack, allowed)
            _pack_for(stream, paths)
            table.ms[part], table.prefetch[part] = measure(
                stream, part, paths=paths, prefill=prefill and part == "body", clock=cold_clock() if cold else _once_ms)
            setattr(table, part, choose(table.ms[part]))
    for part, layers in parts.items():  # keep exactly the packed copies the table's paths read
        used = _copies(p for p in getattr(table, part).values() if p in PACKED_KERNELS and PACKED_KERNELS[p].ops())
        for attr in PACKED_ATTRS:
            for m in layers:
                if attr not in used:
                    setattr(m, attr, None)
                elif getattr(m, attr, None) is None and packable(m, PACKED_KERNELS[used[attr]].block):
                    _pack(m, used[attr])
    _onto_huge_pages(parts["body"] + parts["head"])  # the kept copies, side by side (the timing's are dropped)
    if head is not None and table.head.get(1) != "weight_left":
        head.weight_t = None  # the copy is not used: do not keep it
    for m in body:
        m.kernels = table
        m.forward = routed_forward(m, "body", table)
    if head is not None:
        head.kernels = table
        head.forward = routed_forward(head, "head", table)
    model.kernel_table = table
    return table


DTYPE_ROWS = (1, 8)  # what `decode_dtype` compares: a one-token forward (AR, a head call) and a verification's rows


@torch.no_grad()
def decode_dtype(out_features: int, in_features: int, allowed=PATHS, rounds: int = 3, clock=_once_ms
                 ) -> tuple[torch.dtype, dict[str, float]]:
    """Dtype `auto` on a CPU with native bf16 (`models.pick_dtype`): bf16 only where it measures faster here.

    Native bf16 halves the bytes a decoding step streams, but on some such CPUs the bf16 products of a few rows are
    slower than the fp32 ones these paths give (a 2-core Zen 4 EPYC with AVX512-BF16 and no AMX, a [1,536 x 576]
    layer: bf16 stock 0.28 ms at 1 row, fp32 packed16 0.11 ms; AR 16.7 against 25-27 tok/s), and bf16 also gives
    up the exact match with the one-token forward (batched and single rows round differently). So this times one
    decoder shape [out, in] (random weights, enough layers to stream from memory) at `DTYPE_ROWS` rows: fp32 on
    every path it can take here (of `allowed`), bf16 on stock and weight_left, in interleaved rounds, each read by its
    median; bf16 is kept where its summed best time is at most MIN_GAIN of fp32's. Returns (the dtype,
    {"float32": ms, "bfloat16": ms} summed over DTYPE_ROWS)."""
    g = torch.Generator().manual_seed(0)
    count = max(1, -(-STREAM_BYTES // (out_features * in_features * 4)))
    fp32 = []
    for _ in range(count):
        layer = torch.nn.Linear(in_features, out_features, bias=False)
        layer.weight.copy_(torch.randn(out_features, in_features, generator=g) / in_features ** 0.5)
        fp32.append(layer.requires_grad_(False))
    bf16 = [torch.nn.Linear(in_features, out_features, bias=False, dtype=torch.bfloat16).requires_grad_(False)
            for _ in fp32]
    for a, b in zip(fp32, bf16):
        b.weight.copy_(a.weight)
    paths32 = _paths_for(fp32[0], packed_ops() is not None, allowed)
    _pack_for(fp32, paths32)
    total = {"float32": 0.0, "bfloat16": 0.0}
    for rows in DTYPE_ROWS:
        best = {"float32": [], "bfloat16": []}
        for name, layers, paths in (("float32", fp32, paths32), ("bfloat16", bf16, ("stock", "weight_left")),
                                    ("bfloat16", bf16, ("stock", "weight_left")), ("float32", fp32, paths32)):
            best[name].append(min(_time_bucket(layers, rows, _candidates(paths), rounds, clock)[0].values()))
        for name, ms in best.items():
            total[name] += float(np.mean(ms))  # the two passes, one before and one after the other dtype's
    return (torch.bfloat16 if total["bfloat16"] <= MIN_GAIN * total["float32"] else torch.float32), total
