"""Numbers as JSON holds them: JSON has no NaN or infinity, so such a float is written as null (None)."""

from __future__ import annotations

import math
from typing import Any

__all__ = ["finite", "finite_json"]


def finite(x: float | None) -> float | None:
    """``x`` as a float; None for None, NaN and ±inf."""
    return None if x is None or not math.isfinite(x) else float(x)


def finite_json(value: Any) -> Any:
    """``value`` with every float in it made `finite`, through dicts, lists and tuples (which become lists); other
    values as they are."""
    if isinstance(value, float):
        return finite(value)
    if isinstance(value, dict):
        return {k: finite_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_json(v) for v in value]
    return value
