"""minispec.bench: the theory's formulas, the measurement helpers, and the report's arithmetic.

Speed is never asserted (the machine is shared); shapes, keys and the relations between the
reported numbers are.
"""

import json
import math

import numpy as np
import pytest
from conftest import tiny_config

from minispec import bench
from minispec.errors import MinispecError
from minispec.loader import random_model, save_checkpoint

# ---- the theory -----------------------------------------------------------------------------


def test_expected_tokens_per_call_is_equation_1():
    assert bench.expected_tokens_per_call(0.5, 2) == pytest.approx(1.75)  # 1 + .5 + .25
    assert bench.expected_tokens_per_call(0.0, 4) == 1.0
    assert bench.expected_tokens_per_call(1.0, 4) == 5.0  # the limit gamma + 1
    assert bench.expected_tokens_per_call(1 - 1e-12, 4) == pytest.approx(5.0)
    assert bench.expected_tokens_per_call(0.8, 0) == 1.0


def test_predicted_speedup_is_theorem_3_8():
    # (1 - 0.8^5) / ((1 - 0.8)(4 * 0.1 + 1)) = 0.67232 / 0.28
    assert bench.predicted_speedup(0.8, 4, 0.1) == pytest.approx(0.67232 / 0.28)
    assert bench.predicted_speedup(1.0, 4, 0.25) == pytest.approx(5 / 2)
    assert bench.predicted_speedup(0.0, 3, 0.5) == pytest.approx(1 / 2.5)
    assert bench.predicted_speedup(0.7, 4, 0.0) == bench.expected_tokens_per_call(0.7, 4)
    # with the verify call costing r target steps instead of 1
    assert bench.predicted_speedup_measured_verify(0.8, 4, 0.1, 1.0) == pytest.approx(
        bench.predicted_speedup(0.8, 4, 0.1))
    assert bench.predicted_speedup_measured_verify(0.8, 4, 0.1, 2.0) == pytest.approx(
        0.67232 / 0.2 / 2.4)


@pytest.mark.parametrize("alpha, gamma, c", [(-0.1, 4, 0.1), (1.5, 4, 0.1), (0.5, -1, 0.1),
                                             (0.5, 4, -1.0), (0.5, True, 0.1)])
def test_theory_rejects_bad_arguments(alpha, gamma, c):
    with pytest.raises(MinispecError):
        bench.predicted_speedup(alpha, gamma, c)


def test_per_token_alpha_counts_tested_drafts_only():
    # 3 rounds of gamma 4: accepted 4 (no rejection), 1 (then rejected), 0 (rejected at once)
    assert bench.per_token_alpha(accepted=5, rejections=2) == pytest.approx(5 / 7)
    assert bench.per_token_alpha(0, 0) == 0.0


# ---- prompts ---------------------------------------------------------------------------------


def test_load_prompts_reads_each_format(tmp_path):
    (tmp_path / "p.json").write_text(json.dumps({"prompts": [{"id": 0, "text": "def f("},
                                                             {"text": "class A:"}]}))
    (tmp_path / "l.json").write_text(json.dumps(["a", "b", "c"]))
    (tmp_path / "p.txt").write_text("one\n\ntwo\n")
    assert bench.load_prompts(tmp_path / "p.json") == ["def f(", "class A:"]
    assert bench.load_prompts(tmp_path / "l.json", limit=2) == ["a", "b"]
    assert bench.load_prompts(tmp_path / "p.txt") == ["one", "two"]


def test_load_prompts_errors_name_the_file(tmp_path):
    (tmp_path / "bad.json").write_text("{not json")
    (tmp_path / "empty.json").write_text(json.dumps({"prompts": [{"text": ""}]}))
    for name in ("bad.json", "empty.json", "missing.json"):
        with pytest.raises(MinispecError, match=name):
            bench.load_prompts(tmp_path / name)


# ---- measurement helpers --------------------------------------------------------------------


def test_blas_threads_round_trip():
    before = bench.get_blas_threads()
    if before is None:
        pytest.skip("this NumPy's BLAS cannot be controlled here")
    with bench.blas_threads(1) as n:
        assert n == 1 and bench.get_blas_threads() == 1
    assert bench.get_blas_threads() == before
    with pytest.raises(MinispecError):
        bench.set_blas_threads(0)


def test_decode_step_timing_cost_ratio_and_verify_curve():
    model = random_model(tiny_config(), seed=0)
    t = bench.time_decode_step(model, k=3, context=8, repeats=2, warmup=1)
    assert t > 0
    c = bench.cost_ratio(model, model, context=8, repeats=2)
    assert set(c) == {"c", "draft_step_s", "target_step_s"}
    assert c["c"] == pytest.approx(c["draft_step_s"] / c["target_step_s"])
    curve = bench.verify_cost_curve(model, ks=[1, 2, 5], context=8, repeats=2)
    assert list(curve) == [1, 2, 5] and curve[1] == 1.0


