"""minispec bench (minispec/measure/bench.py): the report's arithmetic, end to end.

Speed is never asserted (the machine is shared); shapes, keys and the relations between the
reported numbers are.
"""

import json
import math

import numpy as np
import pytest
from conftest import tiny_config

from minispec.loader import random_model, save_checkpoint
from minispec.measure import bench, harness

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
    # the costs are timed at the run's mean cache length: the prompts' mean plus half the new
    # tokens (a call's attention grows with it)
    lo, hi = r["settings"]["prompt_tokens"]
    assert lo <= costs["context"] - r["settings"]["max_new_tokens"] // 2 <= hi
    assert list(costs["verify_cost"]) == [str(k) for k in range(1, 10)]
    assert costs["verify_cost"]["1"] == 1.0
    assert costs["c"] > 0 and costs["verify_ratio"] > 0
    assert costs["target_matmul_s"] > 0 and costs["draft_matmul_s"] > 0
    st = sp["stats"]
    assert th["alpha"] == pytest.approx(st["accepted"] / (st["accepted"] + st["rejections"]))
    # Theorem 3.8's speedup is the decode phase's (after each prompt's first round, its prefill)
    assert ar["decode_tokens_per_second"] > 0 and sp["decode_tokens_per_second"] > 0
    assert th["speedup"] == pytest.approx(
        sp["decode_tokens_per_second"] / ar["decode_tokens_per_second"])
    assert th["speedup_end_to_end"] == pytest.approx(
        sp["tokens_per_second"] / ar["tokens_per_second"])
    assert th["predicted_speedup"] == pytest.approx(
        harness.predicted_speedup(th["alpha"], 4, costs["c"]))
    assert th["speedup_over_predicted"] == pytest.approx(th["speedup"] / th["predicted_speedup"])
    assert th["verify_ratio"] == costs["verify_cost"]["5"]
    assert th["tokens_per_target_call"] == pytest.approx(st["new_tokens"] / st["target_calls"])
    fl = r["floor"]
    assert fl["autoregressive_fraction_of_floor"] == pytest.approx(
        fl["floor_step_s"] * ar["decode_tokens_per_second"])
    assert fl["autoregressive_step_s_end_to_end"] == pytest.approx(ar["seconds"] / ar["new_tokens"])
    # the bytes a step's weight products read (as stored) per second of them
    assert fl["products_bandwidth"] == pytest.approx(
        fl["weight_bytes"] / r["costs"]["target_matmul_s"])
    # a call of 5 tokens at no less than 5 tokens' arithmetic (8 rows, weights in the cache),
    # nor than one step: the theorem's speedup at that verify cost
    a = costs["arithmetic_per_token_s"]
    assert a > 0 and fl["arithmetic_per_token_s"] == a
    assert th["verify_ratio_arithmetic"] == pytest.approx(max(5 * a / costs["target_step_s"], 1))
    assert th["predicted_speedup_arithmetic_verify"] == pytest.approx(
        harness.predicted_speedup_measured_verify(th["alpha"], 4, costs["c"],
                                                  th["verify_ratio_arithmetic"]))
    # the costs the decode loop paid, from the rounds' own timers (the decode rounds only)
    lp, sr, ar_r = th["loop"], sp["decode_rounds"], ar["decode_rounds"]
    assert ar_r["rounds"] == ar_r["emitted"] and ar_r["positions"] == 0  # one token a round
    assert lp["step_s"] == pytest.approx(ar_r["verify_seconds"] / ar_r["rounds"])
    assert lp["verify_ratio"] == pytest.approx(sr["verify_seconds"] / sr["rounds"] / lp["step_s"])
    assert lp["c"] == pytest.approx(sr["draft_seconds"] / sr["positions"] / lp["step_s"])
    assert 0 < lp["gamma"] <= 4
    assert lp["predicted_speedup"] == pytest.approx(harness.predicted_speedup_measured_verify(
        th["alpha"], lp["gamma"], lp["c"], lp["verify_ratio"]))
    # and what a draft cost in the loop, beside the draft model's weight products
    draft_ms = lp["c"] * lp["step_s"] * 1e3
    assert f"in the decode loop a draft {draft_ms:.3f} ms, " in bench.format_report(r)
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
    assert "with the costs the decode loop paid" in out


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


