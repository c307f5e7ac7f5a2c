"""How the report writes numbers, shared by the paper diff's markdown and the HTML page.

:func:`number` is a value or ``—``; :func:`bounds` a paper cell's 95% interval ``[low, high]`` or ``—``;
:func:`signed` a difference with its interval, ``+1.23 [-0.40, +2.50]``. ``entry``: a paper-diff entry,
claim comparison or learning result (keys ``point`` / ``ci_low`` / ``ci_high``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["bounds", "number", "signed"]


def number(value: float | None, decimals: int) -> str:
    """``value`` with ``decimals`` digits, ``—`` for ``None``."""
    return "—" if value is None else f"{value:.{decimals}f}"


def bounds(entry: Mapping[str, Any], decimals: int) -> str:
    """``[ci_low, ci_high]``, ``—`` when the entry has no interval."""
    if entry["ci_low"] is None:
        return "—"
    return f"[{number(entry['ci_low'], decimals)}, {number(entry['ci_high'], decimals)}]"


def signed(entry: Mapping[str, Any], decimals: int) -> str:
    """``+point [+low, +high]``, every number with its sign."""
    return (f"{entry['point']:+.{decimals}f} [{entry['ci_low']:+.{decimals}f}, "
            f"{entry['ci_high']:+.{decimals}f}]")
