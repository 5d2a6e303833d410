"""The forward pass: every cached path equals a full recompute (Model.logits), for every family."""

import numpy as np
import pytest
from conftest import FAMILIES, tiny_config

from minispec.backend import to_host
from minispec.core.model import KVCache, causal_mask
from minispec.errors import MinispecError
from minispec.loader import random_model

TOL = 2e-5  # float32; logits are O(1) with scale=0.3
TOKENS = [3, 17, 5, 42, 8, 8, 0, 31, 22, 9, 14, 47, 2, 6, 11, 30]


def _model(family, device, **overrides):
    return random_model(tiny_config(family, **overrides), seed=7, device=device, scale=0.3)


def _fwd(model, tokens, cache):
    return to_host(model.forward(tokens, cache))


@pytest.mark.parametrize("family", FAMILIES)
def test_prefill_then_decode_equals_full_recompute(family, device):
    m = _model(family, device)
    ref = m.logits(TOKENS)
    assert ref.shape == (len(TOKENS), 48) and ref.dtype == np.float32
    cache = m.new_cache()
    got = [_fwd(m, TOKENS[:5], cache)]
    for t in TOKENS[5:]:
        got.append(_fwd(m, [t], cache))
    assert cache.length == len(TOKENS)
    np.testing.assert_allclose(np.concatenate(got), ref, atol=TOL, rtol=0)
    assert np.abs(ref).max() > 0.5  # the comparison is not between near-zero logits


@pytest.mark.parametrize("family", FAMILIES)
def test_multi_token_steps_and_rollback(family, device):
    m = _model(family, device)
    ref = m.logits(TOKENS)
    cache = m.new_cache(32)
    np.testing.assert_allclose(_fwd(m, TOKENS[:4], cache), ref[:4], atol=TOL, rtol=0)
    # a verification-style step: 5 tokens in one call
    np.testing.assert_allclose(_fwd(m, TOKENS[4:9], cache), ref[4:9], atol=TOL, rtol=0)
    # reject the last three: roll back and feed different tokens in their place
    cache.rollback(6)
    other = [1, 2, 3, 4]
    ref2 = m.logits(TOKENS[:6] + other)
    np.testing.assert_allclose(_fwd(m, other[:3], cache), ref2[6:9], atol=TOL, rtol=0)
    np.testing.assert_allclose(_fwd(m, other[3:], cache), ref2[9:], atol=TOL, rtol=0)
    # roll back to empty and start again
    cache.rollback(0)
    np.testing.assert_allclose(_fwd(m, TOKENS, cache), ref, atol=TOL, rtol=0)


@pytest.mark.parametrize("family", FAMILIES)
def test_pieces_compose_to_forward(family, device):
    m = _model(family, device)
    ref = m.logits(TOKENS[:7])
    cache = m.new_cache(16)
    h = m.embed(TOKENS[:7], 0)
    h = m.run_layers(h, cache, 0, 0, 1)
    h = m.run_layers(h, cache, 0, 1, m.n_layers)
    np.testing.assert_allclose(to_host(m.lm_head(h)), ref, atol=TOL, rtol=0)
    assert cache.length == 0  # run_layers leaves the length to its caller
    # the first layer alone then the head: an early-exit drafter's view, deterministic
    early = to_host(m.lm_head(m.run_layers(m.embed(TOKENS[:7], 0), None, 0, 0, 1)))
    assert early.shape == ref.shape and not np.allclose(early, ref)


def test_sliding_window_limits_attention(device):
    windowed = _model("mistral", device, sliding_window=4)
    full = _model("mistral", device, sliding_window=None)
    a, b = windowed.logits(TOKENS), full.logits(TOKENS)
    # within the window nothing differs; past it the early tokens are out of view
    np.testing.assert_allclose(a[:4], b[:4], atol=TOL, rtol=0)
    assert np.abs(a[8:] - b[8:]).max() > 1e-3
    # a token far enough back that no layer reaches it no longer changes the last position
    changed = windowed.logits([7] + TOKENS[1:])
    np.testing.assert_allclose(changed[-1], a[-1], atol=TOL, rtol=0)


