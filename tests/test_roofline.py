"""minispec roofline (minispec/measure/roofline.py) on the CPU: the report's figures hang
together, and the 1B writer makes a checkpoint minispec loads."""

import importlib.util
import json

import pytest

from minispec.loader import load
from minispec.measure import roofline


def test_roofline_reports_the_floor_and_the_same_tokens(capsys):
    assert roofline.main(["--repeats", "2", "--new-tokens", "6", "--hf", "off", "--json",
                          "--device", "cpu"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["device"] == "cpu" and list(r["paths"]) == ["plain"]  # no graphs on the CPU
    p = r["paths"]["plain"]
    # the shipped target: 16M parameters, read as stored (bfloat16) by default
    assert 30e6 < r["weight_bytes"] < 34e6 and r["dtype"] == "float32"
    assert roofline.main(["--repeats", "2", "--new-tokens", "2", "--hf", "off", "--json",
                          "--device", "cpu", "--dtype", "float32"]) == 0
    assert json.loads(capsys.readouterr().out)["weight_bytes"] > 60e6  # widened at load
    assert r["floor_step_s"] == pytest.approx(r["weight_bytes"] / (r["read_bandwidth_GBps"] * 1e9))
    assert p["floor_fraction"] == pytest.approx(r["floor_step_s"] / p["step_s"]["1"])
    assert set(p["t_over_t1"]) == {"1", "2", "3", "5", "9", "16"} and p["t_over_t1"]["1"] == 1
    assert len(p["tokens"]) == 6 and p["same_tokens_as_plain"] == 6
    # each call against the larger of its two floors: reading the weights, k tokens' arithmetic
    a = r["arithmetic_per_token_s"]
    assert a > 0
    for k, s in p["step_s"].items():
        assert p["call_floor_fraction"][k] == pytest.approx(
            max(r["floor_step_s"], int(k) * a) / s)


@pytest.mark.skipif(importlib.util.find_spec("transformers") is None,
                    reason="transformers' generate beside minispec's needs the parity extra")
def test_roofline_with_transformers_beside_it(capsys):
    # the default --dtype (the checkpoint's bfloat16 kept as stored, computed in float32):
    # transformers generates in float32 too, and its greedy tokens are minispec's
    assert roofline.main(["--repeats", "1", "--new-tokens", "4", "--json", "--device",
                          "cpu"]) == 0
    r = json.loads(capsys.readouterr().out)
    for attn in ("eager", "sdpa"):
        assert r[f"hf_{attn}"]["same_tokens_as_plain"] == 4
        assert r[f"hf_{attn}"]["generate_tokens_per_s"] > 0


def test_leading_agreement():
    assert roofline.leading_agreement([1, 2, 3], [1, 2, 4]) == 2
    assert roofline.leading_agreement([5], [6]) == 0


@pytest.mark.skipif(importlib.util.find_spec("transformers") is None,
                    reason="writing the random Llama needs transformers (the parity extra)")
def test_random_llama_writer_makes_a_loadable_checkpoint(tmp_path, monkeypatch):
    small = dict(roofline.LLAMA_1B, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, vocab_size=300)
    monkeypatch.setattr(roofline, "LLAMA_1B", small)
    m = load(roofline.write_random_llama(tmp_path / "llama"), device="cpu")
    c = m.config
    assert (c.hidden_size, c.n_layers, c.n_heads, c.n_kv_heads, c.vocab_size) == (64, 2, 4, 2, 300)
    assert c.rope_theta == 500000.0 and c.tie_word_embeddings


@pytest.mark.parametrize("argv, message", [
    (["--repeats", "0"], "--repeats: expected a positive integer, got 0"),  # a report of nan
    (["--repeats", "1000000000000"], "--repeats: at most 1000"),  # a run of years
    (["--new-tokens", "0"], "--new-tokens: expected a positive integer"),
    # past the context: the throughput was divided by tokens never made
    (["--new-tokens", "100000"], "--new-tokens 100000: after the 8-token prompt it passes"),
])
def test_bad_counts_are_one_line_naming_the_flag(capsys, argv, message):
    assert roofline.main(["--hf", "off", "--device", "cpu", *argv]) == 2
    out, err = capsys.readouterr()
    assert out == "" and message in err and "Traceback" not in err, err

