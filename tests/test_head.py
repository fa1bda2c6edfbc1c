"""The draft head (treegraft/drafters/head.py) on a tiny target: scores at every node equal a sequential
computation over the node's path, across several mid steps and rounds; caches after rounds equal a plain
pass; save/load; the distillation loop runs and resumes."""
import numpy as np
import pytest
import torch

from tests.tiny import VOCAB, tiny_head, tiny_head_pair, tiny_model
from treegraft.config import DraftingConfig, GenerationConfig
from treegraft.drafters.head import HeadDrafter, load_head, node_levels, save_head
from treegraft.methods import MethodSpec, Policy
from treegraft.tree import MID, SMALL, DraftTree, add_child, mid_pool, path_to, unvisited_closure

ATOL = 1e-4
PROMPT = [3, 5, 7, 3, 5, 7, 3, 5, 9, 2]


@torch.no_grad()
def sequential_logq(head, target, committed: list[int], path: list[int]) -> torch.Tensor:
    """log q after committed + path, computed one position at a time with full causal passes (no cache):
    committed positions read the target's real features, drafted ones the head's own previous output."""
    real = head.fuse_features(real_features(target, head, committed[:-1]))  # [L - 1, H]
    seq = committed + path
    prev = [torch.zeros(real.shape[-1])] + list(real)  # prev[i] = input feature of position i
    for j in range(len(committed) - 1, len(seq)):
        f = head(torch.stack(prev[: j + 1])[None], torch.tensor([seq[: j + 1]]))[0, j]
        prev.append(f)
    rows = target.get_output_embeddings().weight
    return torch.log_softmax(f @ rows.T, -1)


def real_features(target, head, ids: list[int]) -> torch.Tensor:
    """[len(ids), in_features] the target's features over ids in one plain forward (with the head's taps)."""
    from treegraft.distill_head import target_features

    return target_features(target, torch.tensor([ids]), taps=head.taps, dtype=torch.float32)[0]


def assert_one_call_matches_sequential(drafter, head, target, seed: int) -> DraftTree:
    """One mid call on a tree of 12 random n-gram nodes: every pool node's scores equal `sequential_logq`."""
    tree = DraftTree.new(PROMPT[-1], capacity=60)
    grow(tree, np.random.default_rng(seed), 12, SMALL, 1)
    batch = unvisited_closure(tree, mid_pool(tree))
    scores = drafter.evaluate(tree, PROMPT, batch)
    for i, v in enumerate(batch.tolist()):
        ref = sequential_logq(head, target, PROMPT, [int(tree.token[u]) for u in path_to(tree, v)][1:])
        assert torch.allclose(scores.logq[i], ref, atol=ATOL)
    return tree


def grow(tree, rng, count, drafter, step):
    for _ in range(count):
        parent = int(rng.integers(0, tree.n))
        if tree.depth[parent] < 5:
            add_child(tree, parent, int(rng.integers(0, VOCAB)), -1.0, drafter, step)


@pytest.fixture(scope="module")
def tiny():
    target = tiny_model(1)
    return target, tiny_head(target)


@pytest.mark.parametrize("small_batch,prefilled,path", [(False, False, "stock"), (True, False, "stock"),
                                                       (False, True, "stock"), (True, True, "direct"),
                                                       (True, True, "fused"), (False, False, "fused")])
def test_head_matches_sequential(tiny, small_batch, prefilled, path):
    """Three mid steps on one tree: n-gram-grown nodes under unvisited parents are evaluated in levels; the
    scores the same whether the output rows run stock or on the measured small-batch CPU paths, whether
    the prompt was fed in the prefill or by the first call, and whether the head runs its body's forward, calls its
    layers directly, or runs the whole forward in one C++ call (`fused`; the sequential reference always runs the
    body's own forward)."""
    target, head = tiny
    assert head.check_direct()
    head.check_fused()
    if path == "fused" and head.fused is None:
        from treegraft.drafters.fused import fused_unavailable

        pytest.skip(fused_unavailable())
    head.direct = path != "stock"
    if path != "fused":
        head.fused = None
    drafter = HeadDrafter(head, target.get_output_embeddings().weight, VOCAB, small_batch=small_batch)
    assert hasattr(drafter.scorer, "kernel_table") == small_batch
    feats = target.model(input_ids=torch.tensor([PROMPT[:-1]])).last_hidden_state[0]
    drafter.start(feats)
    if prefilled:
        drafter.prefill(PROMPT)
        assert drafter.cached == drafter.cache.get_seq_length() == len(PROMPT) - 1
    rng = np.random.default_rng(0)
    tree = DraftTree.new(PROMPT[-1], capacity=200)
    grow(tree, rng, 6, SMALL, 1)
    for step in range(3):
        pool = mid_pool(tree)
        batch = unvisited_closure(tree, pool)
        scores = drafter.evaluate(tree, PROMPT, batch)
        tree.mid_visited[batch] = True
        for i, v in enumerate(batch.tolist()):
            path = [int(tree.token[u]) for u in path_to(tree, v)][1:]
            ref = sequential_logq(head, target, PROMPT, path)
            assert torch.allclose(scores.logq[i], ref, atol=ATOL), (step, v, (scores.logq[i] - ref).abs().max())
        grow(tree, rng, 8, MID if step % 2 else SMALL, step + 2)  # new nodes under visited and unvisited ones
    assert drafter.cached == len(PROMPT) - 1


@pytest.mark.parametrize("layers", [1, 2])
def test_the_direct_layer_path_is_bit_equal_to_the_body_forward(layers, monkeypatch):
    """`check_direct` finds the layers called in turn, each as the lean sequence of its own submodules
    (`lean_layer`), bit-equal to the body's own forward on a Llama-class head (so `load_head` turns both on), and so
    they are on a tree batch over a cache, lean or not; a layer class `lean_layer` does not know keeps the stock
    layer call, and a body whose forward does more than rotary -> layers -> norm fails the check and keeps its
    own forward."""
    from treegraft.drafters import head as head_module

    target = tiny_model(1)
    head = tiny_head(target, layers=layers)
    assert head.check_direct() and head.lean and head.fused is None  # the fused forward is the loader's call
    rng = np.random.default_rng(1)
    tree = DraftTree.new(PROMPT[-1], capacity=64)
    grow(tree, rng, 12, SMALL, 1)
    nodes = np.arange(tree.n)  # the root and every node, in levels
    scores = []
    for direct, lean in ((True, True), (True, False), (False, False)):
        drafter = HeadDrafter(head, target.get_output_embeddings().weight, VOCAB)
        head.direct, head.lean = direct, lean
        drafter.start(target.model(input_ids=torch.tensor([PROMPT[:-1]])).last_hidden_state[0])
        drafter.prefill(PROMPT)
        scores.append(drafter.evaluate(tree, PROMPT, nodes).logq)
    assert torch.equal(scores[0], scores[2]) and torch.equal(scores[1], scores[2])
    monkeypatch.setattr(head_module, "LEAN_LAYERS", ())
    assert head.check_direct() and not head.lean
    own = head.body.forward  # a model forward that scales its inputs first (as Gemma's does)
    head.body.forward = lambda inputs_embeds, **kw: own(inputs_embeds=inputs_embeds * 2.0, **kw)
    assert not head.check_direct() and not head.direct and not head.lean


