"""The CPU paths compute what F.linear computes, and are chosen per row bucket by what the host measures."""
import pytest
import torch
import torch.nn.functional as F

from treegraft.cpu_kernels import (BUCKETS, PREFETCH, PREFILL_ROWS, KernelTable, choose, measure, packed16_ops, packed_ops,
                                  packed_threads, packed_unavailable, use_cpu_kernels)

FORCED = {p: {b: p for b in BUCKETS + (PREFILL_ROWS,)} for p in ("stock", "weight_left", "packed", "packed16", "packed16f")}


def inputs(features: int):
    return {rows: torch.randn(1, rows, features, generator=torch.Generator().manual_seed(rows))
            for rows in (1, 2, 3, 5, 8, 13, 40, 64, 70, 300)}


class WithHead(torch.nn.Module):
    def __init__(self, bias=False):
        super().__init__()
        self.body = torch.nn.Linear(32, 48, bias=bias)
        self.lm_head = torch.nn.Linear(48, 504, bias=False)

    def get_output_embeddings(self):
        return self.lm_head


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("forced", ["weight_left", "packed", "packed16", "packed16f", "stock"])
def test_every_path_matches_stock_at_every_row_count(bias, forced):
    if forced == "packed" and packed_ops() is None:
        pytest.skip(f"packed kernel not available here: {packed_unavailable()}")
    if forced.startswith("packed16") and packed16_ops() is None:
        pytest.skip("the AVX-512 packed kernel needs a CPU with AVX-512")
    torch.manual_seed(0)
    model = WithHead(bias)
    xs = inputs(32)
    ref = {rows: F.linear(x, model.body.weight, model.body.bias) for rows, x in xs.items()}
    head_ref = {rows: F.linear(r, model.lm_head.weight) for rows, r in ref.items()}
    use_cpu_kernels(model, KernelTable(body=dict(FORCED[forced]), head=dict(FORCED[forced])))
    for rows, want in ref.items():
        got = model.body(xs[rows])
        assert got.shape == want.shape
        if forced == "stock":
            assert torch.equal(got, want)  # the stock path
        else:
            assert torch.allclose(got, want, atol=1e-5)
        head = model.lm_head(want)
        assert head.shape == head_ref[rows].shape and torch.allclose(head, head_ref[rows], atol=1e-5)
    assert model.body(torch.zeros(1, 0, 32)).shape == (1, 0, 48)  # no rows (an empty prompt's features): no rows
    assert (model.lm_head.weight_t is not None) == (forced == "weight_left")  # the 1-row copy only when used
    assert (model.body.weight_packed is not None) == (forced == "packed")  # the packed copy only when used
    assert (getattr(model.body, "weight_packed16", None) is not None) == forced.startswith("packed16")


def test_a_packed_row_does_not_depend_on_its_batch():
    """The packed kernel computes each output as one FMA chain over k, whatever the number of rows: a row
    computed alone equals the same row computed among 1-40 others, bit for bit, at every row count (1-4 rows read
    several blocks side by side, 7-8 one, 5-6 and 9+ take tiles of 4-6 rows x 2-3 blocks over groups of 6 blocks:
    25 blocks leave a remainder for each group, tile and thread's share; an odd K leaves one for the k loop)."""
    if packed_ops() is None:
        pytest.skip(f"packed kernel not available here: {packed_unavailable()}")
    torch.manual_seed(1)
    for k in (576, 577):
        layer = torch.nn.Linear(k, 200, bias=False)
        use_cpu_kernels(layer, KernelTable(body=dict(FORCED["packed"])))
        x = torch.randn(40, k)
        alone = torch.cat([layer(x[i:i + 1]) for i in range(40)])
        for rows in range(2, 41):
            assert torch.equal(layer(x[:rows]), alone[:rows]), (k, rows)
        assert torch.allclose(alone, x @ layer.weight.T, atol=1e-5)


