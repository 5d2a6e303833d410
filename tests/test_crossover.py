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
    assert r["settings"]["sequences"] == 3  # the largest batch: each size decodes 3 prompts
    for row in r["rows"]:
        assert row["identical"]  # greedy: the three methods give the same tokens
        assert row["plain"]["tokens"] == 3 * 6  # batch 1: three batches, one after another
        assert row["plain"]["mean_gamma"] == 0 and row["speculative"]["mean_gamma"] <= 2
        assert all(row[m]["tokens_per_second"] > 0 for m in crossover.METHODS)
        assert all(row[m]["decode_tokens_per_second"] > 0 for m in crossover.METHODS)
    assert set(r["costs"]["verify"]) == set(r["costs"]["rounds"]) == {"1", "3"}
    text = crossover.format_crossover(r)
    assert "speculation stops paying at batch" in text and "k=3" in text
    assert "what load-aware weighs" in text and "g=2" in text
    decode = text.split("the decode phase")[1].splitlines()[2:4]  # batch 1 and 3
    assert [line.split()[0] for line in decode] == ["1", "3"]
    assert decode[0].split()[4] == "1.00"  # plain at batch 1 over itself
    json.dumps(r)


def test_the_decode_rate_counts_tokens_after_the_first_round_over_the_batchs_rounds():
    # round i of the batch took the longest any sequence recorded for its round i
    from types import SimpleNamespace as N

    def result(*rounds):  # (tokens emitted, draft seconds, verify seconds) per round
        return N(stats=N(rounds=[N(emitted=[0] * n, draft_seconds=d, verify_seconds=v)
                                 for n, d, v in rounds]))

    a = result((1, 0.0, 9.0), (3, 0.1, 0.2), (2, 0.1, 0.3))
    b = result((1, 0.0, 9.0), (1, 0.1, 0.4))  # finished after its second round
    assert crossover.decode_rate([a, b]) == (3 + 2 + 1) / ((0.1 + 0.4) + (0.1 + 0.3))
    assert crossover.decode_rate([result((1, 0.0, 1.0))]) == 0.0  # no round after the first


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
    with pytest.raises(MinispecError, match="--sequences"):
        crossover.main(["--sequences", "0"])
    for argv, message in ((["--repeats", "0"], "--repeats: expected a positive integer"),
                          (["--max-new-tokens", "-1"], "--max-new-tokens: expected a positive"),
                          (["--batch", "1,4", "--sequences", "2"],
                           "--batch 4: larger than --sequences 2"),
                          (["--batch", "1000000000", "--sequences", "2"],
                           "--batch: at most 1024"),  # not a billion caches
                          (["--batch", "1", "--sequences", "100000000"],
                           "--sequences: at most 4096")):  # not a run of days
        with pytest.raises(MinispecError, match=message):
            crossover.main(argv)
    for argv, message in ((["--requests", "0"], "--requests: expected a positive integer"),
                          (["--slots", "0"], "--slots: expected a positive integer"),
                          (["--slots", "100000000"], "--slots: at most 1024"),
                          (["--requests", "100000000"], "--requests: at most 4096")):
        with pytest.raises(MinispecError, match=message):
            crossover.serve_main(argv)
    (tmp_path / "long.txt").write_text("x " * 2000 + "\n")
    with pytest.raises(MinispecError, match=r"long\.txt: a prompt of \d+ tokens leaves no room"):
        crossover.main(["--batch", "1", "--prompts", str(tmp_path / "long.txt")])
    with pytest.raises(MinispecError, match="--target"):
        crossover.serve_main(["--target", str(tmp_path / "none")])
    with pytest.raises(MinispecError, match="--alphas"):
        crossover.main(["--device", "gpu", "--alphas", "0.6,1.2"])
    with pytest.raises(MinispecError, match="--alphas"):
        crossover.main(["--device", "gpu", "--alphas", "x"])
    with pytest.raises(MinispecError, match=r"^--draft-cost: expected a number >= 0"):
        crossover.main(["--device", "gpu", "--draft-cost", "-1"])  # --alphas is fine: not named
    with pytest.raises(MinispecError, match="for --device gpu"):
        crossover.main(["--dtype", "float16"])  # the CPU's crossover is float32
