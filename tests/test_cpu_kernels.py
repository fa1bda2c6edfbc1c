"""The small-batch CPU Linear path computes what F.linear computes, and leaves one-row inputs stock."""
import pytest
import torch
import torch.nn.functional as F

from treegraft.cpu_kernels import MAX_ROWS, use_weight_left_linear


@pytest.mark.parametrize("bias", [False, True])
def test_weight_left_linear_matches_stock(bias):
    torch.manual_seed(0)
    layer = torch.nn.Linear(64, 96, bias=bias)
    ref = {rows: F.linear(x, layer.weight, layer.bias) for rows in range(1, MAX_ROWS + 4)
           for x in [torch.randn(1, rows, 64, generator=torch.Generator().manual_seed(rows))]}
    assert use_weight_left_linear(torch.nn.Sequential(layer)) == 1
    for rows, want in ref.items():
        x = torch.randn(1, rows, 64, generator=torch.Generator().manual_seed(rows))
        got = layer(x)
        assert got.shape == want.shape
        if rows == 1 or rows > MAX_ROWS:
            assert torch.equal(got, want)  # the stock path
        else:
            assert torch.allclose(got, want, atol=1e-5)