def tree_pass(head, fused, seed: int = 0, past: int = 11, n: int = 7):
    """A prefix of `past` tokens, then a tree batch of n over it (random parents' features, ids, a random tree mask):
    (the batch's features [1, n, H], the cache's keys and values per layer), with `head.fused` set to `fused`."""
    from treegraft.kv import GrowingCache

    g = torch.Generator().manual_seed(seed)
    h = head.config.hidden_size
    feats, ids = torch.randn(1, past + n, h, generator=g), torch.randint(0, VOCAB, (1, past + n), generator=g)
    low = torch.finfo(torch.float32).min
    causal = torch.triu(torch.full((past, past), low), 1)[None, None]
    mask = torch.zeros(1, 1, n, past + n)
    mask[..., past:] = torch.where(torch.rand(n, n, generator=g) < 0.5, low, 0.0)
    mask[..., past:].diagonal(dim1=-2, dim2=-1).zero_()
    head.fused, cache = fused, GrowingCache()
    head(feats[:, :past], ids[:, :past], causal, torch.arange(past)[None], cache, True)
    out = head(feats[:, past:], ids[:, past:], mask, (past + torch.randint(0, 4, (n,), generator=g))[None], cache, True)
    return out, [(layer.keys.clone(), layer.values.clone()) for layer in cache.layers]