def test_bench_times_both_products_and_draws_them(pair, capsys, tmp_path):
    # the target's k-token calls, k = 1..16, with the kernel and with NumPy's BLAS, and the PNG
    pytest.importorskip("matplotlib", reason="--plot needs matplotlib")
    png = tmp_path / "verify_cost.png"
    r = json.loads(run_bench(pair, capsys, "--json", "--hf", "off", "--plot", str(png)))
    calls = r["costs"]["target_call_s"]
    expected = {"minispec", "minispec, NumPy BLAS"} if bench.kernel_available() else {"minispec"}
    assert set(calls) == expected
    assert all(list(c) == [str(k) for k in range(1, 17)] for c in calls.values())
    ratio = calls["minispec"]["5"] / calls["minispec"]["1"]
    assert r["aims"]["target call t(5)/t(1) <= 1.25"]["value"] == pytest.approx(ratio)
    # the rest of a decode step: the decode loop's token less the weight products, its share
    fl = r["floor"]
    assert fl["rest_of_step_s"] == pytest.approx(
        fl["autoregressive_step_s"] - r["costs"]["target_matmul_s"])
    share = max(fl["rest_of_step_s"], 0.0) / fl["autoregressive_step_s"]
    assert fl["rest_of_step_share"] == pytest.approx(share)
    assert r["aims"]["the rest of a decode step <= 0.2 of it (all but the weight products)"][
        "value"] == pytest.approx(share)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_without_a_draft_model(pair, capsys):
    # --draft none: minispec's prompt lookup and early exit beside transformers' generate and
    # prompt lookup (when installed), every greedy output autoregressive decoding's
    hf = "on" if bench._hf_available() else "off"
    argv = ["--target", str(pair / "target"), "--draft", "none", "--quick", "--json", "--hf", hf]
    assert bench.main(argv) == 0
    r = json.loads(capsys.readouterr().out)
    gen = r["generation"]
    mine = ["minispec autoregressive", "minispec ngram", "minispec early-exit"]
    assert list(gen) == mine + (["hf generate", "hf prompt lookup"] if hf == "on" else [])
    for name in list(gen)[1:]:
        agree = r["greedy_agreement"][f"{name} vs minispec autoregressive"]
        assert agree["identical"] == agree["total"] == 1, name
    for name in mine:
        assert 1.0 <= gen[name]["tokens_per_target_call"] <= 5.0  # at most gamma + 1
        assert gen[name]["speedup"] == pytest.approx(
            gen[name]["tokens_per_second"] / gen[mine[0]]["tokens_per_second"])
    assert gen[mine[0]]["tokens_per_target_call"] == 1.0
    # the floor's companion: a token's arithmetic, the same figure in costs and floor
    assert r["floor"]["arithmetic_per_token_s"] == r["costs"]["arithmetic_per_token_s"] > 0
    # the floor: the bytes a step reads as stored, at the read test's rate; the step's fraction
    fl, costs = r["floor"], r["costs"]
    assert fl["weight_bytes"] == r["target"]["weight_bytes"]
    assert fl["floor_step_s"] == pytest.approx(fl["weight_bytes"] / fl["bandwidth"])
    assert fl["step_fraction_of_floor"] == pytest.approx(
        fl["floor_step_s"] / costs["target_step_s"])
    assert fl["autoregressive_fraction_of_floor"] == pytest.approx(
        fl["floor_step_s"] * gen[mine[0]]["decode_tokens_per_second"])
    with pytest.raises(bench.MinispecError, match="--drafters: 'model'"):
        bench.main(["--target", str(pair / "target"), "--draft", "none", "--drafters", "model"])


def test_bench_without_a_draft_model_with_an_assistant(pair, capsys):
    # --assistant: the same draft model drafts for minispec's chain and transformers' assisted
    # generation, in the --draft none run beside the self-drafters; greedy outputs unchanged
    hf = "on" if bench._hf_available() else "off"
    argv = ["--target", str(pair / "target"), "--draft", "none", "--drafters", "ngram",
            "--assistant", str(pair / "draft"), "--quick", "--json", "--hf", hf]
    assert bench.main(argv) == 0
    r = json.loads(capsys.readouterr().out)
    gen = r["generation"]
    hf_rows = ["hf generate", "hf prompt lookup", "hf assisted", "hf assisted (hf defaults)"]
    assert list(gen) == (["minispec autoregressive", "minispec ngram", "minispec model",
                          "minispec model-stop"]
                         + (hf_rows if hf == "on" else []))
    assert r["settings"]["assistant"] == str(pair / "draft")
    for name in list(gen)[1:]:
        agree = r["greedy_agreement"][f"{name} vs minispec autoregressive"]
        assert agree["identical"] == agree["total"] == 1, name
    assert 1.0 <= gen["minispec model"]["tokens_per_target_call"] <= 5.0
    with pytest.raises(bench.MinispecError, match="--assistant: only with --draft none"):
        bench.main(["--target", str(pair / "target"), "--assistant", str(pair / "draft")])


