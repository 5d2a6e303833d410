"""int8 activations against a GGUF's Q4_1 blocks (kernels.py, "int8 activations"): llama.cpp's
arithmetic, opt-in with minispec.load(..., activations="int8").

Not the float32 model's bits, so what is checked is what a user relies on instead: the kernel
computes exactly its NumPy reference (kernels.int8_reference), a row's result does not depend
on the rows beside it (a verify call gives one-token steps' logits, so speculation stays
lossless against this model), the logits stay close to the float32 model's, greedy speculative
output equals greedy autoregressive output, and a request it cannot serve is refused by name.
"""

import json
import re

import numpy as np
import pytest
from test_gguf_blocks import Q4_1, Q8_0, TOKENS, _blocks, _quantized_gguf

import minispec
from minispec import backend, kernels
from minispec.convert import convert_gguf
from minispec.cpu_steps import enable
from minispec.drafters import make_drafter
from minispec.errors import MinispecError
from minispec.loader import GGUF_BLOCKS
from minispec.safetensors import SafetensorsFile

pytestmark = pytest.mark.skipif(not backend.int8_supported(),
                                reason="the int8 product needs numba and a CPU with AVX-512 VNNI")


@pytest.mark.parametrize("kind", [Q4_1, Q8_0], ids=["Q4_1", "Q8_0"])
def test_the_int8_product_is_its_numpy_reference_bit_for_bit(kind):
    rng = np.random.default_rng(0)
    blocks = _blocks(rng.standard_normal((200, 192)).astype(np.float32) * 0.1, kind)  # 200: a
    # last tile of 8 outputs; 192 inputs: 6 blocks
    tiles = kernels.int8_tiles(blocks)
    w = kernels.dequantize(blocks)
    loops = kernels.compiled()
    for t in (1, 2, 5, 6, 7, 13, 20, 37):  # passes of up to 6 rows: 1, 2, 3, 4, 7 of them
        x = rng.standard_normal((t, 192)).astype(np.float32)
        x[0, 5] *= 40  # one large activation: its block's scale grows, the others' do not
        y = np.empty((t, 200), np.float32)
        loops.int8_product(x, tiles, y)
        assert np.array_equal(y, kernels.int8_reference(x, blocks)), t
        for r in range(t):  # each row alone: the same bits as within the call
            one = np.empty((1, 200), np.float32)
            loops.int8_product(x[r:r + 1].copy(), tiles, one)
            assert np.array_equal(one[0], y[r]), (t, r)
        exact = x @ w.T
        assert np.abs(y - exact).max() < 0.03 * np.abs(exact).max(), t


