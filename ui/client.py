"""The page's own script and style (ui/assets), run once on load: nothing is fetched from elsewhere."""
from __future__ import annotations

import json
from pathlib import Path

from .tree_figure import FRAME_MS

ASSETS = Path(__file__).resolve().parent / "assets"

PRESENT_JS = "(on) => { document.body.classList.toggle('tg-present', !!on); return on; }"


def page_js() -> str:
    js = (ASSETS / "app.js").read_text()
    return js.replace("__CSS__", json.dumps((ASSETS / "app.css").read_text())).replace("__FRAME_MS__", str(FRAME_MS))
