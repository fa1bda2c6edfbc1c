"""Tree attention and KV handling on the real default pair (float32).

Tolerance: logits agree within 2e-3 absolute (fp32, SDPA; a batched tree forward and a
plain causal forward sum in different orders, measured differences are ~1e-4).
"""
import numpy as np
import pytest
import torch
from transformers import DynamicCache
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from treegraft.attention import NAME as ATTENTION, packed_gqa_attention
from treegraft.kv import GrowingCache, GrowingLayer, additive_mask, keep_slots

from treegraft.config import GenerationConfig, DraftingConfig
from treegraft.methods import MethodSpec
from treegraft.tree import SMALL, DraftTree, add_child, path_to, unvisited_closure
from treegraft.target import TargetModel
from treegraft.drafters.neural import MidDrafter

ATOL = 2e-3


def random_tree(root_token, n_nodes, vocab, seed):
    rng = np.random.default_rng(seed)
    t = DraftTree.new(root_token, capacity=n_nodes + 32)
    while t.n < n_nodes + 1:
        parent = int(rng.integers(0, t.n))
        if t.depth[parent] < 5:
            add_child(t, parent, int(rng.integers(0, vocab)), -1.0, SMALL, 1)
    return t


def plain_logits(model, tokens):
    with torch.no_grad():
        return model(input_ids=torch.tensor([tokens])).logits[0, -1]


@pytest.fixture(scope="module")
def prefix(engine):
    return engine.encode("Tell me about the history of the bicycle.")


@pytest.mark.parametrize("lazy", [False, True], ids=["eager", "lazy"])
def test_target_tree_logits_equal_plain_causal_pass(fp32_pair, prefix, lazy):
    target = TargetModel(fp32_pair.target, lazy=lazy)
    target.start(prefix)
    tree = random_tree(prefix[-1], 40, 2000, seed=1)
    nodes = np.arange(tree.n)
    tree.kept[:] = True
    logits = target.verify(tree, nodes)
    assert (logits.all is None) == lazy and len(logits) == tree.n
    for v in range(0, tree.n, 3):
        path = [int(tree.token[u]) for u in path_to(tree, v)][1:]
        ref = plain_logits(fp32_pair.target, prefix + path)
        assert torch.allclose(logits.row(v), ref, atol=ATOL), (v, (logits.row(v) - ref).abs().max())
    if lazy:  # the root's row came with the forward; the others one by one, as they were read
        assert sorted(logits.computed) == list(range(0, tree.n, 3)) and logits.extra_rows == len(logits.computed) - 1


def test_lazy_acceptance_reads_only_the_rows_it_walks(fp32_pair, prefix):
    """Greedy acceptance of a tree grown along the target's own greedy path: the walk computes the logits of the
    root and of each accepted node, no other row; the result equals the eager walk's."""
    from treegraft.accept import accept
    from treegraft.config import GenerationConfig

    results = {}
    for lazy in (False, True):
        target = TargetModel(fp32_pair.target, lazy=lazy)
        target.start(prefix)
        greedy = [int(plain_logits(fp32_pair.target, prefix).argmax())]
        greedy.append(int(plain_logits(fp32_pair.target, prefix + greedy).argmax()))
        tree = random_tree(prefix[-1], 30, 2000, seed=3)
        u, _ = add_child(tree, 0, greedy[0], -0.1, SMALL, 1)  # the target's choice, then its next one
        add_child(tree, u, greedy[1], -0.1, SMALL, 2)
        tree.kept[:tree.n] = True
        logits = target.verify(tree, np.arange(tree.n))
        acc = accept(tree, np.arange(tree.n), logits, GenerationConfig(max_new_tokens=4), None)
        results[lazy] = (acc.path, acc.bonus)
        assert acc.accepted_tokens >= 2
        if lazy:
            assert sorted(logits.computed) == sorted(acc.rows)
    assert results[True] == results[False]


