"""Shows that tests/test_exact_timing.py's held-free test can fail: it runs the test with the frees' release of
open holds switched off (every pinned free as cuda.core makes it), and expects the test to fail.

    python dev/check_unheld.py        # exit 0 when the test failed without the release (a GPU is needed)
"""

from __future__ import annotations

import contextlib
import sys

import pytest

from asyncgpu._backends.cuda import hotpath, unheld


def main() -> int:
    unheld.UnheldFree.close = lambda self: setattr(self, "buffer", None)  # the buffer's own finalizer frees it
    hotpath.releasing_holds = contextlib.nullcontext  # type: ignore[assignment]
    rc = pytest.main(["-q", "-p", "no:cacheprovider", "tests/test_exact_timing.py", "-k", "pinned_free_while and cuda"])
    print(f"KEY without the release the test {'failed, as it should' if rc == 1 else f'returned {rc}'}")
    return 0 if rc == 1 else 1


if __name__ == "__main__":
    sys.exit(main())
