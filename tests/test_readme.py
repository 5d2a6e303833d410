"""Every ```python block of README.md and docs/*.md runs as pasted, from a directory that is not the
checkout (as after `pip install .`): no fragment that needs names from elsewhere, no path that
only resolves in the repository root."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCKS = [(page.relative_to(ROOT).as_posix(), i + 1, code)
          for page in PAGES
          for i, code in enumerate(re.findall(r"^```python\n(.*?)^```", page.read_text(),
                                              re.S | re.M))]


def test_the_readme_and_docs_have_python_blocks():
    where = [page for page, _, _ in BLOCKS]
    assert where.count("README.md") >= 2  # the quick start, verify
    assert len(BLOCKS) >= 3  # ... and generate_batch, in docs/batches.md


@pytest.mark.parametrize("page, n, code", BLOCKS, ids=[f"{p}:block{n}" for p, n, _ in BLOCKS])
def test_each_python_block_runs_as_pasted_from_another_directory(page, n, code, tmp_path):
    if not (ROOT / "weights" / "target" / "model.safetensors").exists():
        pytest.skip("the shipped weights are not in this checkout")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1",
           "OPENBLAS_NUM_THREADS": "1"}  # PYTHONPATH: minispec importable, as once installed
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, (f"{page}'s python block {n} failed from {tmp_path}:\n{code}\n"
                                  f"{done.stderr}")
    assert done.stdout.strip()  # each block prints what it shows
