"""Sizes for the figures: the normal page and presentation mode (a projector: larger text, taller plots)."""
from __future__ import annotations

from dataclasses import dataclass

from .tree_layout import MIN_WIDTH_PX


@dataclass(frozen=True)
class Style:
    name: str
    font: int  # node labels, axis text
    title: int  # figure titles / frame captions
    legend: int
    tree_height: int  # the tree's minimum height (it grows with its widest layer, up to tree_max)
    tree_max: int
    chart_height: int  # timeline, margin, speedup charts
    wrap: int  # characters per title line
    label_width: int = MIN_WIDTH_PX  # the narrowest plot width (px) the tree's labels are placed for


NORMAL = Style("normal", font=11, title=13, legend=10, tree_height=560, tree_max=900, chart_height=280, wrap=95)
PRESENT = Style("present", font=15, title=19, legend=14, tree_height=720, tree_max=1000, chart_height=330, wrap=100)

COMPARE_LABEL_WIDTH = 360  # a compare side's tree: half the main column (390 px wide in a 1,500 px window)


def style_of(present: bool) -> Style:
    return PRESENT if present else NORMAL


def wrap(text: str, width: int) -> str:
    """Break a title into lines of at most `width` characters (Plotly titles do not wrap by themselves)."""
    lines, line = [], ""
    for word in text.split(" "):
        if line and len(line) + 1 + len(word) > width:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}" if line else word
    return "<br>".join(lines + [line])
