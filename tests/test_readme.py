"""Every ```python block of the README runs as written: on the host backend (``ASYNCGPU_BACKEND=host``), in a fresh
process and folder, within a time limit. A block that needs more says so in the comment right above it,
``<!-- needs: cuda, torch -->``; it runs where that is present (``torchrun``: under torch's launcher, two ranks on
host devices) and is skipped, with the reason, elsewhere."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import CUDA_OK

README = Path(__file__).resolve().parent.parent / "README.md"
TIMEOUT_S = 60
MAX_MARKED = 2  # blocks that cannot run on the host backend: keep them rare
_BLOCK = re.compile(r"(?:<!-- needs: (?P<needs>[^>]*?) -->\n)?```python\n(?P<code>.*?)^```", re.S | re.M)


def _torch() -> bool:
    return importlib.util.find_spec("torch") is not None


REQUIREMENTS = {  # what a block may need -> (present here?, why it is skipped otherwise)
    "cuda": (CUDA_OK, "needs a CUDA GPU"),
    "torch": (_torch(), "needs torch (pip install 'asyncgpu[torch]')"),
    "torchrun": (_torch(), "needs torch's launcher, torchrun (pip install 'asyncgpu[torch]')"),
}


def blocks() -> list:
    text = README.read_text(encoding="utf-8")
    out = []
    for m in _BLOCK.finditer(text):
        needs = tuple(n.strip() for n in (m.group("needs") or "").split(",") if n.strip())
        line = text.count("\n", 0, m.start("code")) + 1
        out.append(pytest.param(m.group("code"), needs, id=f"README.md:{line}"))
    return out


def test_the_readme_has_python_blocks_and_few_need_more_than_the_host_backend():
    found = blocks()
    assert len(found) >= 5
    marked = [p for p in found if p.values[1]]
    assert len(marked) <= MAX_MARKED, [p.id for p in marked]
    for p in marked:
        unknown = set(p.values[1]) - set(REQUIREMENTS)
        assert not unknown, f"{p.id}: unknown requirement {unknown}: use one of {sorted(REQUIREMENTS)}"


@pytest.mark.parametrize(("code", "needs"), blocks())
def test_block_runs_as_written(tmp_path, code, needs):
    missing = [REQUIREMENTS[n][1] for n in needs if n in REQUIREMENTS and not REQUIREMENTS[n][0]]
    if missing:
        pytest.skip("; ".join(missing))
    script = tmp_path / "block.py"
    script.write_text(code, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    if "cuda" not in needs:
        env["ASYNCGPU_BACKEND"] = "host"
    command = [sys.executable, str(script)]
    if "torchrun" in needs:
        command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port"]
        command += [str(_free_port()), str(script)]
    out = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert out.returncode == 0, f"{out.stdout[-2000:]}\n{out.stderr[-4000:]}"
    assert "Traceback" not in out.stderr, out.stderr[-4000:]


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
