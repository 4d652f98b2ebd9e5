"""Argument checks every layer shares, so that one kind of mistake gets one wording wherever it is made.

Each check returns the value in its plain Python type, or raises `TypeError` for a value of the wrong type (a
string, a bool, None where a number is needed) and `ValueError` for one out of range (negative, NaN, infinite),
naming the argument, its unit, what it accepts, and the value given. Checks run at the top of public calls,
before anything is enqueued, allocated or recorded.
"""

from __future__ import annotations

import math
import os
from numbers import Integral, Real
from typing import Any

__all__ = ["file_path", "number", "timeout_s", "whole"]


def _got(value: Any) -> str:
    typed = isinstance(value, (str, bytes, bool)) or value is None  # (a repr that reads like a number)
    return f"{value!r} ({type(value).__name__})" if typed else repr(value)


def whole(name: str, value: Any, *, minimum: int = 0, maximum: int | None = None, hint: str = "") -> int:
    """``value`` as an int: a whole number (``int``, a numpy integer; not a bool) in ``minimum .. maximum``.
    ``hint`` (what the number is, why the bound) goes into the message."""
    t = type(value)
    if t is int:  # the common case first: no message is built unless it fails
        if value >= minimum and (maximum is None or value <= maximum):
            return value
    elif t is not bool and isinstance(value, Integral):
        n = int(value)
        if n >= minimum and (maximum is None or n <= maximum):
            return n
    what = f"{name} must be a whole number " + (f">= {minimum}" if maximum is None else f"in {minimum} .. {maximum}")
    what += f" ({hint})" if hint else ""
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise TypeError(f"{what}, not {_got(value)}")
    raise ValueError(f"{what}, not {int(value)}")


def number(
    name: str, value: Any, *, unit: str, minimum: float = 0.0, maximum: float | None = None, infinite: str | None = None
) -> float:
    """``value`` as a float: a real number (``int``, ``float``, numpy; not a bool) in ``unit``, ``>= minimum`` (and
    ``<= maximum``). NaN is refused; infinity only when ``infinite`` says what it means (``"no limit"``)."""
    t = type(value)
    if t is float or t is int or (t is not bool and isinstance(value, Real)):  # no message unless it fails
        x = float(value)
        if x >= minimum and (maximum is None or x <= maximum) and (infinite is not None or x != math.inf):
            return x
    what = f"{name} is in {unit}: a number >= {minimum:g}" + ("" if maximum is None else f" and <= {maximum:g}")
    what += f" (math.inf: {infinite})" if infinite else ""
    if isinstance(value, bool) or not isinstance(value, Real):
        raise TypeError(f"{what}, not {_got(value)}")
    raise ValueError(f"{what}, not {value!r}")


def timeout_s(value: Any, name: str = "timeout_s") -> float | None:
    """A timeout in seconds: None (or math.inf) waits for ever, 0 only looks, a number > 0 waits that long."""
    if value is None:
        return None
    x = number(name, value, unit="seconds", infinite="wait for ever, as None")
    return None if math.isinf(x) else x


def file_path(name: str, value: Any) -> str:
    """``value`` as a str path: a ``str`` or an ``os.PathLike`` that gives one (a ``pathlib.Path``); not bytes,
    not a number (an int would be taken for a file descriptor)."""
    if isinstance(value, str):
        return value
    if isinstance(value, os.PathLike):
        path = os.fspath(value)
        if isinstance(path, str):
            return path
        value = path  # (a PathLike that gives bytes: named as the bytes)
    raise TypeError(f"{name} must be a file path, a str or a pathlib.Path, not {_got(value)}")