def test_lead_rows_come_with_the_forward_and_equal_rows_read_alone(fp32_pair, prefix):
    """A lazy verification that names its likely path computes those rows with the root's in one head call;
    the acceptance then computes only rows off that path; every row equals the one computed alone (bit for bit
    where the 1- and 4-row head paths chosen at load share one FMA chain, the packed ones; within the float
    rounding bound of two summation orders where load-time timing picked stock or weight_left for one of them: a
    CI host's timing did, and a fixed 1e-5 tolerance failed on a 2e-5 difference), and the walk is the eager one's."""
    from treegraft.accept import accept

    target = TargetModel(fp32_pair.target, lazy=True)
    target.start(prefix)
    greedy = [int(plain_logits(fp32_pair.target, prefix).argmax())]
    greedy.append(int(plain_logits(fp32_pair.target, prefix + greedy).argmax()))
    tree = random_tree(prefix[-1], 20, 2000, seed=4)
    u, _ = add_child(tree, 0, greedy[0], -0.1, SMALL, 1)
    w, _ = add_child(tree, u, greedy[1], -0.1, SMALL, 2)
    nodes = np.arange(tree.n)
    tree.kept[:tree.n] = True
    logits = target.verify(tree, nodes, lead=[u, w, 3, 3])
    assert sorted(logits.computed) == sorted({0, u, w, 3}) and logits.extra_rows == 0
    head = fp32_pair.target.get_output_embeddings()
    table = getattr(fp32_pair.target, "kernel_table", None)  # the head's paths, chosen by timing at load
    same_chain = table is not None and {table.path("head", 1), table.path("head", 4)} <= {"packed", "packed16", "packed16f"}
    for r in (0, u, w, 3):  # one FMA chain per output on the packed paths: bit-equal; else to float rounding
        x = target.features[r:r + 1]
        alone = head(x)[0]
        if same_chain:
            assert torch.equal(logits.computed[r], alone), r
        else:  # two summation orders of K products: each within K eps sum|w x| of the exact sum
            bound = 2 * x.shape[-1] * torch.finfo(torch.float32).eps * (x.abs() @ head.weight.abs().T)[0]
            assert ((logits.computed[r] - alone).abs() <= bound).all(), r
    acc = accept(tree, nodes, logits, GenerationConfig(max_new_tokens=4), None)
    assert acc.path[:3] == [0, u, w]
    assert logits.extra_rows == len(set(acc.rows) - {0, u, w, 3})  # only the bonus row after w, if any
    eager = TargetModel(fp32_pair.target, lazy=False)
    eager.start(prefix)
    ref = accept(tree, nodes, eager.verify(tree, nodes), GenerationConfig(max_new_tokens=4), None)
    assert (acc.path, acc.bonus) == (ref.path, ref.bonus)
    assert not TargetModel(fp32_pair.target, lazy=True, lead_rows=False).lead_rows  # the pair's switch (ablation)
    assert not TargetModel(fp32_pair.target, lazy=False).lead_rows  # an eager head has every row anyway


@pytest.mark.parametrize("prefilled", [False, True])
def test_mid_pool_logits_equal_plain_pass_across_two_mid_steps(lm_pair, prefix, prefilled):
    """Second evaluation reuses the cached slots of the first (ancestors already evaluated); the same when the
    prompt was fed in the prefill. (The LM mid; the draft head's equivalent is tests/test_head.py.)"""
    fp32_pair = lm_pair
    mid = MidDrafter(fp32_pair.mid, len(fp32_pair.tokenizer))
    mid.start()
    if prefilled:
        mid.prefill(prefix)
        assert mid.cached == len(prefix) - 1 and mid.cache.get_seq_length() == len(prefix) - 1
    mid.begin_round()
    tree = random_tree(prefix[-1], 12, 2000, seed=2)
    first = np.arange(tree.n)
    lq1 = mid.evaluate(tree, prefix, first)
    tree.mid_visited[first] = True
    for _ in range(10):  # grow under already-evaluated nodes
        add_child(tree, int(np.random.default_rng(tree.n).integers(0, tree.n)), tree.n + 7, -1.0, SMALL, 2)
    second = unvisited_closure(tree, np.flatnonzero(~tree.mid_visited[:tree.n]))
    lq2 = mid.evaluate(tree, prefix, second)
    for nodes, lq in ((first, lq1), (second, lq2)):
        for i, v in enumerate(nodes):
            path = [int(tree.token[u]) for u in path_to(tree, int(v))][1:]
            ref = torch.log_softmax(plain_logits(fp32_pair.mid, prefix + path).float(), -1)
            assert torch.allclose(lq.logq[i], ref, atol=ATOL), (v, (lq.logq[i] - ref).abs().max())


