"""minispec crossover and minispec serve (minispec/measure/crossover.py) on a tiny random pair:
the report's rows, the relations between its numbers, and the command line. Speed itself is
never asserted."""

import json

import numpy as np
import pytest
from conftest import tiny_config

from minispec import MinispecError
from minispec.loader import random_model
from minispec.measure import crossover

TARGET = random_model(tiny_config(max_position_embeddings=128), seed=0, scale=0.5)
DRAFT = random_model(tiny_config(max_position_embeddings=128, n_layers=1), seed=0, scale=0.45)
PROMPTS = [np.random.default_rng(i).integers(0, 48, 4 + i).tolist() for i in range(6)]


def test_crossover_report():
    r = crossover.crossover(TARGET, DRAFT, PROMPTS, batch_sizes=[1, 3], gamma=2,
                            max_new_tokens=6)
    assert [row["batch"] for row in r["rows"]] == [1, 3]
    for row in r["rows"]:
        assert row["identical"]  # greedy: the three methods give the same tokens
        assert row["plain"]["tokens"] == row["batch"] * 6
        assert row["plain"]["mean_gamma"] == 0 and row["speculative"]["mean_gamma"] <= 2
        assert all(row[m]["tokens_per_second"] > 0 for m in crossover.METHODS)
    assert set(r["costs"]["verify"]) == {"1", "3"}
    text = crossover.format_crossover(r)
    assert "speculation stops paying at batch" in text and "k=3" in text
    json.dumps(r)


def test_serve_report_counts_every_request():
    r = crossover.serve(TARGET, DRAFT, PROMPTS, rates=[2.0, 50.0], requests=5, slots=3,
                        gamma=2, max_new_tokens=5)
    for row in r["rows"]:
        for m in crossover.METHODS:
            x = row[m]
            assert x["tokens"] == 5 * 5
            assert 0 < x["latency_p50_s"] <= x["latency_p99_s"]
    assert "p99" in crossover.format_serve(r)


def test_command_line_errors_name_the_flag(tmp_path):
    with pytest.raises(MinispecError, match="--batch"):
        crossover.main(["--batch", "0,2"])
    with pytest.raises(MinispecError, match="--target"):
        crossover.serve_main(["--target", str(tmp_path / "none")])
