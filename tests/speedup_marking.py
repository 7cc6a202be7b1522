"""The check every CPU run's outputs must pass: a speedup ratio (a float under a "speedup", "interval",
"geomean_speedup", "geomean_correct" or "mean_correct" key, at any depth of a JSON document) stands only inside an
object marked `"speedup_comparable": false`; and no page, table or plot shows one of those ratios as a figure."""

from __future__ import annotations

import re
from typing import Any

RATIO_KEYS = ("speedup", "interval", "geomean_speedup", "geomean_correct", "mean_correct")


def unmarked_ratios(node: Any, where: str = "$", marked: bool = False, under_ratio: bool = False) -> list[str]:
    """Where a ratio stands without the marking, as JSON paths."""
    if isinstance(node, dict):
        marked = marked or node.get("speedup_comparable") is False
        return [path for key, value in node.items()
                for path in unmarked_ratios(value, f"{where}.{key}", marked, under_ratio or key in RATIO_KEYS)]
    if isinstance(node, list):
        return [path for i, item in enumerate(node)
                for path in unmarked_ratios(item, f"{where}[{i}]", marked, under_ratio)]
    return [where] if under_ratio and isinstance(node, float) and not marked else []


def ratios(node: Any, under_ratio: bool = False) -> set[float]:
    """Every ratio of a document, marked or not."""
    if isinstance(node, dict):
        return {r for key, value in node.items() for r in ratios(value, under_ratio or key in RATIO_KEYS)}
    if isinstance(node, list):
        return {r for item in node for r in ratios(item, under_ratio)}
    return {node} if under_ratio and isinstance(node, float) else set()


def shown_ratios(text: str, document: Any) -> list[str]:
    """The document's ratios a page, table or plot shows, as they would be written (3 significant digits, a
    number of its own: not part of a dollar figure or a count with a thousands separator)."""
    written = [f"{r:.3g}" for r in sorted(ratios(document)) if r not in (0.0, 1.0)]
    return [w for w in written if re.search(rf"(?<![\d.,$]){re.escape(w)}(?![\d,])", text)]
