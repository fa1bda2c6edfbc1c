"""The packed weights on transparent huge pages (`treegraft/huge_pages.py`): bit-equal copies, side by side in one
mapping the kernel may back with 2 MiB pages, and nothing moved where it offers none."""
import pytest
import torch

from treegraft import huge_pages
from treegraft.cpu_kernels import PACKED_ATTRS
from treegraft.huge_pages import HUGE, into_huge_pages, mapping_fields, thp_mode

offered = pytest.mark.skipif(thp_mode() not in ("always", "madvise"), reason="this kernel offers no huge pages")


@pytest.mark.parametrize("text, mode", [("always [madvise] never\n", "madvise"), ("[always] madvise never", "always"),
                                        ("always madvise [never]", "never"), ("garbled", "unavailable")])
def test_thp_mode_reads_the_kernels_choice(tmp_path, text, mode):
    f = tmp_path / "enabled"
    f.write_text(text)
    assert thp_mode(f) == mode
    assert thp_mode(tmp_path / "missing") == "unavailable"


@offered
def test_copies_are_bit_equal_page_aligned_and_share_one_eligible_mapping():
    torch.manual_seed(0)
    tensors = [torch.randn(2048, 576), torch.randn(3, 1000).half(), torch.randn(7)]  # > 2 MiB: a huge page fits
    moved = into_huge_pages(tensors)
    for t, m in zip(tensors, moved):
        assert m.dtype == t.dtype and m.shape == t.shape and torch.equal(m, t) and m.data_ptr() != t.data_ptr()
        assert m.data_ptr() % huge_pages.ALIGN == 0
        assert m.untyped_storage().data_ptr() == moved[0].untyped_storage().data_ptr()  # one mapping
    assert moved[0].data_ptr() % HUGE == 0
    assert mapping_fields(moved[0])["THPeligible"] == 1  # advised: the kernel may back it with huge pages


def test_nothing_moves_where_no_huge_pages_are_offered(monkeypatch):
    monkeypatch.setattr(huge_pages, "thp_mode", lambda *a: "never")
    tensors = [torch.randn(4, 4)]
    assert into_huge_pages(tensors)[0] is tensors[0]


@offered
def test_a_loaded_targets_packed_weights_sit_in_one_huge_page_region(fp32_pair):
    packed = [getattr(m, a) for m in fp32_pair.target.modules() for a in PACKED_ATTRS
              if isinstance(m, torch.nn.Linear) and getattr(m, a, None) is not None]
    if not packed:
        pytest.skip("no packed kernel on this CPU")
    assert len({t.untyped_storage().data_ptr() for t in packed}) == 1
    assert all(t.data_ptr() % huge_pages.ALIGN == 0 for t in packed)
    assert mapping_fields(packed[0])["THPeligible"] == 1
