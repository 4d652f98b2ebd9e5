"""The ``asyncgpu`` command's entry point (``[project.scripts]``): the command line, imported under a guard.

A Ctrl-C while Python imports asyncgpu and its dependencies (the first few tenths of a second) ends the command as
one at any later moment does: one line on stderr and exit code 130, no traceback. This module lives outside the
``asyncgpu`` package because importing anything inside it runs ``asyncgpu/__init__.py`` first, which is where
most of that time goes. It imports nothing else before the guard.
"""

from __future__ import annotations

import sys

__all__ = ["EXIT_INTERRUPTED", "main"]

#: 128 + SIGINT, as shells report a process ended by Ctrl-C (`asyncgpu._cli.main.EXIT_INTERRUPTED`, which cannot be
#: imported before the guard: a test checks that they agree)
EXIT_INTERRUPTED = 130


def main() -> int:
    """Run the ``asyncgpu`` command (`asyncgpu._cli.main.main`) and return its exit code; interrupted before the
    command's own handling of Ctrl-C begins, print one line and return `EXIT_INTERRUPTED`."""
    try:
        from asyncgpu._cli.main import main as command  # noqa: PLC2701 - the command line this file guards

        return command()
    except KeyboardInterrupt:
        print("asyncgpu: interrupted", file=sys.stderr, flush=True)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