def test_the_avx512_kernel_is_bit_equal_to_the_avx2_one_at_every_row_count():
    """Both packed kernels compute each output as the same FMA chain over k, so a table that routes 1 row to one
    and 16 rows to the other still gives a tree row equal to the one-token forward's, bit for bit."""
    if packed16_ops() is None:
        pytest.skip("the AVX-512 packed kernel needs a CPU with AVX-512")
    torch.manual_seed(2)
    layer = torch.nn.Linear(576, 208, bias=False)  # 13 blocks of 16: a remainder for each thread's share
    x = torch.randn(40, 576)
    use_cpu_kernels(layer, KernelTable(body=dict(FORCED["packed"])))
    alone = torch.cat([layer(x[i:i + 1]) for i in range(40)])  # the AVX2 kernel, one row at a time
    for path in ("packed16", "packed16f"):  # passes as even as possible, or of 12 and the rest last
        use_cpu_kernels(layer, KernelTable(body=dict(FORCED[path])))
        for rows in range(1, 41):  # every pass size 1-12 is read
            assert torch.equal(layer(x[:rows]), alone[:rows]), (path, rows)


def test_the_packed_kernel_runs_on_torchs_threads():
    """The kernel's blocks are split over torch's intra-op threads (an extension built without OpenMP runs
    at::parallel_for on one thread: it did, unnoticed, until this test)."""
    if packed_ops() is None:
        pytest.skip(f"packed kernel not available here: {packed_unavailable()}")
    threads = torch.get_num_threads()
    try:
        for n in (1, 2, 3):
            torch.set_num_threads(n)
            assert packed_threads() == n
    finally:
        torch.set_num_threads(threads)


def test_the_measured_table_follows_the_clock():
    """Which path each bucket takes is decided by timings, not constants: with a clock under which the
    alternative wins only up to 4 rows, exactly those buckets use it."""
    layer = torch.nn.Linear(16, 16)

    def clock(fn, rows, candidate):
        clock.calls.append((rows, candidate))
        return (1.0 if rows <= 4 else 3.0) if candidate[0] == "weight_left" else 2.0

    clock.calls = []
    ms, _ = measure(layer, "body", clock=clock, paths=("stock", "weight_left"))
    assert choose(ms) == {b: "weight_left" if b <= 4 else "stock" for b in BUCKETS}
    assert len(clock.calls) == len(BUCKETS) * 2 * 6  # every candidate: a warm-up round and 5 timed ones
    assert all(rows in BUCKETS for rows, _ in clock.calls)  # no prefill bucket unless asked for
    assert choose({8: {"stock": 10.0, "weight_left": 9.5}}) == {8: "stock"}  # 5% is within noise: stay stock
    assert choose({8: {"stock": 10.0, "weight_left": 8.0, "packed": 5.0}}) == {8: "packed"}  # the fastest


def test_a_prompts_prefill_takes_the_path_measured_for_it():
    """Batches above the last decoding bucket (a prompt's prefill) take the path the PREFILL_ROWS bucket measured
    for the layers, which can differ from the 64-row one; the head's rows there stay stock; and the prefill
    bucket times stock against the packed kernel at one distance, over at most PREFILL_LAYERS layers."""
    from treegraft.cpu_kernels import PREFILL_LAYERS

    layers = [torch.nn.Linear(16, 16) for _ in range(4)]

    def clock(fn, rows, candidate):
        clock.calls.append((rows, candidate))
        if candidate[0] == "stock":
            return 2.0
        return 3.0 if rows <= 64 else 1.0  # the packed kernel loses at decoding sizes, wins on a prompt

    clock.calls = []
    ms, prefetch = measure(layers, "body", clock=clock, paths=("stock", "weight_left", "packed"), prefill=True)
    prefill_calls = [c for rows, c in clock.calls if rows == PREFILL_ROWS]
    assert {c for c in prefill_calls} == {("stock", PREFETCH[0]), ("packed", PREFETCH[-1])}
    table = KernelTable(body=choose(ms), head={b: "packed" for b in BUCKETS}, prefetch={"body": prefetch})
    assert [table.path("body", n) for n in (1, 64, 65, 256, 4000)] == ["stock", "stock", "packed", "packed", "packed"]
    assert table.distance("body", 300) == PREFETCH[-1]
    assert table.path("head", 64) == "packed" and table.path("head", 65) == "stock"
    timed = []
    measure(layers, "body", clock=lambda fn, rows, c: timed.append(len(fn())) or 1.0, paths=("stock",), prefill=True)
    assert max(timed) == len(layers) and timed[-1] == PREFILL_LAYERS