def test_memory_floor_counts_every_weight_matrix_once():
    config = tiny_config(tie_word_embeddings=True)
    model = random_model(config, seed=0)
    w = model.weights
    layer = sum(a.nbytes for a in w["layers"][0].values() if a is not None)
    expected = config.n_layers * layer + w["norm_w"].nbytes + w["lm_head"].nbytes
    assert bench.decode_weight_bytes(model) == expected
    floor = bench.memory_floor(model, bandwidth=1e9)
    assert floor["floor_step_s"] == pytest.approx(expected / 1e9)
    assert floor["floor_tokens_per_s"] == pytest.approx(1e9 / expected)
    assert bench.copy_bandwidth(2**20, repeats=2) > 0


def test_time_generation_reports_medians_and_rates():
    class Result:
        def __init__(self, n):
            self.tokens = list(range(n))

    out = bench.time_generation(lambda p: Result(len(p)), [[1, 2], [3]], repeats=3, warmup=1)
    assert out["new_tokens"] == 3 and len(out["pass_seconds"]) == 3
    assert out["seconds"] == sorted(out["pass_seconds"])[1]
    assert out["tokens_per_second"] == pytest.approx(3 / out["seconds"])


# ---- the whole benchmark ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """A tiny random target/draft pair in HF layout (no tokenizer: synthetic prompts)."""
    root = tmp_path_factory.mktemp("pair")
    config = tiny_config(max_position_embeddings=128)
    save_checkpoint(random_model(config, seed=0, scale=0.5), root / "target")
    save_checkpoint(random_model(tiny_config(max_position_embeddings=128, n_layers=1), seed=1,
                                 scale=0.5), root / "draft")
    return root


def run_bench(pair, capsys, *extra):
    argv = ["--target", str(pair / "target"), "--draft", str(pair / "draft"), "--quick", *extra]
    assert bench.main(argv) == 0
    return capsys.readouterr().out


def test_bench_json_is_consistent(pair, capsys):
    r = json.loads(run_bench(pair, capsys, "--json", "--hf", "off"))
    for key in ("machine", "date", "settings", "models", "costs", "generation", "theory",
                "vs_hf", "greedy_agreement", "floor", "aims"):
        assert key in r
    for key in ("cpu", "cores", "python", "numpy", "blas", "minispec"):
        assert key in r["machine"]
    gen, th, costs = r["generation"], r["theory"], r["costs"]
    ar, sp = gen["minispec autoregressive"], gen["minispec speculative"]
    for row in (ar, sp):
        assert row["tokens_per_second"] == pytest.approx(row["new_tokens"] / row["seconds"])
        assert row["seconds"] == sorted(row["pass_seconds"])[len(row["pass_seconds"]) // 2]
    assert list(costs["verify_cost"]) == [str(k) for k in range(1, 10)]
    assert costs["verify_cost"]["1"] == 1.0
    assert costs["c"] == pytest.approx(costs["draft_step_s"] / costs["target_step_s"])
    assert costs["target_matmul_s"] > 0 and costs["draft_matmul_s"] > 0
    st = sp["stats"]
    assert th["alpha"] == pytest.approx(bench.per_token_alpha(st["accepted"], st["rejections"]))
    assert th["speedup"] == pytest.approx(sp["tokens_per_second"] / ar["tokens_per_second"])
    assert th["predicted_speedup"] == pytest.approx(
        bench.predicted_speedup(th["alpha"], 4, costs["c"]))
    assert th["speedup_over_predicted"] == pytest.approx(th["speedup"] / th["predicted_speedup"])
    assert th["verify_ratio"] == costs["verify_cost"]["5"]
    assert th["tokens_per_target_call"] == pytest.approx(st["new_tokens"] / st["target_calls"])
    fl = r["floor"]
    assert fl["autoregressive_fraction_of_floor"] == pytest.approx(
        fl["floor_step_s"] / (ar["seconds"] / ar["new_tokens"]))
    # speculative decoding is lossless: greedy outputs agree token for token
    agree = r["greedy_agreement"]["minispec speculative vs minispec autoregressive"]
    assert agree["identical"] == agree["total"] == r["settings"]["num_prompts"]
    assert all(isinstance(a["met"], bool) and math.isfinite(a["value"])
               for a in r["aims"].values())


def test_bench_table_for_people(pair, capsys):
    out = run_bench(pair, capsys, "--hf", "off", "--gamma", "2")
    for heading in ("machine", "threads", "costs", "verify cost", "memory floor", "generation",
                    "theory", "greedy outputs", "aims", "minispec speculative"):
        assert heading in out
    assert "g = 2" in out


@pytest.mark.slow
def test_bench_against_transformers(pair, capsys):
    pytest.importorskip("transformers")
    r = json.loads(run_bench(pair, capsys, "--json", "--hf", "on"))
    gen = r["generation"]
    assert {"hf generate", "hf assisted"} <= set(gen)
    ratio = r["vs_hf"]["minispec speculative / hf assisted"]
    assert ratio == pytest.approx(gen["minispec speculative"]["tokens_per_second"]
                                  / gen["hf assisted"]["tokens_per_second"])
    # float32 on both sides, same weights: greedy outputs agree
    agree = r["greedy_agreement"]["hf generate vs minispec autoregressive"]
    assert agree["identical"] == agree["total"]
    assert np.isfinite(r["aims"]["speculative >= hf assisted"]["value"])
    hf = r["costs"]["hf"]
    assert list(hf["verify_cost"]) == [str(k) for k in range(1, 10)]
    assert hf["c"] == pytest.approx(hf["draft_step_s"] / hf["target_step_s"])