def test_the_decode_rate_leaves_out_each_first_round():
    """harness.decode_rate: tokens and seconds after each generation's first round."""
    from minispec.core.speculative import GenerationResult, Round, Stats

    def result(n_tokens, first_emitted, first_seconds, total):
        st = Stats(drafter="none", gamma=0, total_seconds=total)
        st.rounds = [Round([], 0, 1, "bonus", [1] * first_emitted, verify_seconds=first_seconds)]
        return GenerationResult([1] * n_tokens, "length", st)

    rs = [result(10, 1, 0.5, 1.4), result(20, 3, 0.25, 2.25)]  # 9 + 17 tokens in 0.9 + 2.0 s
    assert harness.decode_rate(rs) == pytest.approx(26 / 2.9)


def test_loop_costs_are_the_decode_rounds_own_timers():
    """harness.decode_rounds sums the rounds after each first one; loop_costs divides them by the
    autoregressive round (a step as the loop paid it)."""
    from minispec.core.speculative import GenerationResult, Round, Stats

    def result(rounds):
        st = Stats(drafter="x", gamma=4)
        st.rounds = [Round([7] * d, a, 1, "correction", [1] * (a + 1), draft_seconds=ds,
                           verify_seconds=vs, depth=d) for d, a, ds, vs in rounds]
        return GenerationResult([1] * sum(a + 1 for _, a, _, _ in rounds), "length", st)

    ar = harness.decode_rounds([result([(0, 0, 0.0, 9.0)] + [(0, 0, 0.0, 0.002)] * 10)])
    assert ar == {"rounds": 10, "positions": 0, "emitted": 10, "draft_seconds": 0.0,
                  "verify_seconds": pytest.approx(0.02)}
    sp = harness.decode_rounds([result([(4, 4, 5.0, 9.0), (4, 2, 0.001, 0.004)]),
                                result([(4, 0, 5.0, 9.0), (2, 2, 0.0005, 0.003)])])
    assert sp["rounds"] == 2 and sp["positions"] == 6 and sp["emitted"] == 6
    lp = harness.loop_costs(sp, ar)
    assert lp["step_s"] == pytest.approx(0.002)
    assert lp["verify_ratio"] == pytest.approx(0.0035 / 0.002)  # a round's call: 1.75 steps
    assert lp["c"] == pytest.approx(0.0015 / 6 / 0.002)
    assert lp["gamma"] == 3
    assert harness.loop_costs(harness.decode_rounds([result([(0, 0, 0.0, 1.0)])]), ar) is None


@pytest.mark.parametrize("extra, message", [
    (["--repeats", "0"], "--repeats: expected a positive integer, got 0"),
    (["--max-new-tokens", "-1"], "--max-new-tokens: expected a positive integer"),
    (["--num-prompts", "-1"], r"--num-prompts: expected an integer >= 0 \(0: all\)"),
    (["--plot", "/nonexistent-folder/x.png"], "--plot /nonexistent-folder/x.png: the folder"),
    # caches of the timed context plus gamma + 1 (or of the new tokens) before any generation:
    # refused naming the flag, not an allocation of gigabytes
    (["--gamma", "1000000000", "--quick"], "--gamma 1000000000: a verify call of"),
    (["--max-new-tokens", "1000000000000", "--num-prompts", "1"],
     "--max-new-tokens 1000000000000: the costs are timed at"),
    (["--draft", "none", "--drafters", "ngram", "--gamma", "100000", "--quick"],
     "--gamma 100000: a verify call of"),
    (["--drafters", "ngram"], "--drafters: only with --draft none"),  # was ignored
    (["--draft", "none", "--drafters", ","], "--drafters: expected some of ngram"),
])
def test_bad_counts_are_refused_naming_the_flag_before_any_work(pair, capsys, extra, message):
    with pytest.raises(bench.MinispecError, match=message):
        bench.main(["--target", str(pair / "target"), "--draft", str(pair / "draft"),
                    "--hf", "off", *extra] if "none" not in extra else
                   ["--target", str(pair / "target"), "--hf", "off", *extra])
    assert capsys.readouterr().out == ""


def test_a_run_with_no_decode_phase_reports_it_or_says_why(pair, capsys):
    # one new token: every generation ends in its first round, so no decode rate to compare
    # (a real prompt whose answer is one token did the same: a ZeroDivisionError before)
    argv = ["--target", str(pair / "target"), "--draft", "none", "--drafters", "ngram",
            "--max-new-tokens", "1", "--num-prompts", "2", "--repeats", "1", "--hf", "off"]
    assert bench.main([*argv, "--json"]) == 0
    gen = json.loads(capsys.readouterr().out)["generation"]
    assert all(row["decode_speedup"] is None for row in gen.values())
    assert bench.main(argv) == 0
    assert "minispec ngram" in capsys.readouterr().out
    with pytest.raises(bench.MinispecError, match="no decode phase to time against the theory"):
        bench.main(["--target", str(pair / "target"), "--draft", str(pair / "draft"),
                    "--max-new-tokens", "1", "--num-prompts", "2", "--repeats", "1", "--hf",
                    "off"])

