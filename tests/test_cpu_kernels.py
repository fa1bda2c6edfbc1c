"""The CPU small-batch paths compute what F.linear computes, and leave one-row body inputs stock."""
import pytest
import torch
import torch.nn.functional as F

from treegraft.cpu_kernels import MAX_ROWS, use_cpu_kernels


def inputs(features: int):
    return {rows: torch.randn(1, rows, features, generator=torch.Generator().manual_seed(rows))
            for rows in range(1, MAX_ROWS + 4)}


@pytest.mark.parametrize("bias", [False, True])
def test_weight_left_linear_matches_stock(bias):
    torch.manual_seed(0)
    layer = torch.nn.Linear(64, 96, bias=bias)
    xs = inputs(64)
    ref = {rows: F.linear(x, layer.weight, layer.bias) for rows, x in xs.items()}
    assert use_cpu_kernels(torch.nn.Sequential(layer)) == 1
    for rows, want in ref.items():
        got = layer(xs[rows])
        assert got.shape == want.shape
        if rows == 1 or rows > MAX_ROWS:
            assert torch.equal(got, want)  # the stock path
        else:
            assert torch.allclose(got, want, atol=1e-5)


class WithHead(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.body = torch.nn.Linear(32, 32)
        self.lm_head = torch.nn.Linear(32, 500, bias=False)

    def get_output_embeddings(self):
        return self.lm_head


def test_output_head_matches_stock_at_every_row_count():
    torch.manual_seed(0)
    model = WithHead()
    xs = inputs(32)
    ref = {rows: F.linear(x, model.lm_head.weight) for rows, x in xs.items()}
    use_cpu_kernels(model)
    assert model.lm_head.weight_t.shape == (32, 500)
    for rows, want in ref.items():
        got = model.lm_head(xs[rows])
        assert got.shape == want.shape and torch.allclose(got, want, atol=1e-5)