def assert_close_to_stock(head, fused):
    ref, ref_cache = tree_pass(head, None)
    out, cache = tree_pass(head, fused)
    assert torch.allclose(out, ref, rtol=1e-4, atol=1e-5), (out - ref).abs().max()
    for (k, v), (rk, rv) in zip(cache, ref_cache, strict=True):
        assert k.shape == rk.shape and torch.allclose(k, rk, rtol=1e-4, atol=1e-5)
        assert torch.allclose(v, rv, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("layers", [1, 2])
def test_the_fused_forward_agrees_with_the_stock_one(layers, monkeypatch):
    """The head's whole forward in one C++ call (drafters/fused.py): `check_fused` turns it on for a Llama-class
    head; on a tree batch over a cache its features, and the keys and values it appends to every layer's cache,
    agree with the stock forward's to float rounding, on fp32 weights and on fp16-exact ones (the pair's
    `half_drafter`; then packed as fp16); a weight changed in place (as training does) is packed again; with
    gradients on the stock forward runs; a layer class it does not know keeps the stock forward."""
    from treegraft.cpu_kernels import half_weights
    from treegraft.drafters import head as head_module
    from treegraft.drafters.fused import fused_unavailable

    if fused_unavailable():
        pytest.skip(fused_unavailable())
    target = tiny_model(1)
    head = tiny_head(target, layers=layers)
    assert head.check_direct() and head.check_fused() and head.fused is not None
    fused = head.fused
    assert_close_to_stock(head, fused)
    assert fused.packed()[0].dtype == torch.float32
    with torch.no_grad():
        head.fc.weight.mul_(0.5)  # in place: the packed copies are stale unless packed again
        head.body.layers[-1].mlp.down_proj.weight.mul_(2.0)
    assert_close_to_stock(head, fused)
    assert half_weights(head, keep={target.get_input_embeddings().weight.untyped_storage().data_ptr()}) > 0
    assert_close_to_stock(head, fused)
    assert fused.packed()[0].dtype == torch.float16
    with torch.enable_grad():
        out, _ = tree_pass(head, fused)
    assert torch.equal(out, tree_pass(head, None)[0])
    monkeypatch.setattr(head_module, "LEAN_LAYERS", ())
    assert head.check_direct() and not head.check_fused() and head.fused is None


def test_a_two_layer_head_matches_sequential_and_saves_its_layers(tmp_path):
    """A head of two decoder layers: its tree scores equal the sequential computation, and it saves and loads as
    two layers."""
    target = tiny_model(1)
    head = tiny_head(target, layers=2)
    drafter = HeadDrafter(head, target.get_output_embeddings().weight, VOCAB)
    drafter.start(target.model(input_ids=torch.tensor([PROMPT[:-1]])).last_hidden_state[0])
    assert_one_call_matches_sequential(drafter, head, target, seed=1)
    save_head(head, tmp_path, {})
    again = load_head(tmp_path, target, torch.float32, torch.device("cpu"))
    assert again.layers == 2
    ids, feats = torch.tensor([PROMPT]), torch.randn(1, len(PROMPT), target.config.hidden_size)
    assert torch.equal(again(feats, ids), head(feats, ids))


def test_a_head_grown_by_a_layer_starts_as_the_trained_head(tmp_path):
    """`--head-layers 2 --init-from` a one-layer head: the new layer starts as the identity, so the grown head
    computes exactly what the trained one did, and only training moves it away; a head cannot start from one with
    more layers than it has."""
    from treegraft.drafters.head import HEAD_WEIGHTS, DraftHead

    target = tiny_model(1)
    one = tiny_head(target)
    save_head(one, tmp_path / "one", {})
    grown = DraftHead.from_target(target, layers=2)
    grown.load_weights(tmp_path / "one" / HEAD_WEIGHTS, grown=True)
    save_head(grown, tmp_path / "two", {})
    with pytest.raises(ValueError, match="more than the 1 layer"):
        DraftHead.from_target(target).load_weights(tmp_path / "two" / HEAD_WEIGHTS, grown=True)
    ids, feats = torch.tensor([PROMPT]), torch.randn(1, len(PROMPT), target.config.hidden_size)
    with torch.no_grad():
        assert torch.allclose(grown(feats, ids), one(feats, ids), atol=1e-6)
        grown.body.layers[1].mlp.down_proj.weight.normal_(0, 0.3)
        assert not torch.allclose(grown(feats, ids), one(feats, ids), atol=1e-3)


def test_a_tapped_head_matches_sequential_and_its_engine_keeps_the_plain_pass_and_the_target_output():
    """A head with taps (EAGLE-3's fused features; a 3-layer target tapped at layers 0 and 1): the engine hands it
    the tapped layers' outputs of the prefill and of each verification's accepted rows (forward hooks on the stock
    layers), equal to one plain forward's hidden states; its tree scores equal the sequential computation over
    each path; greedy output equals AR for every method that calls it."""
    from treegraft.target import TargetModel

    pair = tiny_head_pair(taps=(0, 1))
    target, head = pair.target, pair.mid
    assert head.in_features == 3 * target.config.hidden_size
    drafter = HeadDrafter(head, target.get_output_embeddings().weight, VOCAB)
    tm = TargetModel(target, keep_features=True, taps=head.taps)
    tm.start(PROMPT)
    assert torch.allclose(tm.head_features(), real_features(target, head, PROMPT[:-1]), atol=1e-5)
    drafter.start(tm.head_features())
    tree = assert_one_call_matches_sequential(drafter, head, target, seed=2)
    nodes = np.arange(tree.n)
    tm.verify(tree, nodes)  # every row's tapped features equal a plain forward over its path
    for r in (0, 3, tree.n - 1):
        path = [int(tree.token[u]) for u in path_to(tree, r)]
        plain = real_features(target, head, PROMPT[:-1] + path)[-1]
        assert torch.allclose(tm.head_features([r])[0], plain, atol=1e-5), r
    engine = _tiny_head_engine(taps=(0, 1))
    gen, drafting = GenerationConfig(max_new_tokens=20), DraftingConfig(depth=3, width=4, top_k=3, budget=12)
    ar = engine.generate(PROMPT, MethodSpec("ar"), drafting, gen)
    for method in ("all-mid", "treegraft"):
        assert engine.generate(PROMPT, MethodSpec(method), drafting, gen).new_tokens == ar.new_tokens, method
    s = engine.start(PROMPT, MethodSpec("all-mid"), drafting, gen)
    for _ in range(4):
        engine.speculative_round(s)
    assert_head_state_is_a_plain_pass(engine, s.committed, ATOL)


def test_a_head_grown_with_taps_starts_as_the_untapped_one_and_saves_its_taps(tmp_path):
    """`--head-taps --init-from` an untapped head: the fuse starts as "the final feature alone", so the grown head
    computes what the trained one did until training moves it; the taps save and load; a tap at or past the
    target's last layer is refused."""
    from treegraft.drafters.head import HEAD_WEIGHTS, DraftHead

    target = tiny_model(1, layers=3)
    one = tiny_head(target)
    save_head(one, tmp_path / "one", {})
    tapped = DraftHead.from_target(target, taps=(0, 1))
    tapped.load_weights(tmp_path / "one" / HEAD_WEIGHTS, grown=True)
    with pytest.raises(ValueError, match="missing"):
        DraftHead.from_target(target, taps=(0,)).load_weights(tmp_path / "one" / HEAD_WEIGHTS)
    h = target.config.hidden_size
    ids, feats = torch.tensor([PROMPT]), torch.randn(1, len(PROMPT), 3 * h)
    with torch.no_grad():
        assert torch.equal(tapped(tapped.fuse_features(feats), ids), one(feats[..., :h], ids))
    save_head(tapped, tmp_path / "tapped", {})
    again = load_head(tmp_path / "tapped", target, torch.float32, torch.device("cpu"))
    assert again.taps == (0, 1) and torch.equal(again.fuse.weight, tapped.fuse.weight)
    with pytest.raises(ValueError, match="below the target's last"):
        DraftHead.from_target(target, taps=(2,))


def test_levels_follow_unvisited_parents():
    tree = DraftTree.new(1, capacity=8)
    a, _ = add_child(tree, 0, 2, -1.0, SMALL, 1)
    b, _ = add_child(tree, a, 3, -1.0, SMALL, 2)
    c, _ = add_child(tree, b, 4, -1.0, SMALL, 3)
    assert node_levels(tree, np.array([0, a, b, c]), set()).tolist() == [0, 1, 2, 3]
    assert node_levels(tree, np.array([b, c]), {0, a}).tolist() == [0, 1]


@torch.no_grad()
def assert_head_state_is_a_plain_pass(engine, committed: list[int], atol: float) -> None:
    """The engine's draft head holds the target's real features of every committed token but the last, and a
    cache equal to one plain head pass over its committed part (read from real features)."""
    from transformers import DynamicCache

    head, target = engine.pair.mid, engine.pair.target
    real = head.fuse_features(real_features(target, head, committed[:-1]))
    assert torch.allclose(engine.mid.feats, real, atol=atol)
    m = engine.mid.cached
    assert 0 < m <= len(committed) - 1
    cache = DynamicCache()
    head(torch.cat([torch.zeros(1, real.shape[-1]), real[: m - 1]])[None], torch.tensor([committed[:m]]),
         cache=cache, use_cache=True)
    for got, want in zip(engine.mid.cache.layers, cache.layers):
        assert got.keys.shape == want.keys.shape
        assert torch.allclose(got.keys, want.keys, atol=atol) and torch.allclose(got.values, want.values, atol=atol)


@pytest.mark.parametrize("method,prefill,fed", [("all-mid", True, True), ("treegraft", True, True),
                                                 ("fixed", True, True), ("csd", True, True),
                                                 ("all-small", True, False), ("all-mid", False, False)])
def test_the_mid_reads_the_prompt_in_the_prefill_when_the_method_calls_it_every_round(method, prefill, fed):
    """EAGLE's prefill: a method that calls the mid every round feeds it the prompt at the start (a plain head
    pass), so its first call pays only for the tokens committed since (treegraft here: the tiny pair has no
    scheduler, so it runs the fixed schedule); all-small never calls it and does not, nor does the ablation
    (mid_prefill off)."""
    engine = _tiny_head_engine()
    s = engine.start(PROMPT, MethodSpec(method), DraftingConfig(depth=3, width=4, top_k=3, budget=12,
                                                                mid_prefill=prefill),
                     GenerationConfig(max_new_tokens=20))
    assert engine.mid.cached == (len(PROMPT) - 1 if fed else 0)
    if fed:
        assert_head_state_is_a_plain_pass(engine, s.committed, ATOL)


class _ThirdRoundOnly(Policy):
    """A policy of the learned scheduler's kind (it may never call the mid): the mid at step 2 of round 3 only."""

    name, calls_mid, calls_every_round, note = "third-round", True, False, None

    def __init__(self):
        self.rounds = 0

    def start_round(self) -> None:
        self.rounds += 1

    def decide(self, st):
        from treegraft.methods import Decision

        return Decision(MID if self.rounds == 3 and st.k == 2 else SMALL)


def test_a_policy_that_may_never_call_the_mid_feeds_it_the_prompt_at_its_first_call(monkeypatch):
    """The learned scheduler's kind of policy: no head pass at the start (a generation where it never calls
    the mid pays nothing for it); its first call feeds every committed token but the last in one plain pass,
    timed as `mid_prefill` apart from the call's own `mid_forward`; the head's cache is then a plain pass, and
    the output is the target's greedy one."""
    import treegraft.methods as methods

    monkeypatch.setattr(methods, "make_policy", lambda *a, **k: _ThirdRoundOnly())
    engine = _tiny_head_engine()
    drafting, gen = DraftingConfig(depth=3, width=4, top_k=3, budget=12), GenerationConfig(max_new_tokens=24)
    ar = engine.generate(PROMPT, MethodSpec("ar"), drafting, gen)
    s = engine.start(PROMPT, MethodSpec("treegraft"), drafting, gen)
    assert s.prompt_at_first_call and engine.mid.cached == 0
    traces = [engine.speculative_round(s) for _ in range(3)]
    assert all("mid_prefill" not in t.profile_ms and "mid_forward" not in t.profile_ms for t in traces[:2])
    assert engine.mid.cached >= len(PROMPT) - 1 and not s.prompt_at_first_call  # fed once
    assert traces[2].profile_ms["mid_prefill"] > 0 and traces[2].profile_ms["mid_forward"] > 0
    assert_head_state_is_a_plain_pass(engine, s.committed, ATOL)
    while engine.finished(s) is None:
        engine.speculative_round(s)
    assert engine.trim(s.new_tokens, gen.max_new_tokens) == ar.new_tokens


def test_head_cache_and_features_after_rounds_equal_plain_pass():
    engine = _tiny_head_engine()
    s = engine.start(PROMPT, MethodSpec("all-mid"), DraftingConfig(depth=3, width=4, top_k=3, budget=12),
                     GenerationConfig(max_new_tokens=20))
    for _ in range(4):
        engine.speculative_round(s)
    assert_head_state_is_a_plain_pass(engine, s.committed, ATOL)


def _tiny_head_engine(taps: tuple[int, ...] = ()):
    from treegraft.engine import Engine

    return Engine(tiny_head_pair(taps))


@pytest.mark.parametrize("method", ["all-mid", "fixed", "csd", "all-small"])
def test_tiny_head_greedy_exact(method):
    engine = _tiny_head_engine()
    gen = GenerationConfig(max_new_tokens=24)
    drafting = DraftingConfig(depth=4, width=4, top_k=3, budget=16)
    ar = engine.generate(PROMPT, MethodSpec("ar"), drafting, gen)
    res = engine.generate(PROMPT, MethodSpec(method), drafting, gen)
    assert res.new_tokens == ar.new_tokens


def test_save_and_load_round_trip(tiny, tmp_path):
    target, head = tiny
    save_head(head, tmp_path, {"test": True})
    again = load_head(tmp_path, target, torch.float32, torch.device("cpu"))
    x, ids = torch.randn(1, 5, target.config.hidden_size), torch.tensor([[1, 2, 3, 4, 5]])
    assert torch.allclose(head(x, ids), again(x, ids), atol=1e-6)
    assert again.body.embed_tokens is target.get_input_embeddings()  # shared, not copied
    (tmp_path / "config.json").write_text('{"model_type": "llama"}')
    with pytest.raises(ValueError, match="not a draft head"):
        load_head(tmp_path, target, torch.float32, torch.device("cpu"))


def test_distillation_runs_and_resumes(tmp_path):
    from treegraft.distill_head import HeadSettings, agreement, fit, target_features

    target = tiny_model(1)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, VOCAB, (12, 16), generator=gen)
    feats = target_features(target, ids, batch=4).float()
    rows = target.get_output_embeddings().weight.float()
    s = HeadSettings(seq_len=16, batch=4, max_steps=3, depths=2, save_every=2, minutes=5)
    from treegraft.drafters.head import DraftHead

    meta = fit(DraftHead.from_target(target), ids, feats, rows, s, tmp_path)
    assert meta["steps"] == 3 and (tmp_path / "head.safetensors").exists()
    assert meta["passes"] == 1 and meta["log"] == []  # the curriculum starts at depth 1
    # the deeper passes start once held-out depth-1 agreement stops improving (patience 0: at once)
    s2 = HeadSettings(seq_len=16, batch=4, max_steps=5, depths=2, save_every=2, minutes=5, eval_every=1, patience=0)
    meta = fit(DraftHead.from_target(target), ids, feats, rows, s2, tmp_path, resume=True)
    assert meta["steps"] == 5  # continued from step 3, not restarted
    assert [(g["from_step"], g["steps"]) for g in meta["segments"]] == [(0, 3), (3, 2)]  # both runs recorded
    assert meta["passes"] == 2 and [e["step"] for e in meta["log"]] == [4, 5]
    assert all(0 <= a <= 1 for e in meta["log"] for a in e["val_top1"])
    head = load_head(tmp_path, target, torch.float32, torch.device("cpu"))
    result = agreement(head, target, None, rows, torch.arange(VOCAB), [[1, 2, 3, 4]], max_new_tokens=6, depths=3)
    assert set(result) == {"1", "2", "3"} and all(0 <= r["top1"] <= r["top4"] <= 1 for r in result.values())
    # per category: each group's own rates; the overall rates are their token-weighted mean
    prompts, cats = [[1, 2, 3, 4], [5, 6], [7, 8, 9]], ["a", "b", "a"]
    both = agreement(head, target, None, rows, torch.arange(VOCAB), prompts, max_new_tokens=6, depths=2,
                     categories=cats)
    alone = {c: agreement(head, target, None, rows, torch.arange(VOCAB), [p for p, k in zip(prompts, cats) if k == c],
                          max_new_tokens=6, depths=2) for c in "ab"}
    assert both["by_category"] == alone
    for d in ("1", "2"):
        tokens = sum(alone[c][d]["tokens"] for c in "ab")
        assert both[d]["tokens"] == tokens
        assert abs(both[d]["top1"] - sum(alone[c][d]["top1"] * alone[c][d]["tokens"] for c in "ab") / tokens) < 2e-3


