"""How the reports write numbers: times in ms (`ms`, and `ms_strings` for whole columns) and bars of blocks.

No rich here: the result types format their own figures (`str`, verdicts) without loading it."""

from __future__ import annotations

import math

import numpy as np

__all__ = ["BAR_WIDTH", "bar", "ms", "ms_strings"]

BAR_WIDTH = 20  #: cells of a full bar
_EIGHTHS = " ▏▎▍▌▋▊▉"
_FAST_MS = 1e9  #: `ms_strings` writes the digits of smaller values with numpy (exact: the float error stays < 1e-4 µs)
_POWERS_OF_TEN = 10 ** np.arange(1, 13, dtype=np.int64)


def ms(value: float | None) -> str:
    """A time in ms as the reports write it: three decimals, thousands separated; ``—`` for None or NaN."""
    return "—" if value is None or math.isnan(value) else f"{value:,.3f}"


def bar(value: float, top: float, width: int = BAR_WIDTH) -> str:
    """``value`` of ``top`` as a bar of ``width`` full blocks, in eighths of a block (at least one if > 0)."""
    if top <= 0 or value <= 0:
        return ""
    eighths = max(1, round(value / top * width * 8))
    return "█" * (eighths // 8) + _EIGHTHS[eighths % 8].strip()


def ms_strings(values: np.ndarray) -> list[str]:
    """`ms` of every value (ms with three decimals and thousands separators, ``—`` for NaN), the same strings as
    ``f"{value:,.3f}"``: digits written by numpy for the whole column at once, Python's formatting only for a value
    that lies within 0.001 µs of a rounding tie, is over `_FAST_MS` or is not finite."""
    values = np.asarray(values, dtype=np.float64)
    with np.errstate(invalid="ignore", over="ignore"):  # NaN, inf and huge values compare False: Python's formatting
        scaled = values * 1000.0  # µs
        us = np.rint(scaled)
        fast = (np.abs(values) < _FAST_MS) & (np.abs(scaled - us) < 0.499)
    us[~fast] = 0
    out = _thousandths(np.abs(us).astype(np.int64), np.signbit(values)).tolist()
    for i in np.flatnonzero(~fast).tolist():
        out[i] = ms(float(values[i]))
    return out


def _thousandths(counts: np.ndarray, negative: np.ndarray) -> np.ndarray:
    """``f"{count / 1000:,.3f}"`` (``-`` in front where ``negative``) of counts from 0 to 10¹², as a numpy array of
    strings: the characters of every string written at once, digit by digit from the right."""
    whole, frac = np.divmod(counts, 1000)
    digits = 1 + np.searchsorted(_POWERS_OF_TEN, whole, side="right")
    length = negative + digits + (digits - 1) // 3 + 4
    width = int(length.max(initial=1))
    chars = np.zeros(len(counts) * width, np.uint32)  # code points, read back as strings of `width` characters
    pos = np.arange(len(counts), dtype=np.int64) * width + length - 1  # where each string's next character goes
    for _ in range(3):
        frac, digit = np.divmod(frac, 10)
        chars[pos] = ord("0") + digit
        pos -= 1
    chars[pos] = ord(".")
    pos -= 1
    rows = np.arange(len(counts))
    for d in range(int(digits.max(initial=1))):
        if d:  # only the strings with a d-th digit go on
            more = digits[rows] > d
            rows, pos, whole = rows[more], pos[more] - (d % 3 == 0), whole[more]
            if d % 3 == 0:
                chars[pos + 1] = ord(",")
        whole, digit = np.divmod(whole, 10)
        chars[pos] = ord("0") + digit
        pos -= 1
    chars[np.flatnonzero(negative) * width] = ord("-")
    return chars.view(f"U{width}")
