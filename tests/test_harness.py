"""The one timing harness (minispec/measure/harness.py): the theory's formulas and the
measurement helpers. Speed is never asserted (the machine is shared); shapes, keys and the
relations between the reported numbers are."""

import json
from types import SimpleNamespace

import numpy as np
import pytest
from conftest import tiny_config

import minispec
from minispec.backend import blas_threads, get_blas_threads, set_blas_threads, to_host
from minispec.errors import MinispecError
from minispec.loader import random_model
from minispec.measure import harness

# ---- the theory -----------------------------------------------------------------------------


def test_expected_tokens_per_call_is_equation_1():
    assert harness.expected_tokens_per_call(0.5, 2) == pytest.approx(1.75)  # 1 + .5 + .25
    assert harness.expected_tokens_per_call(0.0, 4) == 1.0
    assert harness.expected_tokens_per_call(1.0, 4) == 5.0  # the limit gamma + 1
    assert harness.expected_tokens_per_call(1 - 1e-12, 4) == pytest.approx(5.0)
    assert harness.expected_tokens_per_call(0.8, 0) == 1.0


def test_predicted_speedup_is_theorem_3_8():
    # (1 - 0.8^5) / ((1 - 0.8)(4 * 0.1 + 1)) = 0.67232 / 0.28
    assert harness.predicted_speedup(0.8, 4, 0.1) == pytest.approx(0.67232 / 0.28)
    assert harness.predicted_speedup(1.0, 4, 0.25) == pytest.approx(5 / 2)
    assert harness.predicted_speedup(0.0, 3, 0.5) == pytest.approx(1 / 2.5)
    assert harness.predicted_speedup(0.7, 4, 0.0) == harness.expected_tokens_per_call(0.7, 4)
    # with the verify call costing r target steps instead of 1
    assert harness.predicted_speedup_measured_verify(0.8, 4, 0.1, 1.0) == pytest.approx(
        harness.predicted_speedup(0.8, 4, 0.1))
    assert harness.predicted_speedup_measured_verify(0.8, 4, 0.1, 2.0) == pytest.approx(
        0.67232 / 0.2 / 2.4)


@pytest.mark.parametrize("alpha, gamma, c", [(-0.1, 4, 0.1), (1.5, 4, 0.1), (0.5, -1, 0.1),
                                             (0.5, 4, -1.0), (0.5, True, 0.1)])
def test_theory_rejects_bad_arguments(alpha, gamma, c):
    with pytest.raises(MinispecError):
        harness.predicted_speedup(alpha, gamma, c)


def result(*rounds):
    """A stand-in GenerationResult with chain rounds of (drafted, accepted)."""
    rs = [SimpleNamespace(drafted=[0] * d, depth=d, accepted=a) for d, a in rounds]
    return SimpleNamespace(stats=SimpleNamespace(rounds=rs))


def test_per_token_alpha_counts_tested_drafts_only():
    # 3 rounds of gamma 4: accepted 4 (no rejection), 1 (then rejected), 0 (rejected at once)
    assert harness.per_token_alpha([result((4, 4), (4, 1), (4, 0))]) == pytest.approx(5 / 7)
    # 4 drafted, 1 accepted then rejected: 2 tested, alpha 1/2 (accept rate would be 1/4)
    assert harness.per_token_alpha([result((4, 1))]) == 0.5
    # all accepted: alpha 1; rounds without drafts do not count
    assert harness.per_token_alpha([result((3, 3), (0, 0)), result((2, 2))]) == 1.0
    assert harness.per_token_alpha([result((0, 0))]) == 0.0


# ---- prompts ---------------------------------------------------------------------------------


def test_load_prompts_reads_each_format(tmp_path):
    (tmp_path / "p.json").write_text(json.dumps({"prompts": [{"id": 0, "text": "def f("},
                                                             {"text": "class A:"}]}))
    (tmp_path / "l.json").write_text(json.dumps(["a", "b", "c"]))
    (tmp_path / "p.txt").write_text("one\n\ntwo\n")
    assert harness.load_prompts(tmp_path / "p.json") == ["def f(", "class A:"]
    assert harness.load_prompts(tmp_path / "l.json", limit=2) == ["a", "b"]
    assert harness.load_prompts(tmp_path / "p.txt") == ["one", "two"]


def test_load_prompts_errors_name_the_file(tmp_path):
    (tmp_path / "bad.json").write_text("{not json")
    (tmp_path / "empty.json").write_text(json.dumps({"prompts": [{"text": ""}]}))
    (tmp_path / "image.txt").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00")  # not UTF-8
    for name in ("bad.json", "empty.json", "missing.json", "image.txt"):
        with pytest.raises(MinispecError, match=name):
            harness.load_prompts(tmp_path / name)
    with pytest.raises(MinispecError, match=r"--num-prompts: expected an integer >= 0"):
        harness.load_prompts(tmp_path / "bad.json", limit=-1)