def test_causal_mask():
    m = causal_mask(np, 2, 3, 5, None)
    assert m.tolist() == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 0], [1, 1, 1, 1, 1]]
    w = causal_mask(np, 2, 3, 5, 2)
    assert w.tolist() == [[0, 1, 1, 0, 0], [0, 0, 1, 1, 0], [0, 0, 0, 1, 1]]


def test_random_model_is_deterministic_and_scale_sharpens():
    c = tiny_config()
    a = random_model(c, seed=3, scale=0.3).logits([1, 2, 3])
    np.testing.assert_array_equal(a, random_model(c, seed=3, scale=0.3).logits([1, 2, 3]))
    assert not np.allclose(a, random_model(c, seed=4, scale=0.3).logits([1, 2, 3]))
    small = random_model(c, seed=3, scale=0.02).logits([1, 2, 3])
    assert np.ptp(small[-1]) < np.ptp(a[-1])


def test_model_attributes():
    m = random_model(tiny_config("qwen2"))
    assert (m.vocab_size, m.n_layers, m.device, m.dtype, m.tokenizer) == (48, 2, "cpu",
                                                                        np.float32, None)
    assert m.xp is np and m.name == "random-qwen2"


def test_default_cache_is_capped():
    m = random_model(tiny_config(max_position_embeddings=131072, n_layers=1))
    cache = m.new_cache()
    assert isinstance(cache, KVCache) and cache.max_len == 4096
    assert cache.k.shape == (1, 2, 4096, 8)
    assert m.new_cache(8).max_len == 8


def test_cache_overflow_names_max_len():
    m = _model("llama", "cpu")
    cache = m.new_cache(8)
    m.forward(TOKENS[:6], cache)
    with pytest.raises(MinispecError, match="max_len=8"):
        m.forward(TOKENS[:3], cache)
    assert cache.length == 6  # a refused step leaves the cache as it was
    m.forward(TOKENS[:2], cache)
    assert cache.length == 8


def test_context_overflow_names_field():
    m = _model("gpt2", "cpu", max_position_embeddings=8)
    with pytest.raises(MinispecError, match="max_position_embeddings=8"):
        m.logits(list(range(9)))
    with pytest.raises(MinispecError, match="max_position_embeddings=8"):
        m.new_cache(9)


def test_bad_tokens_and_rollback():
    m = _model("llama", "cpu")
    with pytest.raises(MinispecError, match="vocab_size"):
        m.logits([1, 48])
    with pytest.raises(MinispecError, match="vocab_size"):
        m.logits([-1])
    with pytest.raises(MinispecError, match="non-empty"):
        m.logits([])
    cache = m.new_cache(8)
    m.forward([1, 2, 3], cache)
    with pytest.raises(MinispecError, match="0..3"):
        cache.rollback(4)
    with pytest.raises(MinispecError, match="0..3"):
        cache.rollback(-1)
    with pytest.raises(MinispecError, match="first <= end"):
        m.run_layers(m.embed([1], 3), cache, 3, 1, 5)


def test_float16_compute_close_to_float32(device):
    if device == "cpu":
        pytest.skip("float16 compute is meant for the GPU")
    c = tiny_config()
    a = random_model(c, seed=1, device=device, scale=0.3).logits(TOKENS)
    b = random_model(c, seed=1, device=device, dtype="float16", scale=0.3).logits(TOKENS)
    assert b.dtype == np.float32
    np.testing.assert_allclose(a, b, atol=5e-2, rtol=0)


def test_new_cache_refuses_what_it_cannot_hold():
    m = _model("llama", "cpu")
    for bad in (True, 0, -3, 2.5, "8"):
        with pytest.raises(MinispecError, match="max_len"):
            m.new_cache(bad)
    with pytest.raises(MinispecError, match="exceeds the model's context"):
        m.new_cache(10**400)
    huge = random_model(tiny_config(max_position_embeddings=10**12), seed=0)
    with pytest.raises(MinispecError, match="GiB"):
        huge.new_cache(10**11)
    # a generation asks only for what its request needs: a 10**12-position context is fine
    from minispec import autoregressive_generate
    r = autoregressive_generate(huge, [1, 2, 3], max_new_tokens=4, temperature=0)
    assert len(r.tokens) == 4


# ---- the parts issue 50 added: Qwen3's q/k norms, MLP biases, GPT-2's layer-scaled attention,
# YaRN, Qwen's every-layer window -----------------------------------------------------------------