def test_quantize_rounds_half_to_even_and_carries_nan_and_infinity():
    x = np.zeros((1, 128), np.float32)
    x[0, :4] = [127.0, -63.5, 0.5, 1.5]  # scale 127 / 127 = 1: the numbers themselves, rounded
    x[0, 64] = np.nan  # block 2
    x[0, 96:98] = [np.inf, 1.0]  # block 3
    q, dx, sx = kernels.quantize_rows(x)
    assert q[0, :4].tolist() == [127, -64, 0, 2]
    assert dx[0, 0] == 1.0 and sx[0, 0] == 127 - 64 + 0 + 2
    assert dx[0, 1] == 0 and sx[0, 1] == 0 and not q[0, 32:64].any()  # all zeros: scale 0
    assert np.isnan(dx[0, 2:]).all() and np.isnan(sx[0, 2:]).all() and not q[0, 64:].any()
    loops = kernels.compiled()
    rng = np.random.default_rng(1)
    for a in (x, rng.standard_normal((5, 96)).astype(np.float32) * 3):
        got = (np.empty(a.shape, np.int8), np.empty((a.shape[0], a.shape[1] // 32), np.float32),
               np.empty((a.shape[0], a.shape[1] // 32), np.float32))
        loops.quantize(a, *got)
        for mine, ref in zip(got, kernels.quantize_rows(a)):
            assert np.array_equal(mine, ref, equal_nan=True)
    # a NaN activation makes NaN outputs, as the float32 product does
    blocks = _blocks(rng.standard_normal((64, 128)).astype(np.float32), Q4_1)
    y = np.empty((1, 64), np.float32)
    loops.int8_product(x, kernels.int8_tiles(blocks), y)
    assert np.isnan(y).all()


def test_a_model_of_int8_activations_verifies_losslessly_and_stays_close(tmp_path):
    out = convert_gguf(_quantized_gguf(tmp_path, True), tmp_path / "hf")
    m, plain = minispec.load(out, activations="int8"), minispec.load(out)
    layers = m.weights["layers"]
    assert all(backend.kept_for_int8(p[n]) for p in layers for n in ("wqkv", "wo", "w_up"))
    assert backend.kept_for_int8(m.weights["lm_head"])  # Q8_0
    assert not backend.kept_for_int8(plain.weights["layers"][0]["wqkv"])
    enable(m)  # the speed path: int8's one arithmetic (minispec.load's docstring)
    ids = np.random.default_rng(2).integers(0, len(TOKENS), 30).tolist()
    new = [7, 8, 9, 10, 11]
    cache = m.new_cache(64)
    m.hidden_states(ids, cache)
    call = m.lm_head(m.hidden_states(new, cache))  # a verify call of 5 tokens
    cache = m.new_cache(64)
    m.hidden_states(ids, cache)
    steps = np.concatenate([m.lm_head(m.hidden_states([t], cache)) for t in new])
    assert np.array_equal(call, steps)
    # a call of more rows than cpu_steps.MAX_TOKENS (a prefill with a round's first drafts) too:
    # on the plain path its norms and attention would differ in the last bits, and int8
    # rounding can turn that into a far larger move
    long = (ids * 2)[:45]
    cache = m.new_cache(64)
    whole = m.lm_head(m.hidden_states(long, cache))
    cache = m.new_cache(64)
    m.hidden_states(long[:40], cache)
    tail = np.concatenate([m.lm_head(m.hidden_states([t], cache)) for t in long[40:]])
    assert np.array_equal(whole[40:], tail)
    # Model.logits, a fresh sequence without a cache, is that arithmetic too
    assert np.array_equal(m.logits(ids + new)[len(ids):], steps)
    # another model, a little: the logits move by the activations' rounding
    a, b = m.logits(ids + new), plain.logits(ids + new)
    assert np.abs(a - b).max() < 0.05 * np.abs(b).max()
    assert (a.argmax(-1) == b.argmax(-1)).mean() > 0.9
    # a prefill of more rows than the kernel's 256 multiplies int8 activations too
    x = np.random.default_rng(3).standard_normal((300, m.config.hidden_size)).astype(np.float32)
    w = layers[0]["wo"]
    f = SafetensorsFile(out / GGUF_BLOCKS)
    assert np.array_equal(backend.matmul(x, w), kernels.int8_reference(
        x, f.get_bytes("model.layers.0.self_attn.o_proj.weight")))
    prompt = ids[:12] + ids[:12]  # a repeat: lookup drafts
    auto = minispec.autoregressive_generate(m, prompt, max_new_tokens=16, temperature=0.0)
    spec = minispec.speculative_generate(m, make_drafter("ngram", m), prompt, max_new_tokens=16,
                                         temperature=0.0)
    assert spec.tokens == auto.tokens


def test_int8_activations_are_refused_where_they_cannot_run(tmp_path):
    out = convert_gguf(_quantized_gguf(tmp_path, True), tmp_path / "hf")
    with pytest.raises(MinispecError, match=r"activations: expected 'float32' or 'int8', got "
                                            r"'int4'"):
        minispec.load(out, activations="int4")
    with pytest.raises(MinispecError, match=r"activations='int8': the CPU's product with GGUF "
                                            r"blocks.*dtype 'float32'"):
        minispec.load(out, activations="int8", dtype="float32")
    (out / GGUF_BLOCKS).unlink()
    with pytest.raises(MinispecError, match=r"hf: activations='int8' multiplies a GGUF "
                                            r"conversion's Q4_1 and Q8_0 blocks, and there is "
                                            r"no gguf_blocks.safetensors here"):
        minispec.load(out, activations="int8")


def test_bench_runs_int8_activations_and_says_so(tmp_path, capsys):
    from minispec.measure import bench

    out = convert_gguf(_quantized_gguf(tmp_path, True), tmp_path / "hf")
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("the cat sat on\nab ab ab ab\n")
    argv = ["--target", str(out), "--draft", "none", "--drafters", "ngram", "--quick", "--json",
            "--hf", "off", "--prompts", str(prompts), "--max-new-tokens", "8",
            "--activations", "int8"]
    assert bench.main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    agree = report["greedy_agreement"]["minispec ngram vs minispec autoregressive"]
    assert agree["identical"] == agree["total"]
    assert "multiplying int8 activations" in json.dumps(report)


def test_the_judge_passes_a_drafter_on_a_model_of_int8_activations(tmp_path, capsys):
    from minispec.judge.main import main as judge_main

    out = convert_gguf(_quantized_gguf(tmp_path, True), tmp_path / "hf")
    text = "abcabcabcab"  # a byte a token, repeating: lookup drafts
    code = judge_main(["--drafter", "ngram", "--model", str(out), "--activations", "int8",
                       "--prompt", text, "--samples", "400"])
    report = capsys.readouterr().out  # the true tests pass; a broken verify step is caught
    # (the other control, resampling from p, moves little where ngram's q is one token: too
    # little for 400 samples to see, so the run's verdict is FAIL, exit 1)
    assert code in (0, 1) and "2/2 true tests pass" in report, report
    assert re.search(r"accept q/p .* rejected", report), report
    assert judge_main(["--drafter", "ngram", "--activations", "int8"]) == 2
    assert "--activations: goes with --drafter NAME --model DIR" in capsys.readouterr().err


def test_bench_and_drafters_refuse_int8_activations_off_the_speed_path(tmp_path, capsys):
    from minispec.measure import bench, drafters

    out = convert_gguf(_quantized_gguf(tmp_path, True), tmp_path / "hf")
    argv = ["--target", str(out), "--draft", "none", "--activations", "int8", "--fast-steps",
            "off"]
    why = "--activations int8: needs --fast-steps on"
    with pytest.raises(MinispecError, match=why):  # (the command line prints it, exit 2)
        bench.main(argv + ["--quick", "--hf", "off"])
    assert drafters.main(argv) == 2 and why in capsys.readouterr().err
