"""Tests for minispec/measure/sweep.py: the gamma sweep on tiny random models, its command line on a
checkpoint written to a temporary directory, and on the shipped pair when weights/ has it."""

import importlib.util
import json
from pathlib import Path

import pytest

from minispec.config import ModelConfig
from minispec.errors import MinispecError
from minispec.loader import random_model, save_checkpoint
from minispec.measure import harness, sweep

CONFIG = {
    "family": "llama",
    "vocab_size": 32,
    "hidden_size": 32,
    "n_layers": 4,
    "n_heads": 4,
    "n_kv_heads": 2,
    "intermediate_size": 64,
    "max_position_embeddings": 64,
}
TARGET = random_model(ModelConfig(**CONFIG), seed=0, scale=0.5)
DRAFT = random_model(ModelConfig(**{**CONFIG, "n_layers": 1}), seed=1, scale=0.5)
PROMPTS = [[3, 9, 4, 3, 9, 4, 3, 9], [5, 1, 7, 2]]
REPO = Path(__file__).resolve().parents[1]
SHIPPED = REPO / "weights"


@pytest.mark.parametrize("drafter", ["model", "ngram", "early-exit"])
def test_sweep_has_a_row_per_gamma_with_the_theorem_beside_it(drafter):
    report = sweep.sweep(TARGET, drafter, PROMPTS, draft_model=DRAFT, gammas=[1, 2, 3],
                         max_new_tokens=8)
    rows = report["rows"]
    assert [r["gamma"] for r in rows] == [1, 2, 3]
    for r in rows:
        assert 0 <= r["acceptance_rate"] <= r["alpha"] <= 1
        assert 1 <= r["tokens_per_target_call"] <= r["gamma"] + 1
        assert r["c"] > 0 and r["speedup"] > 0
        assert r["predicted_speedup"] == harness.predicted_speedup(r["alpha"], r["gamma"], r["c"])
        assert r["verify_ratio"] > 0 and r["predicted_speedup_measured_verify"] > 0
        assert r["identical_to_autoregressive"] == len(PROMPTS)  # greedy: the target's output
    best = max(rows, key=lambda r: r["speedup"])
    assert report["recommended_gamma"] == best["gamma"]
    assert report["settings"]["exit_layer"] == (1 if drafter == "early-exit" else None)
    assert (report["draft_step_s"] is None) == (drafter == "ngram")
    # the steps are timed at the run's mean cache length: mean prompt (6) + half of 8 new tokens
    assert report["step_context"] == harness.typical_context(PROMPTS, 8) == 10
    table = sweep.format_table(report)
    lines = table.splitlines()
    header = next(i for i, line in enumerate(lines) if line.split()[:1] == ["gamma"])
    assert [int(line.split()[0]) for line in lines[header + 1 : header + 4]] == [1, 2, 3]
    assert f"recommended gamma: {best['gamma']}" in table
    json.dumps(report)  # JSON-ready


def test_parse_gammas():
    assert sweep.parse_gammas("1-8") == list(range(1, 9))
    assert sweep.parse_gammas("1,2,4") == [1, 2, 4]
    for bad in ("0-3", "a", "", "3-1", "1,,2"):
        with pytest.raises(MinispecError, match="--gammas"):
            sweep.parse_gammas(bad)
    assert len(sweep.parse_gammas("1-64")) == 64
    for huge in ("1-1000000000", "1-65", ",".join(["2"] * 65)):  # not a list of a billion runs
        with pytest.raises(MinispecError, match="--gammas: at most 64 values"):
            sweep.parse_gammas(huge)


def test_missing_defaults_name_the_flag_to_pass(tmp_path, monkeypatch):
    monkeypatch.setattr(sweep, "SHIPPED", tmp_path)
    with pytest.raises(MinispecError, match="--target"):
        sweep.main([])
    (tmp_path / "target").mkdir()
    with pytest.raises(MinispecError, match="--draft"):
        sweep.main([])
    with pytest.raises(MinispecError, match="--prompts"):
        sweep.main(["--drafter", "ngram"])  # no draft model needed, but no prompts either


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A tiny target and draft with a word-level tokenizer, and a prompt file, on disk."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace

    root = tmp_path_factory.mktemp("pair")
    tok = HFTokenizer(WordLevel({f"w{i}": i for i in range(32)}, unk_token="w0"))
    tok.pre_tokenizer = Whitespace()
    for name, model in (("target", TARGET), ("draft", DRAFT)):
        save_checkpoint(model, root / name)
        tok.save(str(root / name / "tokenizer.json"))
    prompts = {"prompts": [{"text": "w3 w9 w4 w3 w9 w4 w3"}, {"text": "w5 w1 w7"}]}
    (root / "prompts.json").write_text(json.dumps(prompts))
    return root


def test_command_line_prints_a_row_per_gamma(checkpoint, capsys, tmp_path):
    args = ["--target", str(checkpoint / "target"), "--draft", str(checkpoint / "draft"),
            "--prompts", str(checkpoint / "prompts.json"), "--gammas", "1-3",
            "--max-new-tokens", "6"]
    assert sweep.main(args) == 0
    out = capsys.readouterr().out
    assert "BLAS threads" in out and "recommended gamma" in out
    rows = [line.split() for line in out.splitlines() if line.split()[:1] in (["1"], ["2"],
                                                                              ["3"])]
    assert [r[0] for r in rows] == ["1", "2", "3"] and all(len(r) == 9 for r in rows)
    png = tmp_path / "sweep.png"
    # --plot needs the plot extra (without it the command stops first: tests/test_cli.py)
    plot = ["--plot", str(png)] if importlib.util.find_spec("matplotlib") else []
    assert sweep.main(args + ["--drafter", "early-exit", "--json", *plot]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [r["gamma"] for r in report["rows"]] == [1, 2, 3]
    assert report["settings"]["drafter"] == "early-exit" and report["settings"]["exit_layer"] == 1
    assert report["settings"]["blas_threads"] in (1, None)
    if plot:
        assert png.stat().st_size > 0


@pytest.mark.skipif(
    not all((SHIPPED / p).exists() for p in ("target/config.json", "draft/config.json",
                                             "prompts.json")),
    reason="the shipped pair and prompts (weights/target, weights/draft, weights/prompts.json) "
    "are not in this checkout yet",
)
def test_sweep_on_the_shipped_pair(capsys):
    assert sweep.main(["--num-prompts", "1", "--max-new-tokens", "8", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [r["gamma"] for r in report["rows"]] == list(range(1, 9))
    assert all(r["identical_to_autoregressive"] == 1 for r in report["rows"])
    assert 1 <= report["recommended_gamma"] <= 8