def test_the_packed_paths_prefetch_distance_is_measured_per_bucket():
    """The packed kernel's lead on the weight stream is chosen per row bucket by the clock (more rows keep the
    FMAs busier, so the stream needs a longer lead): here the shortest distance wins at 1-2 rows, the longest
    above; one slow sample of a candidate (a burst of other load) does not decide, the median does."""
    layer = torch.nn.Linear(16, 16)

    def clock(fn, rows, candidate):
        path, distance = candidate
        clock.calls += 1
        if path != "packed":
            return 9.0
        best = PREFETCH[0] if rows <= 2 else PREFETCH[-1]
        slow = clock.calls % 7 == 0 and distance == best  # now and then the winner is timed under load
        return (1.0 if distance == best else 2.0) * (10 if slow else 1)

    clock.calls = 0
    ms, prefetch = measure(layer, "body", clock=clock, paths=("stock", "packed"))
    assert prefetch == {b: PREFETCH[0] if b <= 2 else PREFETCH[-1] for b in BUCKETS}
    assert all(ms[b]["packed"] == 1.0 for b in BUCKETS)
    table = KernelTable(body=choose(ms), prefetch={"body": prefetch})
    assert table.distance("body", 3) == PREFETCH[-1] and table.distance("body", 100) == PREFETCH[0]  # not measured


def test_loading_measures_a_table_on_this_host():
    model = WithHead()
    table = use_cpu_kernels(model)
    assert model.kernel_table is table
    assert set(table.body) == set(BUCKETS) | {PREFILL_ROWS} and set(table.head) == set(BUCKETS)
    assert all(t > 0 for per in table.ms["body"].values() for t in per.values())
    assert ("packed" in table.ms["body"][1]) == (packed_ops() is not None)
    x = torch.randn(1, 3, 32)
    assert torch.allclose(model.body(x), F.linear(x, model.body.weight, model.body.bias), atol=1e-5)


def test_a_drafters_scorer_runs_on_the_measured_paths():
    """A mid drafter's output rows (a pool of a few nodes a call) get a table measured here; every row count gives
    the stock product, and the rows are the drafter's own tensor, not a copy."""
    from treegraft.drafters.neural import draft_output

    rows = torch.randn(64, 32)
    scorer, _, _ = draft_output(rows, 64, None, small_batch=True)
    assert scorer.weight.data_ptr() == rows.data_ptr()
    assert set(scorer.kernel_table.body) == set(BUCKETS)
    for n in (1, 3, 8, 17, 70):
        x = torch.randn(n, 32)
        assert torch.allclose(scorer(x), x @ rows.T, atol=1e-5), n
    assert not hasattr(draft_output(rows, 64, None, small_batch=False)[0], "kernel_table")


