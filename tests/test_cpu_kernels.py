"""The CPU paths compute what F.linear computes, and are chosen per row bucket by what the host measures."""
import pytest
import torch
import torch.nn.functional as F

from treegraft.cpu_kernels import BUCKETS, KernelTable, choose, measure, use_cpu_kernels

ALL = {b: True for b in BUCKETS}
NONE = {b: False for b in BUCKETS}


def inputs(features: int):
    return {rows: torch.randn(1, rows, features, generator=torch.Generator().manual_seed(rows))
            for rows in (1, 2, 3, 5, 8, 13, 40, 64, 70)}


class WithHead(torch.nn.Module):
    def __init__(self, bias=False):
        super().__init__()
        self.body = torch.nn.Linear(32, 48, bias=bias)
        self.lm_head = torch.nn.Linear(48, 500, bias=False)

    def get_output_embeddings(self):
        return self.lm_head


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("forced", ["all", "none"])
def test_every_path_matches_stock_at_every_row_count(bias, forced):
    torch.manual_seed(0)
    model = WithHead(bias)
    xs = inputs(32)
    ref = {rows: F.linear(x, model.body.weight, model.body.bias) for rows, x in xs.items()}
    head_ref = {rows: F.linear(r, model.lm_head.weight) for rows, r in ref.items()}
    flags = ALL if forced == "all" else NONE
    use_cpu_kernels(model, KernelTable(body=dict(flags), head=dict(flags)))
    for rows, want in ref.items():
        got = model.body(xs[rows])
        assert got.shape == want.shape
        if forced == "none" or rows > BUCKETS[-1]:
            assert torch.equal(got, want)  # the stock path
        else:
            assert torch.allclose(got, want, atol=1e-5)
        head = model.lm_head(want)
        assert head.shape == head_ref[rows].shape and torch.allclose(head, head_ref[rows], atol=1e-5)
    assert (model.lm_head.weight_t is not None) == (forced == "all")  # the 1-row copy only when used


def test_the_measured_table_follows_the_clock():
    """Which path each bucket takes is decided by timings, not constants: with a clock under which the
    alternative wins only up to 4 rows, exactly those buckets use it."""
    layer = torch.nn.Linear(16, 16)

    def clock(fn, reps):
        rows = clock.rows[len(clock.calls) // 2]
        alt = len(clock.calls) % 2 == 1
        clock.calls.append(fn)
        return (1.0 if rows <= 4 else 3.0) if alt else 2.0

    clock.calls, clock.rows = [], list(BUCKETS)
    ms = measure(layer, "body", clock=clock)
    assert choose(ms) == {b: b <= 4 for b in BUCKETS}
    assert choose({8: (10.0, 9.5)}) == {8: False}  # a 5% gain is within noise: stay stock


def test_loading_measures_a_table_on_this_host():
    model = WithHead()
    table = use_cpu_kernels(model)
    assert model.kernel_table is table
    assert set(table.body) == set(BUCKETS) == set(table.head)
    assert all(stock > 0 and alt > 0 for stock, alt in table.ms["body"].values())
    x = torch.randn(1, 3, 32)
    assert torch.allclose(model.body(x), F.linear(x, model.body.weight, model.body.bias), atol=1e-5)
