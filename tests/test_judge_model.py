"""The judge on a model of one's choice (`judge --drafter NAME|MODULE:FACTORY --model DIR`): a
drafter's output against the exact law of that model's next tokens, with controls that are
rejected at the same budget; bad combinations named."""

import os
import subprocess
import sys
from pathlib import Path

from minispec.drafters import ModelDrafter
from minispec.judge.selftest import MODEL, judge_drafter_on_model, tiny_models
from minispec.loader import save_checkpoint

ROOT = Path(__file__).resolve().parents[1]


def test_a_drafter_on_a_model_passes_and_the_controls_are_rejected(tmp_path):
    models = tiny_models()
    save_checkpoint(models["target"], tmp_path / "tiny")
    rows, controls = judge_drafter_on_model(lambda t, d: ModelDrafter(t, models["near"]),
                                            "model", 800, 0, str(tmp_path / "tiny"))
    assert [r.config for r in rows] == [f"{MODEL.name}, model on tiny",
                                        "T=0 g=3 L=4, model on tiny"]
    assert all(r.fit.pvalue > 1e-3 for r in rows), [r.fit for r in rows]
    assert {c.control for c in controls} == {"residual=p", "accept q/p"}
    assert all(c.fit.pvalue < 1e-6 for c in controls), [c.fit for c in controls]


def run(*args):
    return subprocess.run([sys.executable, "-m", "minispec", "judge", *args], cwd=ROOT,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True,
                          text=True, timeout=300, check=False)


def test_the_judge_names_what_it_cannot_do_with_a_model():
    r = run("--model", "shipped:target")
    assert r.returncode == 2 and "--model: goes with --drafter" in r.stderr
    r = run("--drafter", "medusa")  # the tiny random target has no trained heads
    assert r.returncode != 0 and "no Medusa heads trained for this target" in r.stderr


def test_minispec_real_judge_runs_the_judge_on_its_model(tmp_path, capsys):
    from minispec.real import main as real_main

    save_checkpoint(tiny_models()["target"], tmp_path / "tiny")
    # the drafter named after `judge` wins over real's default (eagle, whose heads the tiny
    # model does not have); 60 samples: the rows are there, the controls lack power (exit 1)
    code = real_main(["--model", str(tmp_path / "tiny"), "judge", "--drafter",
                      "test_judge_model:near_model", "--samples", "60"])
    out = capsys.readouterr().out
    assert code in (0, 1)
    assert "T=1.5 top_k=3 g=3 L=4, model on tiny" in out and "accept q/p" in out


def near_model(target, draft):
    return ModelDrafter(target, tiny_models()["near"])