def test_a_tapped_head_trains_on_its_taps_and_measures_its_agreement(tmp_path):
    """Training a tapped head: the cached features carry the taps after the final feature ([N, T, 3H]); the loss
    reads the final part; the fuse learns (moves off its "final feature alone" start); the saved head keeps its
    taps, and the agreement table reads them from the target."""
    from treegraft.distill_head import HeadSettings, agreement, fit, target_features
    from treegraft.drafters.head import DraftHead

    target = tiny_model(1, layers=3)
    h = target.config.hidden_size
    ids = torch.randint(0, VOCAB, (12, 16), generator=torch.Generator().manual_seed(0))
    feats = target_features(target, ids, batch=4, taps=(0, 1)).float()
    assert feats.shape == (12, 16, 3 * h)
    assert torch.allclose(feats[..., :h], target_features(target, ids, batch=4).float())
    head = DraftHead.from_target(target, taps=(0, 1))
    start = head.fuse.weight.detach().clone()
    s = HeadSettings(seq_len=16, batch=4, max_steps=4, depths=2, minutes=5, taps=(0, 1), lr=1e-2)
    meta = fit(head, ids, feats, torch.as_tensor(target.get_output_embeddings().weight).float(), s, tmp_path)
    assert meta["steps"] == 4 and list(meta["settings"]["taps"]) == [0, 1]
    assert not torch.equal(head.fuse.weight[:, h:], start[:, h:])  # the taps' columns learned
    again = load_head(tmp_path, target, torch.float32, torch.device("cpu"))
    assert again.taps == (0, 1)
    rows = target.get_output_embeddings().weight.float()
    result = agreement(again, target, None, rows, torch.arange(VOCAB), [[1, 2, 3, 4]], max_new_tokens=6, depths=2)
    assert all(0 <= r["top1"] <= r["top4"] <= 1 for r in result.values())


