"""Install anywhere: the wheel carries the shipped models, and minispec.shipped finds them in a
checkout or in an installed copy."""

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from minispec import shipped

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_the_wheel_carries_every_shipped_model(tmp_path):
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps",
                        "--no-build-isolation", "-q", "-w", str(tmp_path)],
                       capture_output=True, text=True, timeout=300, check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    names = set(zipfile.ZipFile(next(tmp_path.glob("*.whl"))).namelist())
    assert "minispec/_weights/prompts.json" in names and "minispec/shipped.py" in names
    for model in ("target", "draft", "medusa", "eagle"):
        if (ROOT / "weights" / model).is_dir():  # every model folder the checkout ships
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
