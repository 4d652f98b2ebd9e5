"""Shows that tests/test_exact_timing.py's hold tests can fail:

- the held-free test, run with the frees' release of open holds switched off (every pinned free as cuda.core
  makes it), is expected to fail;
- a kernel's first launch inside its own hold, run with the watchdog kept from starting, is expected to need the
  child's rescue (the launch waited for its hold until the rescue ended it after 5 s).

    python dev/check_unheld.py        # exit 0 when both failed as they should (a GPU is needed)
"""

from __future__ import annotations

import contextlib
import sys

import pytest

from asyncgpu._backends.cuda import hotpath, unheld


def first_launch() -> bool:
    import subprocess

    from tests.test_exact_timing import FIRST_LAUNCH_IN_A_HOLD

    out = subprocess.run(
        [sys.executable, "-c", FIRST_LAUNCH_IN_A_HOLD, "nowatch"], capture_output=True, text=True, timeout=120
    )
    if len(out.stdout.split()) < 3:
        print(f"the child failed (exit {out.returncode}): {out.stderr[-1500:]}")
    last = out.stdout.split()[-3:]
    took_s, _ended, rescued = last + ["?"] * (3 - len(last))
    print(f"KEY without the watchdog a first launch inside its hold took {took_s} s; rescued: {rescued}")
    return rescued == "True"


def main() -> int:
    ok = first_launch()
    unheld.UnheldFree.close = lambda self: setattr(self, "buffer", None)  # the buffer's own finalizer frees it
    hotpath.releasing_holds = contextlib.nullcontext  # type: ignore[assignment]
    rc = pytest.main(["-q", "-p", "no:cacheprovider", "tests/test_exact_timing.py", "-k", "pinned_free_while and cuda"])
    print(f"KEY without the release the test {'failed, as it should' if rc == 1 else f'returned {rc}'}")
    return 0 if rc == 1 and ok else 1


if __name__ == "__main__":
    sys.exit(main())