def test_a_drafters_paths_are_timed_cold_and_a_targets_warm(monkeypatch):
    """A drafter's call meets its weights after the target's forward has streamed its own through every cache, so a
    drafter's paths are timed cold: every timed call of its scorer follows an untimed read through STREAM_BYTES of
    other memory. A target's layers are timed streaming through themselves, with no such read; each table says which."""
    import treegraft.cpu_kernels as ck
    from treegraft.drafters.neural import draft_output

    events, clock = [], ck._once_ms

    def evict(other):
        assert other.numel() * other.element_size() >= ck.STREAM_BYTES
        events.append("evict")

    def once(fn, rows, candidate):
        events.append("time")
        return clock(fn, rows, candidate)

    monkeypatch.setattr(ck, "_evict", evict)
    monkeypatch.setattr(ck, "_once_ms", once)
    scorer, _, _ = draft_output(torch.randn(64, 32), 64, None, small_batch=True)
    assert scorer.kernel_table.cold
    assert events and events == ["evict", "time"] * (len(events) // 2)
    events.clear()
    model = WithHead()
    assert not use_cpu_kernels(model).cold
    assert events and set(events) == {"time"}


def test_the_default_pairs_head_is_timed_cold_and_its_target_warm(fp32_pair):
    from treegraft.drafters import make_mid_drafter

    assert fp32_pair.mid.kernel_table.cold and make_mid_drafter(fp32_pair).scorer.kernel_table.cold
    assert not fp32_pair.target.kernel_table.cold


@pytest.mark.parametrize("path", ["packed16h", "packed8h"])
def test_the_fp16_weight_kernel_is_the_fp32_product_of_the_rounded_weights_whatever_the_batch(path):
    """packed16h / packed8h (a drafter's paths, `half_drafter`): fp16 copies of the weights, fp32 FMA chains over k,
    so on weights already rounded to fp16 they compute what F.linear computes on them (packed8h: bit for bit what
    the fp32 AVX2 kernel computes), and a row does not depend on its batch; on the original weights they are off
    by the rounding alone."""
    from treegraft.cpu_kernels import PACKED_KERNELS, half_weights

    attr, ops = PACKED_KERNELS[path][:2]
    if ops() is None:
        pytest.skip(f"the {path} kernel needs " + ("a CPU with AVX-512" if path == "packed16h" else "AVX2 + F16C"))
    torch.manual_seed(3)
    layer = torch.nn.Linear(576, 208, bias=True)  # 26 blocks of 8, 13 of 16: remainders for tiles and threads
    exact = layer.weight.detach().clone()
    x = torch.randn(40, 576)
    assert half_weights(layer) == 1 and torch.equal(layer.weight, exact.half().float())
    use_cpu_kernels(layer, KernelTable(body={b: path for b in BUCKETS + (PREFILL_ROWS,)}))
    assert getattr(layer, attr).dtype == torch.float16
    alone = torch.cat([layer(x[i:i + 1]) for i in range(40)])
    for rows in range(2, 41):
        assert torch.equal(layer(x[:rows]), alone[:rows]), rows
    assert torch.allclose(alone, F.linear(x, layer.weight, layer.bias), atol=1e-5)
    assert not torch.allclose(alone, F.linear(x, exact, layer.bias), atol=1e-6)  # the rounding shows
    assert torch.allclose(alone, F.linear(x, exact, layer.bias), atol=5e-3)
    if path == "packed8h" and packed_ops() is not None:
        use_cpu_kernels(layer, KernelTable(body=dict(FORCED["packed"])))
        assert torch.equal(torch.cat([layer(x[i:i + 1]) for i in range(40)]), alone)  # the fp32 kernel's chains


def test_a_half_drafter_never_rounds_the_targets_weights():
    """`half_weights` leaves a layer whose weight is the target's (a mid LM's shared output head) as it is, and a
    drafter's scorer rounds a copy of the target's rows, never the rows themselves."""
    from treegraft.cpu_kernels import half_weights
    from treegraft.drafters.neural import draft_output

    model = WithHead()
    target_rows = torch.randn(504, 48)
    model.lm_head.weight = torch.nn.Parameter(target_rows, requires_grad=False)  # shared with "the target"
    before = target_rows.clone()
    body = model.body.weight.detach().clone()
    assert half_weights(model, keep={target_rows.untyped_storage().data_ptr()}) == 1
    assert torch.equal(model.lm_head.weight, before) and torch.equal(model.body.weight, body.half().float())
    scorer, _, _ = draft_output(target_rows, 504, None, small_batch=True, half=True)
    assert scorer.weight.data_ptr() != target_rows.data_ptr() and torch.equal(target_rows, before)
    assert torch.equal(scorer.weight, before.half().float())


def test_the_default_pair_in_fp32_rounds_its_heads_weights_and_never_the_targets(fp32_pair):
    """The default pair sets `half_drafter`: loaded in fp32 on a CPU, the head's own layers and its scorer's rows
    hold fp16 values, the target's weights are as loaded (its greedy output stays exact: test_greedy_exact)."""
    from treegraft.drafters import make_mid_drafter

    assert fp32_pair.config.half_drafter and fp32_pair.dtype == torch.float32
    head = fp32_pair.mid
    for w in (head.fc.weight, head.body.layers[0].mlp.down_proj.weight):
        assert torch.equal(w, w.half().float())
    scorer = make_mid_drafter(fp32_pair).scorer
    assert torch.equal(scorer.weight, scorer.weight.half().float())
    for w in (fp32_pair.target.get_output_embeddings().weight, fp32_pair.target.model.layers[0].mlp.down_proj.weight):
        assert not torch.equal(w, w.half().float())


def test_auto_on_a_native_bf16_cpu_takes_bf16_only_where_it_measures_faster(monkeypatch):
    """decode_dtype keeps bf16 where its best time is at most 90% of fp32's (scripted timings, by the layers'
    dtype), and real timings on this host follow the same rule."""
    from treegraft import cpu_kernels

    real = cpu_kernels._time_bucket
    for bf16_ms, want in ((1.5, torch.float32), (0.5, torch.bfloat16), (0.95, torch.float32)):
        def scripted(layers, rows, cands, rounds, clock, bf16_ms=bf16_ms):
            ms = bf16_ms if layers[0].weight.dtype == torch.bfloat16 else 1.0
            return {p: ms for p, _ in cands}, None

        monkeypatch.setattr(cpu_kernels, "_time_bucket", scripted)
        dtype, ms = cpu_kernels.decode_dtype(64, 32)
        assert dtype == want and ms == pytest.approx({"float32": 2.0, "bfloat16": 2 * bf16_ms})
    monkeypatch.setattr(cpu_kernels, "_time_bucket", real)
    dtype, ms = cpu_kernels.decode_dtype(256, 64, rounds=1)
    assert ms["float32"] > 0 and ms["bfloat16"] > 0
    assert (dtype == torch.bfloat16) == (ms["bfloat16"] <= cpu_kernels.MIN_GAIN * ms["float32"])


def test_pick_dtype_measures_auto_only_on_a_cpu_with_native_bf16(monkeypatch):
    from treegraft import models

    asked = []

    def probe(answer):
        return lambda: asked.append(answer) or answer

    cpu = torch.device("cpu")
    monkeypatch.delenv(models.AUTO_DTYPE_ENV, raising=False)
    monkeypatch.setattr(models, "cpu_supports_bf16", lambda: False)
    assert models.pick_dtype("auto", cpu, probe(torch.bfloat16)) == torch.float32 and not asked
    monkeypatch.setattr(models, "cpu_supports_bf16", lambda: True)
    assert models.pick_dtype("auto", cpu, probe(torch.float32)) == torch.float32 and asked == [torch.float32]
    assert models.pick_dtype("auto", cpu) == torch.bfloat16  # no probe (training's autocast): the features decide
    assert models.pick_dtype("float32", cpu, probe(torch.bfloat16)) == torch.float32 and len(asked) == 1
    monkeypatch.setenv(models.AUTO_DTYPE_ENV, "bfloat16")
    assert models.pick_dtype("auto", cpu, probe(torch.float32)) == torch.bfloat16 and len(asked) == 1


def test_a_pairs_measured_auto_dtype_is_read_once_and_reported(monkeypatch):
    from treegraft import models
    from treegraft.config import load_pair

    monkeypatch.delenv(models.AUTO_DTYPE_ENV, raising=False)
    monkeypatch.setattr(models, "cpu_supports_bf16", lambda: True)
    calls = []

    def fake(out_features, in_features, allowed):
        calls.append((out_features, in_features, allowed))
        return torch.float32, {"float32": 1.0, "bfloat16": 1.5}

    monkeypatch.setattr(models, "decode_dtype", fake)
    monkeypatch.setattr(models, "AUTO_CHOICE", {})
    models._decode_dtype.cache_clear()
    try:
        pair = load_pair("default")
        assert models.pair_dtype(pair) == models.pair_dtype(pair, "auto") == torch.float32
        assert len(calls) == 1 and calls[0][:2] == (1536, 576) and "packed16" in calls[0][2]  # the target's MLP
        assert models.host()["auto_dtype"] == {"chose": "float32", "shape": [1536, 576], "float32_ms": 1.0,
                                               "bfloat16_ms": 1.5}
        assert models.pair_dtype(pair, "bfloat16") == torch.bfloat16 and len(calls) == 1
    finally:
        models._decode_dtype.cache_clear()