def test_mid_draft_vocabulary_restricts_the_head(lm_pair, prefix):
    fp32_pair = lm_pair
    vocab = torch.arange(0, 4000, 3)
    mid = MidDrafter(fp32_pair.mid, len(fp32_pair.tokenizer), vocab)
    mid.start()
    mid.begin_round()
    tree = random_tree(prefix[-1], 6, 2000, seed=3)
    scores = mid.evaluate(tree, prefix, np.arange(tree.n))
    full = plain_logits(fp32_pair.mid, prefix).float()
    assert torch.allclose(scores.logq[0], torch.log_softmax(full[vocab], -1), atol=ATOL)
    toks, lps = scores.topk(torch.tensor([0]), 4)
    assert set(toks[0].tolist()) <= set(vocab.tolist())
    lp, known = scores.of(torch.tensor([0, 0]), torch.tensor([3, 4]))
    assert known.tolist() == [True, False] and lp[0] == scores.logq[0, 1]


def cache_of(model, tokens):
    cache = DynamicCache()
    with torch.no_grad():
        model(input_ids=torch.tensor([tokens]), cache=cache, use_cache=True)
    return cache


@pytest.mark.parametrize("method", ["all-mid", "fixed"])
def test_kv_caches_after_rounds_equal_plain_pass(lm_engine, lm_pair, prefix, method):
    engine, fp32_pair = lm_engine, lm_pair
    s = engine.start(prefix, MethodSpec(method), DraftingConfig(), GenerationConfig(max_new_tokens=64))
    for _ in range(3):
        engine.speculative_round(s)
    committed = s.committed
    assert engine.target.cached == len(committed) - 1
    ref = cache_of(fp32_pair.target, committed[:-1])
    for got, want in zip(engine.target.cache.layers, ref.layers):
        assert got.keys.shape == want.keys.shape
        assert torch.allclose(got.keys, want.keys, atol=ATOL) and torch.allclose(got.values, want.values, atol=ATOL)
    m = engine.mid.cached
    assert 0 < m <= len(committed) - 1
    ref = cache_of(fp32_pair.mid, committed[:m])
    for got, want in zip(engine.mid.cache.layers, ref.layers):
        assert got.keys.shape == want.keys.shape
        assert torch.allclose(got.keys, want.keys, atol=ATOL) and torch.allclose(got.values, want.values, atol=ATOL)


def test_draft_head_features_and_cache_after_rounds_equal_plain_pass(engine, prefix):
    """The default pair's draft head after real rounds (tests/test_head.py has the tiny-model twin)."""
    from tests.test_head import assert_head_state_is_a_plain_pass

    s = engine.start(prefix, MethodSpec("all-mid"), DraftingConfig(), GenerationConfig(max_new_tokens=64))
    for _ in range(3):
        engine.speculative_round(s)
    assert_head_state_is_a_plain_pass(engine, s.committed, ATOL)


def tree_mask(n, cached, seed):
    """[1, 1, n, cached + n] additive mask: the prefix and a random ancestor set (always the node itself)."""
    rng = np.random.default_rng(seed)
    vis = np.zeros((n, cached + n), dtype=bool)
    vis[:, :cached] = True
    for i in range(n):
        vis[i, cached + i] = True
        vis[i, cached:cached + i] |= rng.random(i) < 0.5
    return additive_mask(vis, torch.float32, torch.device("cpu"))


@pytest.mark.parametrize("n", [1, 2, 3, 8, 17])
def test_grouped_query_tree_attention_equals_the_stock_one(fp32_pair, n):
    """treegraft_sdpa (query heads of one key/value head side by side, the cache not repeated) equals stock sdpa
    (which repeats the cache to every head) on the target's own attention module, with a tree mask."""
    attn = fp32_pair.target.model.layers[0].self_attn
    assert attn.num_key_value_groups > 1  # the default target is grouped-query: the packed path runs
    cfg = fp32_pair.target.config
    heads, kv, d, cached = cfg.num_attention_heads, cfg.num_key_value_heads, attn.head_dim, 40
    g = torch.Generator().manual_seed(n)
    q = torch.randn(1, n, heads, d, generator=g).transpose(1, 2)  # [1, H, n, d] as the model lays it out
    k, v = (torch.randn(1, kv, cached + n, d, generator=g) for _ in range(2))
    mask = tree_mask(n, cached, seed=n)
    ours, _ = packed_gqa_attention(attn, q, k, v, mask, scaling=attn.scaling)
    stock, _ = sdpa_attention_forward(attn, q, k, v, mask, scaling=attn.scaling)
    assert ours.shape == stock.shape == (1, n, heads, d)
    torch.testing.assert_close(ours, stock, atol=1e-6, rtol=1e-5)
    other = tree_mask(n, cached, seed=n + 100)  # a new mask is not served the previous one's repeated rows
    torch.testing.assert_close(packed_gqa_attention(attn, q, k, v, other, scaling=attn.scaling)[0],
                               sdpa_attention_forward(attn, q, k, v, other, scaling=attn.scaling)[0],
                               atol=1e-6, rtol=1e-5)
    other.fill_(0.0)  # nor an old one changed in place
    torch.testing.assert_close(packed_gqa_attention(attn, q, k, v, other, scaling=attn.scaling)[0],
                               sdpa_attention_forward(attn, q, k, v, other, scaling=attn.scaling)[0],
                               atol=1e-6, rtol=1e-5)