VARIANTS = {
    "qwen3": ("qwen3", {"head_dim": 16}),  # head_dim != hidden / heads, as Qwen3's
    "qwen3-bias": ("qwen3", {"attention_bias": True}),
    "llama-mlp-bias": ("llama", {"mlp_bias": True, "attention_bias": True}),
    "gpt2-layer-scale": ("gpt2", {"scale_attn_by_inverse_layer_idx": True}),
    "llama-yarn": ("llama", {"rope_scaling": {"rope_type": "yarn", "factor": 4.0,
                                              "original_max_position_embeddings": 8}}),
    "qwen2-window": ("qwen2", {"sliding_window": 5}),
}


@pytest.mark.parametrize("name", list(VARIANTS))
def test_every_cached_path_of_the_new_parts_equals_a_full_recompute(name):
    family, extra = VARIANTS[name]
    m = _model(family, "cpu", **extra)
    ref = m.logits(TOKENS)
    assert np.abs(ref).max() > 0.5
    # the part changes the function: the same weights without it give other logits
    plain = random_model(tiny_config(family, **{k: None if k == "rope_scaling" else v
                                                for k, v in extra.items()
                                                if k in ("head_dim", "rope_scaling")}),
                         seed=7, scale=0.3)
    if name not in ("qwen3", "qwen3-bias"):  # (qwen3's plain twin has other tensors)
        assert not np.allclose(plain.logits(TOKENS), ref, atol=1e-3)
    cache = m.new_cache(32)
    steps = [_fwd(m, TOKENS[:5], cache), _fwd(m, TOKENS[5:6], cache), _fwd(m, TOKENS[6:10], cache)]
    cache.rollback(8)
    steps = np.concatenate(steps)[:8]
    rest = _fwd(m, TOKENS[8:], cache)
    np.testing.assert_allclose(np.concatenate([steps, rest]), ref, atol=TOL, rtol=0)


def test_qwen3_normalises_each_query_and_key_head():
    m = _model("qwen3", "cpu", head_dim=16)
    layer = m.weights["layers"][0]
    assert layer["q_norm_w"].shape == layer["k_norm_w"].shape == (16,)
    ref = m.logits(TOKENS[:6])
    # scaling a head's query (or key) projection rows changes nothing after its RMSNorm ...
    wqkv = layer["wqkv"].copy()
    layer["wqkv"] = wqkv * np.concatenate([np.full(16, 3.0), np.ones(wqkv.shape[1] - 16)])
    np.testing.assert_allclose(m.logits(TOKENS[:6]), ref, atol=TOL, rtol=0)
    # ... while changing the norm weights does
    layer["wqkv"], layer["k_norm_w"] = wqkv, layer["k_norm_w"] * 2
    assert not np.allclose(m.logits(TOKENS[:6]), ref, atol=1e-3)


def test_yarn_scales_cos_and_sin_by_its_attention_factor():
    m = _model("llama", "cpu", rope_scaling={"rope_type": "yarn", "factor": 16.0,
                                             "original_max_position_embeddings": 8})
    cos, sin = m.rope_rows(np.arange(5))
    np.testing.assert_allclose(cos**2 + sin**2, (0.1 * np.log(16) + 1) ** 2, rtol=1e-6)
    # the last guard, for a config changed after its checks (from_hf refuses such a theta)
    from minispec.core.model import rope_inv_freq

    c = tiny_config()
    c.rope_theta = 0.0
    with np.errstate(all="ignore"), pytest.raises(MinispecError, match="not finite"):
        rope_inv_freq(c)


@pytest.mark.parametrize("name", VARIANTS)
def test_the_batched_forward_computes_the_new_parts_too(name):
    from minispec.batch_forward import batch_hidden

    family, extra = VARIANTS[name]
    m = _model(family, "cpu", **extra)
    seqs = [TOKENS[:7], TOKENS[3:12]]
    caches = [m.new_cache(32), m.new_cache(32)]
    hs = batch_hidden(m, seqs, caches)
    for h, seq in zip(hs, seqs):
        np.testing.assert_allclose(to_host(m.lm_head(h)), m.logits(seq), atol=TOL, rtol=0)