def test_target_answers_batched_greedy_equals_each_prompts_own_greedy():
    """Left-padded batched generation (the head's training answers) gives each prompt the target's own greedy
    continuation, cut after the first eos; windows are the answers laid end to end."""
    from treegraft.answers import AnswerSettings, generate_batch, pack_windows

    target = tiny_model(3)
    prompts = [[5, 9, 2], [7, 1, 4, 4, 8, 3], [11]]
    s = AnswerSettings(max_new_tokens=6)
    got = generate_batch(target, prompts, s, sample=False, pad_id=0, eos_id=VOCAB + 1, seed=0)
    for p, row in zip(prompts, got):
        ids = torch.tensor([p])
        for _ in range(6):
            ids = torch.cat([ids, target(ids).logits[:, -1].argmax(-1, keepdim=True)], dim=1)
        assert row == ids[0].tolist()
    eos = got[1][len(prompts[1]) + 2]  # an eos inside an answer ends it there
    cut = generate_batch(target, prompts[1:2], s, sample=False, pad_id=0, eos_id=eos, seed=0)[0]
    assert cut == got[1][: got[1].index(eos, len(prompts[1])) + 1]
    windows = pack_windows(got, 5)
    assert windows.shape == (sum(map(len, got)) // 5, 5)
    assert windows.flatten().tolist() == [t for r in got for t in r][: windows.numel()]


def test_mid_levels_cap_the_work_of_one_call():
    """`mid_levels` keeps pool nodes with fewer unevaluated ancestors than the cap (one head forward per level);
    the batch stays closed under unevaluated ancestors."""
    from treegraft.drafters.graft import MidGrafter

    tree = DraftTree.new(0, capacity=16)
    chain = [0]
    for i in range(5):  # an n-gram chain (a copied span) of 5 nodes
        chain.append(add_child(tree, chain[-1], 10 + i, -0.1, SMALL, 1)[0])
    side = add_child(tree, 0, 30, -2.0, SMALL, 1)[0]  # a weak sibling at depth 1
    tree.mid_visited[0] = True  # the root was evaluated by an earlier mid step
    grafter = MidGrafter(mid=None)
    _, _, pool, batch = grafter._pool(tree, None)
    assert pool.tolist() == list(range(1, tree.n))  # SPEC 2.1: every unevaluated node
    assert node_levels(tree, pool, {0}).tolist() == [0, 1, 2, 3, 4, 0]
    _, _, pool, batch = grafter._pool(tree, 2)
    assert pool.tolist() == [chain[1], chain[2], side] and batch.tolist() == pool.tolist()


def test_answer_blocks_are_disjoint_and_asking_for_more_keeps_the_answered_ones(fp32_pair, monkeypatch, tmp_path):
    """Block 0 is the training suite then ShareGPT's first turns (the first cache file); later blocks take
    further first turns in one fixed order, never repeating a prompt, so more prompts only add blocks."""
    from treegraft.answers import AnswerSettings, answer_prompts, bench_texts

    convs = [[{"role": "user", "content": f"Question number {i}: what is {i} times {i + 1}?"},
              {"role": "assistant", "content": "..."}] for i in range(400)]
    from treegraft.prompts import load_prompts

    bench, train = sorted(bench_texts())[0], load_prompts("train")[0].messages[0]
    for i in range(0, 400, 10):
        convs[i][0]["content"] = bench  # a bench prompt is never answered for training
        convs[i + 5][0]["content"] = train  # block 0 has it already

    seeded_sharegpt(monkeypatch, convs)
    tok = fp32_pair.tokenizer
    small = AnswerSettings(prompts=40, block=20)
    more = AnswerSettings(prompts=60, block=20)
    assert (small.blocks, more.blocks, AnswerSettings(prompts=41, block=20).blocks) == (2, 3, 3)
    assert small.cache_file(0) == more.cache_file(0) and small.cache_file(1) == more.cache_file(1)
    assert more.cache_file(0) != more.cache_file(1)
    blocks = [answer_prompts(tok, more, b) for b in range(3)]
    assert [answer_prompts(tok, small, b) for b in range(2)] == blocks[:2]
    assert all(len(b) == 20 for b in blocks)
    texts = [tok.decode(ids) for b in blocks for ids in b]
    assert len(set(texts)) == 60
    assert not any(bench in t for t in texts)

    import json

    import treegraft.answers as answers

    monkeypatch.setattr(answers, "cache_root", lambda: tmp_path)  # a complete block is read, never rebuilt
    rows = [{"ids": ids, "prompt_len": len(ids), "sampled": False} for ids in blocks[1]]
    more.cache_file(1).write_text("".join(json.dumps(r) + "\n" for r in rows))
    monkeypatch.setattr(answers, "answer_prompts", lambda *a: pytest.fail("re-read the prompt pool"))
    assert answers.block_answers(None, tok, more, 1) == rows


def test_bf16_autocast_training_keeps_fp32_weights_and_learns(tmp_path):
    """Training under bf16 autocast (any CPU runs it; native bf16 only makes it fast): the loss's target
    loss is the float32 one up to bf16 rounding, the weights stay float32 and learn, and a bad precision is a
    clear error."""
    from treegraft.distill_head import HeadSettings, autocast_dtype, fit, head_loss, target_features
    from treegraft.drafters.head import DraftHead

    target = tiny_model(1)
    ids = torch.randint(0, VOCAB, (12, 16), generator=torch.Generator().manual_seed(0))
    feats = target_features(target, ids, batch=4).float()
    rows = target.get_output_embeddings().weight.float()
    s = HeadSettings(seq_len=16, batch=4, max_steps=4, depths=2, minutes=5, precision="bfloat16")
    head = DraftHead.from_target(target)
    before = {k: v.clone() for k, v in head.own_state().items()}
    with torch.no_grad():
        outs = [head(feats[:4], ids[:4])]
        plain = head_loss(outs, feats[:4], rows, s)[0]
        with torch.autocast("cpu", dtype=torch.bfloat16):
            cast = head_loss(outs, feats[:4], rows, s)[0]  # only the head's side may round
    assert torch.isfinite(cast) and abs(cast - plain) < 0.05 * abs(plain) + 1e-3
    meta = fit(head, ids, feats, rows, s, tmp_path)
    assert meta["steps"] == 4 and meta["autocast"] == "bfloat16"
    assert all(v.dtype == torch.float32 for v in head.own_state().values())
    assert any(not torch.equal(before[k], v) for k, v in head.own_state().items())
    assert autocast_dtype("float32", torch.device("cpu")) is None
    with pytest.raises(ValueError, match="unknown head training precision"):
        autocast_dtype("fp8", torch.device("cpu"))


def test_candidates_loss_keeps_every_top_token_and_trains(tmp_path):
    """The candidates loss's set holds every target top token of the batch, filled up to its size with others
    drawn from the generator, and equals the full KL when the set is the whole vocabulary."""
    from treegraft.distill_head import HeadSettings, candidate_rows, fit, head_loss, target_features, target_top
    from treegraft.drafters.head import DraftHead

    target = tiny_model(1)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, VOCAB, (12, 16), generator=gen)
    feats = target_features(target, ids, batch=4).float()
    rows = target.get_output_embeddings().weight.float()  # [V, H]
    top = target_top(feats, rows, 2)  # [12, 16, 2]
    assert top.dtype == torch.int16 and torch.equal(top[..., 0].long(), (feats @ rows.T).argmax(-1))
    s = HeadSettings(seq_len=16, batch=4, max_steps=3, depths=2, minutes=5, loss="candidates", candidates=10,
                     cand_top=2)
    cand = candidate_rows(rows, top[:1, :3], s, gen)  # 3 positions' top 2
    need = {int(t) for t in top[:1, :3].flatten()}
    assert len(cand) == max(10, len(need)) < len(rows)
    held = {i for i in range(len(rows)) if any(torch.equal(rows[i], c) for c in cand)}
    assert need <= held
    head = DraftHead.from_target(target)
    outs = [head(feats[:4], ids[:4])]
    whole = candidate_rows(rows, top[:4], HeadSettings(candidates=len(rows)), gen)
    assert torch.allclose(head_loss(outs, feats[:4], whole, s)[0], head_loss(outs, feats[:4], rows, s)[0])
    meta = fit(head, ids, feats, rows, s, tmp_path / "a")
    assert meta["steps"] == 3 and meta["settings"]["loss"] == "candidates"
    with pytest.raises(ValueError, match="unknown head loss"):
        fit(head, ids, feats, rows, HeadSettings(seq_len=16, batch=4, max_steps=1, loss="sampled"), tmp_path / "b")


