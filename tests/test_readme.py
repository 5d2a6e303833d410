"""Every ```python block of README.md runs as pasted, from a directory that is not the checkout
(as after `pip install .`): no fragment that needs names from elsewhere, no path that only
resolves in the repository root."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BLOCKS = re.findall(r"^```python\n(.*?)^```", (ROOT / "README.md").read_text(), re.S | re.M)


def test_the_readme_has_python_blocks():
    assert len(BLOCKS) >= 3  # the quick start, verify, generate_batch


@pytest.mark.parametrize("code", BLOCKS, ids=[f"block{i + 1}" for i in range(len(BLOCKS))])
def test_each_python_block_runs_as_pasted_from_another_directory(code, tmp_path):
    if not (ROOT / "weights" / "target" / "model.safetensors").exists():
        pytest.skip("the shipped weights are not in this checkout")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1",
           "OPENBLAS_NUM_THREADS": "1"}  # PYTHONPATH: minispec importable, as once installed
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"README block failed from {tmp_path}:\n{code}\n{done.stderr}"
    assert done.stdout.strip()  # each block prints what it shows
