"""`publish`: show public objects under their public path (``asyncgpu.kernel.KernelProfiler``), not the private
module that defines them, in reprs, tracebacks and documentation."""

from __future__ import annotations

from typing import Any

__all__ = ["publish"]


def publish(module: str, namespace: dict[str, Any], names: list[str]) -> None:
    """Set ``__module__`` of each class and function of ``namespace`` named in ``names`` to ``module``."""
    for name in names:
        obj = namespace[name]
        if isinstance(obj, type) or callable(obj):
            try:
                obj.__module__ = module
            except (AttributeError, TypeError):  # an instance (kernel_history) keeps its class's module
                pass
