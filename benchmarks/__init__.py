"""asyncgpu's benchmarks: one runner over a few suites, each suite one or more scripts of this folder.

    python -m benchmarks --list                  # the suites, what each runs, and whether this machine can
    python -m benchmarks [SUITE ...] [--out DIR] # run them (default: every suite this machine can run)
    python -m benchmarks.table DIR/*.json        # the table of current figures per GPU model, in Markdown

Every script also runs on its own (``python benchmarks/bench_wait.py --help``). The runner starts each in a
process of its own, so what a script measures is what it measures alone; it keeps the script's JSON (its ``--out``)
and its printed output in one JSON file per run, with the machine: GPU models, driver, package versions, commit.
Engine-tuning probes live in ``dev/`` (see dev/README.md), not here.
"""