def test_check_room_names_the_flag_before_any_cache_is_made():
    # the timing helpers make caches of typical_context + gamma + 1 positions: a huge value is
    # refused here, naming its flag, not by an allocation of gigabytes
    target = minispec.load("shipped:target")  # 512 positions
    prompts = [[1] * 80, [2] * 60]  # typical context: 70 + half the new tokens
    harness.check_room(target, prompts, 64, [4, 16])  # fits: nothing raised
    with pytest.raises(MinispecError, match=r"--max-new-tokens 1000: .* 570 positions"):
        harness.check_room(target, prompts, 1000)
    with pytest.raises(MinispecError, match=r"--gammas 500: a verify call of 501 tokens"):
        harness.check_room(target, prompts, 64, [4, 500], flag="--gammas")
    with pytest.raises(MinispecError, match=r"p\.txt: a prompt of 600 tokens leaves no room"):
        harness.check_room(target, [[1] * 600], 4, source="p.txt")


# ---- measurement helpers --------------------------------------------------------------------


def test_blas_threads_round_trip():
    before = get_blas_threads()
    if before is None:
        pytest.skip("this NumPy's BLAS cannot be controlled here")
    with blas_threads(1) as n:
        assert n == 1 and get_blas_threads() == 1
    assert get_blas_threads() == before
    with pytest.raises(MinispecError):
        set_blas_threads(0)


def test_decode_step_timing_round_costs_and_verify_curve():
    model = random_model(tiny_config(), seed=0)
    t = harness.time_decode_step(model, k=3, context=8, repeats=2, warmup=1)
    assert t > 0
    c = harness.round_costs(model, model, gamma=3, context=8, repeats=2)
    assert set(c) == {"c", "draft_step_s", "target_step_s", "verify_s", "verify_ratio"}
    assert c["c"] == pytest.approx(c["draft_step_s"] / c["target_step_s"])
    assert c["verify_ratio"] == pytest.approx(c["verify_s"] / c["target_step_s"])
    assert harness.round_costs(model, None, gamma=2, context=8, repeats=2)["c"] == 0.0
    curve = harness.verify_cost_curve(model, ks=[1, 2, 5], context=8, repeats=2)
    assert list(curve) == [1, 2, 5] and curve[1] == 1.0


def test_early_exit_step_is_the_first_k_layers_and_the_head():
    target = random_model(tiny_config(n_layers=3), seed=0)
    step = harness.draft_step_model("early-exit", target, exit_layer=2)  # asked of the drafter
    assert harness.draft_step_model("ngram", target) is None
    assert harness.draft_step_model("model", target, draft_model=target) is target
    cache = step.new_cache(16)
    seq = [4, 8, 15, 16, 23]
    step.forward(seq[:3], cache)
    logits = to_host(step.forward(seq[3:], cache))[-1]
    h = target.run_layers(target.embed(seq, 0), None, 0, 0, 2)
    np.testing.assert_allclose(logits, to_host(target.lm_head(h))[-1], rtol=1e-4, atol=1e-5)
    assert cache.length == 5


def test_memory_floor_counts_every_weight_matrix_once():
    config = tiny_config(tie_word_embeddings=True)
    model = random_model(config, seed=0)
    w = model.weights
    layer = sum(a.nbytes for a in w["layers"][0].values() if a is not None)
    expected = config.n_layers * layer + w["norm_w"].nbytes + w["lm_head"].nbytes
    assert harness.decode_weight_bytes(model) == expected
    floor = harness.memory_floor(model, bandwidth=1e9)
    assert floor["floor_step_s"] == pytest.approx(expected / 1e9)
    assert floor["floor_tokens_per_s"] == pytest.approx(1e9 / expected)
    assert harness.copy_bandwidth(2**20, repeats=2) > 0


def test_arithmetic_per_token_scales_each_cut_matrix_to_the_whole(monkeypatch):
    # a clock that advances by 1 ns per multiply-add of `linear`: the arithmetic of a token is
    # then 1 ns times every weight of a step (each matrix of layer 0 timed cut, counted for
    # every layer; the LM head once), whatever the cut
    from minispec.core import model as core_model

    model = random_model(tiny_config(tie_word_embeddings=True), seed=0)
    clock = [0.0]

    def linear(x, w):
        clock[0] += 1e-9 * x.shape[0] * w.shape[0] * w.shape[1]

    monkeypatch.setattr(core_model, "linear", linear)
    monkeypatch.setattr(harness.time, "perf_counter", lambda: clock[0])
    w = model.weights
    layer = sum(w["layers"][0][n].size for n in ("wqkv", "wo", "w_gate", "w_up", "w_down"))
    macs = model.n_layers * layer + w["lm_head"].size
    for cut_bytes in (64, 4096, 2**20):
        assert harness.arithmetic_per_token(model, cut_bytes=cut_bytes, repeats=2) == (
            pytest.approx(1e-9 * macs))


def test_time_methods_reports_medians_and_rates():
    class Result:
        def __init__(self, n):
            self.tokens = list(range(n))

    calls = []
    out = harness.time_methods({"a": lambda p: Result(len(p)), "b": lambda p: Result(1)},
                               [[1, 2], [3]], repeats=3, between=lambda: calls.append(1))
    a = out["a"]
    assert a["new_tokens"] == 3 and len(a["pass_seconds"]) == 3 and len(calls) == 3
    assert a["seconds"] == sorted(a["pass_seconds"])[1]
    assert a["tokens_per_second"] == pytest.approx(3 / a["seconds"])
    assert out["b"]["outputs"] == [[0], [0]] and "stats" not in a


