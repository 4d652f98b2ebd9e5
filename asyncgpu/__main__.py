"""``python -m asyncgpu``: the ``asyncgpu`` command. Python has imported the package by now; a Ctrl-C during the
rest of the command line's imports, or before the command handles Ctrl-C itself, still ends it with one line and
exit code 130 (the console script, ``_asyncgpu_cli``, guards the package's import too)."""

import sys

try:
    from asyncgpu._cli.main import main

    code = main()
except KeyboardInterrupt:
    print("asyncgpu: interrupted", file=sys.stderr, flush=True)
    code = 130  # (`asyncgpu._cli.main.EXIT_INTERRUPTED`, which may not be imported yet)
sys.exit(code)