def seeded_sharegpt(monkeypatch, convs: list) -> None:
    """ShareGPT replaced by `convs`, read as the package's parser reads its file: a seeded order, then a cut."""
    import random

    import treegraft.distill as distill

    def conversations(limit, seed):
        out = list(convs)
        random.Random(seed).shuffle(out)
        return out[:limit]

    monkeypatch.setattr(distill, "sharegpt_conversations", conversations)


def synthetic_sharegpt(monkeypatch) -> tuple[str, str]:
    """ShareGPT replaced by 60 English prose answers and a few German turns; returns (prose, german)."""
    import treegraft.distill as distill

    prose = ("The river flooded the lower town in spring. Farmers moved their animals to the hills before the water "
             "rose. Most houses were repaired within a month, and the council built a new wall along the bank. ")
    german = "Wir haben am Abend lange gesprochen und die Kinder sind nicht müde, aber ich bin es."
    convs = [[{"role": "user", "content": f"What happened to town {i}?"},
              {"role": "assistant", "content": prose * (1 + i % 4)}] for i in range(60)]
    convs += [[{"role": "user", "content": german}, {"role": "assistant", "content": "Sehr gut."}]] * 5
    monkeypatch.setattr(distill, "sharegpt_conversations", lambda limit, seed: list(convs))
    return prose, german


def test_task_blocks_are_disjoint_and_more_tasks_only_add_blocks(fp32_pair, monkeypatch, tmp_path):
    """Task prompts come in blocks (one cache file each): block b is composed with seed + b and repeats no earlier
    block's prompt, so asking for more tasks keeps the answered blocks (and their file names) as they are."""
    import json

    import treegraft.answers as answers
    from treegraft.answers import AnswerSettings, task_block_prompts

    synthetic_sharegpt(monkeypatch)
    tok = fp32_pair.tokenizer
    one, two = AnswerSettings(tasks=20, task_block=20), AnswerSettings(tasks=40, task_block=20)
    assert (one.task_blocks, two.task_blocks, AnswerSettings(tasks=21, task_block=20).task_blocks) == (1, 2, 2)
    assert one.task_file(0) == two.task_file(0) != two.task_file(1)
    blocks = [task_block_prompts(tok, two, b) for b in range(2)]
    assert task_block_prompts(tok, one, 0) == blocks[0] and len(blocks[0]) == 20 and blocks[1]
    texts = [tok.decode(ids) for b in blocks for ids in b]
    assert len(set(texts)) == len(texts)  # none repeated, within or across blocks
    monkeypatch.setattr(answers, "cache_root", lambda: tmp_path)
    for b, prompts in enumerate(blocks):  # answered blocks are read as they are
        rows = [{"ids": ids, "prompt_len": len(ids), "sampled": False} for ids in prompts]
        two.task_file(b).write_text("".join(json.dumps(r) + "\n" for r in rows))
    monkeypatch.setattr(answers, "task_block_prompts", lambda *a: pytest.fail("re-built a complete block"))
    assert [r["ids"] for r in answers.task_answers(None, tok, one)] == blocks[0][: len(blocks[0])]
    assert [r["ids"] for r in answers.task_answers(None, tok, two)] == blocks[0] + blocks[1]