def test_loaded_models_run_the_grouped_query_tree_attention(fp32_pair, prefix):
    """Both models switch to it, and Hugging Face builds the same masks for it as for stock sdpa (a registered
    attention without a mask builder gets none: prompt lookup's multi-token checks then attended to the future)."""
    assert fp32_pair.target.config._attn_implementation == ATTENTION
    assert fp32_pair.mid.body.config._attn_implementation == ATTENTION
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

    assert ALL_MASK_ATTENTION_FUNCTIONS[ATTENTION] is ALL_MASK_ATTENTION_FUNCTIONS["sdpa"]
    model, ids = fp32_pair.target, torch.tensor([prefix])
    with torch.no_grad():
        full = model(input_ids=ids).logits[0]
        cache = DynamicCache()
        model(input_ids=ids[:, :-5], cache=cache, use_cache=True)
        tail = model(input_ids=ids[:, -5:], cache=cache, use_cache=True).logits[0]  # 5 rows, no mask given
    torch.testing.assert_close(tail, full[-5:], atol=ATOL, rtol=0)


@pytest.mark.parametrize("slots", [[], [0, 1, 2], [2], [1, 3], [4, 0, 2], [3, 2, 1, 0]], ids=str)
def test_keeping_slots_equals_an_index_select(slots):
    """keep_slots(prefix, slots) leaves every layer as an index-select of [0..prefix) + slots would: sources that
    overlap their destinations included (the offsets are from the prefix here)."""
    prefix, g = 6, torch.Generator().manual_seed(len(slots))
    cache = DynamicCache()
    for layer in range(3):
        cache.update(torch.randn(1, 2, prefix + 5, 4, generator=g), torch.randn(1, 2, prefix + 5, 4, generator=g), layer)
    keep = torch.tensor(list(range(prefix)) + [prefix + s for s in slots])
    want = [(layer.keys.index_select(-2, keep), layer.values.index_select(-2, keep)) for layer in cache.layers]
    keep_slots(cache, prefix, [prefix + s for s in slots])
    for layer, (k, v) in zip(cache.layers, want):
        assert torch.equal(layer.keys, k) and torch.equal(layer.values, v)
    assert cache.get_seq_length() == prefix + len(slots)
    cache.update(torch.ones(1, 2, 1, 4), torch.ones(1, 2, 1, 4), 0)  # the next append sees the kept slots
    assert torch.equal(cache.layers[0].keys[..., :-1, :], want[0][0])


def test_growing_cache_appends_in_place_and_equals_the_stock_cache(fp32_pair, prefix):
    """The engine's cache (growing layers) gives the stock DynamicCache's logits through a prefill, appends of 1 and
    5 tokens, a compaction and a crop; an append that fits writes into the same buffer (no copy of the cache)."""
    model, ids = fp32_pair.target, torch.tensor([prefix])
    ours, stock = GrowingCache(), DynamicCache()

    def both(chunk):
        with torch.no_grad():
            a = model(input_ids=chunk, cache=ours, use_cache=True).logits[0]
            b = model(input_ids=chunk, cache=stock, use_cache=True).logits[0]
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)

    both(ids[:, :-8])
    start = ours.layers[0].keys.data_ptr()
    both(ids[:, -8:-7])
    both(ids[:, -7:-2])
    assert ours.layers[0].keys.data_ptr() == start and isinstance(ours.layers[0], GrowingLayer)
    n = ours.get_seq_length()
    for cache in (ours, stock):
        keep_slots(cache, n - 5, [n - 3, n - 1])  # keep two of the last five, as a commit does
        cache.crop(-1)  # the stock crop (prompt lookup's): a view the layer keeps writing into
    assert ours.get_seq_length() == stock.get_seq_length() == n - 4
    both(ids[:, -2:])
    assert ours.layers[0].keys.data_ptr() == start
    ours.layers[0].keys = ours.layers[0].keys.clone()  # replaced from outside: read back into a new buffer
    ours.layers[0].values = ours.layers[0].values.clone()
    both(ids[:, -1:])
