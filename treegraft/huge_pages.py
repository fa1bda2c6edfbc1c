"""The packed weights on transparent huge pages (Linux), so that a forward streams them from 2 MiB pages.

Every decoding step and verification reads every packed weight of the target once (0.54 GB for the default
pair in fp32, its output head included), and a head step reads the head's (~18 MB of fp16). On 4 KiB pages that
stream crosses ~130k pages a forward: each a TLB miss, and each page boundary a point where the hardware prefetchers stop. Where the kernel
offers transparent huge pages ('always' or 'madvise' in /sys/kernel/mm/transparent_hugepage/enabled),
`into_huge_pages` copies a model's packed weights side by side into one anonymous mapping, 2 MiB aligned and advised
MADV_HUGEPAGE. The values and the kernels are unchanged, so every product is bit-equal; only where the bytes sit
moves. Measured on a 2-core Zen 4 (the packed16f kernel over 120 [1536 x 576] layers, fp32, prefetch 512 floats, in
one process): 1 row 0.114 -> 0.090 ms a layer, 8 rows 0.133 -> 0.112, 16 rows 0.173 -> 0.162. Where huge pages
are not offered ('never', another OS) nothing moves; where the kernel cannot find free 2 MiB pages it falls back to
small ones silently, and `mapping_fields` (AnonHugePages) says how much of a region it got.
"""
from __future__ import annotations

import ctypes
import mmap
import re
from pathlib import Path

import torch

HUGE = 2 << 20  # one transparent huge page on x86-64 (and most arm64 kernels)
ALIGN = 4096  # each tensor of a region starts on its own page (and so on every vector width's boundary)
THP_ENABLED = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def thp_mode(path: Path = THP_ENABLED) -> str:
    """The kernel's transparent huge page mode: 'always', 'madvise', 'never', or 'unavailable' (no such file,
    or a Python without MADV_HUGEPAGE)."""
    try:
        text = path.read_text()
    except OSError:
        return "unavailable"
    chosen = re.search(r"\[(\w+)\]", text)
    return chosen.group(1) if chosen and hasattr(mmap, "MADV_HUGEPAGE") else "unavailable"


def huge_region(nbytes: int) -> torch.Tensor:
    """[nbytes] uint8, 2 MiB aligned, in a fresh anonymous mapping advised MADV_HUGEPAGE (its pages are allocated
    when first written). The mapping lives as long as any view of it."""
    m = mmap.mmap(-1, nbytes + HUGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    m.madvise(mmap.MADV_HUGEPAGE)
    whole = torch.frombuffer(m, dtype=torch.uint8)  # holds the mapping alive
    skip = -whole.data_ptr() % HUGE
    return whole[skip: skip + nbytes]


def into_huge_pages(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """Copies of `tensors` side by side in one huge-page region, each page aligned (the tensors themselves where
    huge pages are not offered)."""
    if not tensors or thp_mode() not in ("always", "madvise"):
        return list(tensors)
    sizes = [-(-t.numel() * t.element_size() // ALIGN) * ALIGN for t in tensors]
    region, out, at = huge_region(sum(sizes)), [], 0
    for t, size in zip(tensors, sizes):
        view = region[at: at + t.numel() * t.element_size()].view(t.dtype).view(t.shape)
        view.copy_(t)
        out.append(view)
        at += size
    return out


def release_free_heap() -> None:
    """Hand the allocator's free memory back to the system (glibc's `malloc_trim`; nothing elsewhere): the plain
    copies a region replaced were freed into malloc's heap, which otherwise keeps them resident (measured with the
    default pair: 1.94 GB resident after the load against 1.63 GB without the regions; trimmed, 1.6 GB)."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass


def mapping_fields(t: torch.Tensor) -> dict[str, int]:
    """The /proc/self/smaps fields of the mapping that holds `t`'s data, as numbers (kB fields in bytes): e.g.
    AnonHugePages (how much of it sits on huge pages) and THPeligible (1: the kernel may back it with them). Empty
    where there is no such file."""
    addr, fields, inside = t.data_ptr(), {}, False
    try:
        lines = Path("/proc/self/smaps").read_text().splitlines()
    except OSError:
        return {}
    for line in lines:
        head = re.match(r"^([0-9a-f]+)-([0-9a-f]+) ", line)
        if head:
            if inside:
                break
            inside = int(head.group(1), 16) <= addr < int(head.group(2), 16)
        elif inside:
            field = re.match(r"^(\w+):\s+(\d+)( kB)?", line)
            if field:
                fields[field.group(1)] = int(field.group(2)) * (1024 if field.group(3) else 1)
    return fields