def test_feature_cache_keeps_each_block_apart_so_more_answers_compute_only_new_blocks(monkeypatch, tmp_path):
    """The head's training windows are cached per part (each chat block, each task block, the text): asking for a
    second block of answers computes the target's features over that block's windows only, and every window of
    the first run is still there, with the same features."""
    import json

    import treegraft.answers as answers
    import treegraft.distill_head as dh
    from treegraft.answers import AnswerSettings

    monkeypatch.setattr(answers, "cache_root", lambda: tmp_path)
    monkeypatch.setattr(dh, "cache_root", lambda: tmp_path)
    target, gen = tiny_model(1), torch.Generator().manual_seed(0)
    one, two = AnswerSettings(prompts=3, block=3), AnswerSettings(prompts=6, block=3)
    for b in range(2):  # two answered blocks of 3 answers, 40 tokens each: 2 windows of 16 tokens a block
        rows = [{"ids": torch.randint(0, VOCAB, (40,), generator=gen).tolist(), "prompt_len": 4, "sampled": b == 1}
                for _ in range(3)]
        two.cache_file(b).write_text("".join(json.dumps(r) + "\n" for r in rows))
    computed = []
    real = dh.target_features
    monkeypatch.setattr(dh, "target_features", lambda t, ids, **kw: computed.append(len(ids)) or real(t, ids, **kw))
    ids1, feats1, info1 = dh.feature_cache(target, None, dh.HeadSettings(seq_len=16, answers=one))
    assert computed == [7] and ids1.shape == (7, 16) and info1["answers"]["answers"] == 3
    ids2, feats2, info2 = dh.feature_cache(target, None, dh.HeadSettings(seq_len=16, answers=two))
    assert computed == [7, 7] and ids2.shape == (14, 16)  # only block 1's windows were computed
    assert info2["answers"]["answers"] == 6 and info2["answers"]["sampled_answers"] == 3
    first = {tuple(w.tolist()): f for w, f in zip(ids1, feats1)}
    again = {tuple(w.tolist()): f for w, f in zip(ids2, feats2) if tuple(w.tolist()) in first}
    assert len(again) == 7 and all(torch.equal(first[k], f) for k, f in again.items())
    assert torch.equal(ids2, dh.feature_cache(target, None, dh.HeadSettings(seq_len=16, answers=two))[0])
    assert computed == [7, 7]  # all cached: the same windows in the same seeded order
    with pytest.raises(ValueError, match="unknown head training data"):
        dh.feature_cache(target, None, dh.HeadSettings(data="pictures"))


def test_task_prompts_cover_each_kind_from_the_sources_and_are_fixed_by_the_seed(monkeypatch):
    """Task prompts (translation, summaries, context QA, word problems, code) in their shares, composed from the
    distillation sources (here a synthetic ShareGPT: English prose answers, a few German turns) and the standard
    library; the same seed gives the same prompts."""
    from treegraft.answers import bench_texts
    from treegraft.task_prompts import KINDS, task_prompts

    prose, german = synthetic_sharegpt(monkeypatch)
    prompts = task_prompts(80, 0)
    assert prompts == task_prompts(80, 0) and prompts != task_prompts(80, 1)
    assert len(prompts) == 80 and not set(prompts) & bench_texts()
    kinds = {"translation": sum(p.lower().startswith(("translate", "please translate", "how would you say",
                                                      "what does this mean")) for p in prompts),
             "summarisation": sum("summar" in p.split("\n")[0].lower() or p.startswith("Condense") for p in prompts),
             "qa": sum("\n\nContext: " in p and "\n\nQuestion: " in p for p in prompts),
             "code": sum("Python function" in p for p in prompts)}
    kinds["math"] = 80 - sum(kinds.values())
    assert kinds == {k: round(share * 80) for k, share in KINDS.items()}
    assert any("English" in p and german.split(".")[0][:20] in p for p in prompts)  # into English too
    assert all(prose.split(".")[0] in p for p in prompts if "Context: " in p)  # passages are the sources' answers


def test_the_unseen_suite_holds_no_prompt_either_drafter_learned_from(fp32_pair, monkeypatch):
    """`unseen_suite`: chat prompts from the chat block after the answered ones, each task kind from the task
    block after the answered ones; none is an answered prompt (the head's training data and the n-gram corpus's
    documents) or a bench prompt, and each category has its count (a scheduler collected on it sees the drafters
    as the bench does)."""
    from treegraft.answers import AnswerSettings, answer_prompts, bench_texts, task_block_prompts, unseen_suite
    from treegraft.task_prompts import KINDS

    prose, _ = synthetic_sharegpt(monkeypatch)
    convs = [[{"role": "user", "content": f"What happened to town {i} in the spring?"},
              {"role": "assistant", "content": (prose + f"Town {i} lies by the river and its people fish there every morning. ") * (1 + i % 4)}]
             for i in range(120)]
    convs += [[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hello."}]] * 20  # repeats

    seeded_sharegpt(monkeypatch, convs)
    tok = fp32_pair.tokenizer
    s = AnswerSettings(prompts=80, block=40, tasks=80, task_block=40)
    rows = unseen_suite(tok, s, per_category=3)
    assert [r["category"] for r in rows] == ["chat"] * 3 + [k for k in KINDS for _ in range(3)]
    answered_chat = {tok.decode(ids) for b in range(s.blocks) for ids in answer_prompts(tok, s, b)}
    answered_tasks = {tok.decode(ids) for b in range(s.task_blocks) for ids in task_block_prompts(tok, s, b)}
    for r in rows:
        (turn,) = r["turns"]
        assert not any(turn in t for t in answered_chat) and turn not in bench_texts()
        assert not any(turn in t for t in answered_tasks)
    assert len({r["turns"][0] for r in rows}) == len(rows)
    assert all(r["turns"][0].lower().startswith(("translate", "please translate", "how would you say",
                                                 "what does this mean")) for r in rows if r["category"] == "translation")
    assert all("Python function" in r["turns"][0] for r in rows if r["category"] == "code")


def test_a_finished_block_is_kept_in_the_store_and_read_on_a_fresh_machine(monkeypatch, tmp_path):
    """A block answered on one machine goes gzipped into the repository's answer store; a machine whose cache
    folder is empty reads it from there and answers nothing (no target, no prompt pool), and training from a
    later block reads only the blocks from there on."""
    import json

    import treegraft.answers as answers
    import treegraft.distill_head as dh
    from treegraft.answers import AnswerSettings

    machine_a, machine_b, store = tmp_path / "a", tmp_path / "b", tmp_path / "store"
    machine_a.mkdir(), machine_b.mkdir()
    monkeypatch.setattr(answers, "cache_root", lambda: machine_a)
    s = AnswerSettings(prompts=6, block=3, store=str(store))
    gen = torch.Generator().manual_seed(0)
    rows = {b: [{"ids": torch.randint(0, VOCAB, (40,), generator=gen).tolist(), "prompt_len": 4, "sampled": False}
                for _ in range(3)] for b in range(2)}
    for b in range(2):
        s.cache_file(b).write_text("".join(json.dumps(r) + "\n" for r in rows[b]))
        assert answers.block_answers(None, None, s, b) == rows[b]  # complete in the cache: kept in the store
    assert sorted(p.name for p in store.iterdir()) == sorted(f"{s.cache_file(b).name}.gz" for b in range(2))
    before = {p.name: p.read_bytes() for p in store.iterdir()}
    monkeypatch.setattr(answers, "cache_root", lambda: machine_b)
    class WouldAnswer(Exception):
        pass

    def would_answer(*a):
        raise WouldAnswer

    monkeypatch.setattr(answers, "answer_prompts", would_answer)
    assert [answers.block_answers(None, None, s, b) for b in range(2)] == [rows[0], rows[1]]
    assert {p.name: p.read_bytes() for p in store.iterdir()} == before  # read, not rewritten
    assert not list(machine_b.iterdir())
    # without the store the fresh machine would have to answer block 0 again
    with pytest.raises(WouldAnswer):
        answers.block_answers(None, None, AnswerSettings(prompts=6, block=3), 0)
    monkeypatch.setattr(dh, "cache_root", lambda: machine_b)
    later = AnswerSettings(prompts=6, block=3, store=str(store), first_block=1)
    ids, _, info = dh.feature_cache(tiny_model(1), None, dh.HeadSettings(seq_len=16, answers=later, data="answers"))
    assert info["answers"]["answers"] == 3 and ids.shape == (7, 16)  # block 1's 3 answers only
    assert answers.target_answers(None, None, later) == rows[1]


def test_mid_top_k_bounds_the_children_a_mid_step_grafts(tiny_head_engine):
    """`mid_top_k` sets K for mid steps alone: a mid step at step 1 grafts that many children under the root."""
    ids = tiny_head_engine.encode(("t3 t5 t7 t3 t5 t9 t2",))
    for mk in (1, 3):
        d = DraftingConfig(depth=1, width=3, top_k=3, budget=8, schedule=(1,), mid_top_k=mk)
        res = tiny_head_engine.generate(ids, MethodSpec("fixed"), d, GenerationConfig(max_new_tokens=3))
        tree = res.rounds[0].tree
        assert sum(p == 0 and dr == MID for p, dr in zip(tree.parent, tree.drafter)) == mk


def test_followup_blocks_are_held_out_three_turn_conversations_and_train_as_their_own_part(
        fp32_pair, monkeypatch, tmp_path):
    """Follow-up prompts are ShareGPT conversations' first three turns (user, assistant, user: the bench's chat
    shape) in one fixed order: none with a bench or unseen-suite turn, none repeated, none past the token limit,
    none of a two-turn conversation; block b is the same whatever is asked for past it, and the head's feature
    cache trains on each answered block as a part of its own."""
    import json

    import treegraft.answers as answers
    import treegraft.distill_head as dh
    from treegraft.answers import AnswerSettings, bench_texts, followup_block_prompts
    from treegraft.prompts import load_prompts

    def conv(i, follow="Can you say more about that?"):
        return [{"role": "user", "content": f"Tell me about topic {i}."},
                {"role": "assistant", "content": f"Topic {i} is a topic."},
                {"role": "user", "content": follow}, {"role": "assistant", "content": "More."}]

    bench, unseen = sorted(bench_texts())[0], load_prompts("unseen")[0].messages[0]
    convs = [conv(i) for i in range(60)]
    convs += [conv(1000, bench), conv(1001, unseen), conv(3), conv(1002, "word " * 400), conv(1003)[:2]]

    seeded_sharegpt(monkeypatch, convs)
    tok = fp32_pair.tokenizer
    one, two = AnswerSettings(followups=20, block=20), AnswerSettings(followups=40, block=20)
    assert (one.followup_blocks, two.followup_blocks) == (1, 2)
    assert one.followup_file(0) == two.followup_file(0) != two.followup_file(1) != two.cache_file(1)
    blocks = [followup_block_prompts(tok, two, b) for b in range(2)]
    assert followup_block_prompts(tok, one, 0) == blocks[0] and [len(b) for b in blocks] == [20, 20]
    texts = [tok.decode(ids) for b in blocks for ids in b]
    assert len(set(texts)) == 40
    for t in texts:
        assert t.count("<|im_start|>user") == 2 and t.count("<|im_start|>assistant") == 2  # + the generation header
        assert "Can you say more about that?" in t and "Topic" in t
    assert not any(s in t for t in texts for s in (bench, unseen, "topic 1000.", "topic 1002.", "topic 1003."))

    monkeypatch.setattr(answers, "cache_root", lambda: tmp_path)
    monkeypatch.setattr(dh, "cache_root", lambda: tmp_path)
    gen = torch.Generator().manual_seed(0)
    for b in range(2):  # answered blocks of 20 answers, 40 tokens each (in the tiny target's vocabulary)
        rows = [{"ids": torch.randint(0, VOCAB, (40,), generator=gen).tolist(), "prompt_len": 4, "sampled": False}
                for _ in range(20)]
        two.followup_file(b).write_text("".join(json.dumps(r) + "\n" for r in rows))
    settings = AnswerSettings(prompts=0, followups=40, first_block=1, block=20)  # no chat block: follow-ups only
    ids, feats, info = dh.feature_cache(tiny_model(1), tok, dh.HeadSettings(seq_len=16, answers=settings))
    assert "answers" not in info and info["followups"]["answers"] == 40 and "three turns" in info["followups"]["source"]
    assert len(ids) == info["windows"] == info["followups"]["windows"] > 0


def test_shuffled_parts_equal_the_concatenation_in_the_seeded_order():
    """The feature cache lays its parts out without holding them three times, in exactly the order concatenating
    and permuting gave, so a resumed run (and every cached run before) sees the same windows in the same order."""
    from treegraft.distill_head import _shuffled

    gen = torch.Generator().manual_seed(1)
    parts = [(torch.randint(0, 99, (k, 5), generator=gen), torch.randn(k, 5, 3, generator=gen), {}) for k in (7, 1, 12)]
    order = torch.randperm(20, generator=torch.Generator().manual_seed(3))
    want = torch.cat([p[0] for p in parts])[order], torch.cat([p[1] for p in parts])[order]
    ids, feats = _shuffled(list(parts), 3)
    assert torch.equal(ids, want[0]) and torch.equal(feats, want[1])
