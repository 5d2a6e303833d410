"""Loading model directories: round trips in every dtype and layout, tokens, and every bad input."""

import json

import numpy as np
import pytest
from conftest import FAMILIES, tiny_config

from minispec.errors import MinispecError
from minispec.loader import _to_hf_tensors, load, random_model, save_checkpoint
from minispec.safetensors import save_file

TOKENS = [3, 17, 5, 42, 8, 0, 31]


def _saved(tmp_path, family="llama", bf16=False, **overrides):
    m = random_model(tiny_config(family, **overrides), seed=5, scale=0.3)
    save_checkpoint(m, tmp_path, bf16=bf16)
    return m


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("tied", [False, True])
def test_round_trip_f32(tmp_path, family, tied, device):
    m = _saved(tmp_path, family, tie_word_embeddings=tied)
    names = json.loads((tmp_path / "config.json").read_text())
    assert names["tie_word_embeddings"] is tied
    loaded = load(tmp_path, device=device)
    assert loaded.config == m.config and loaded.device == device and loaded.name == tmp_path.name
    np.testing.assert_array_equal(loaded.logits(TOKENS), m.logits(TOKENS))


def test_tied_checkpoint_has_no_lm_head(tmp_path):
    m = random_model(tiny_config(tie_word_embeddings=True))
    assert "lm_head.weight" not in _to_hf_tensors(m)
    assert "lm_head.weight" in _to_hf_tensors(random_model(tiny_config()))


def test_round_trip_bf16(tmp_path, device):
    m = _saved(tmp_path, bf16=True)
    loaded = load(tmp_path, device=device)
    # BF16 keeps 8 bits of mantissa: weights within 2^-8 relative, logits close
    w, w2 = m.weights["embed"], np.asarray(loaded.weights["embed"].get()
                                           if device == "gpu" else loaded.weights["embed"])
    np.testing.assert_allclose(w2, w, rtol=2**-8, atol=0)
    assert not np.array_equal(w2, w)
    # (exactness is test_bf16_exact_values; here the rounding of every weight adds up a little)
    np.testing.assert_allclose(loaded.logits(TOKENS), m.logits(TOKENS), atol=0.25, rtol=0)


def test_bf16_exact_values(tmp_path):
    # values exactly representable in BF16 come back exactly
    m = random_model(tiny_config())
    tensors = {k: (v.view(np.uint32) & 0xFFFF0000).view(np.float32)
               for k, v in _to_hf_tensors(m).items()}
    save_file(tensors, tmp_path / "model.safetensors", bf16=True)
    (tmp_path / "config.json").write_text(json.dumps(m.config.to_hf()))
    loaded = load(tmp_path, device="cpu")
    np.testing.assert_array_equal(loaded.weights["embed"], tensors["model.embed_tokens.weight"])


def test_round_trip_f16(tmp_path):
    m = random_model(tiny_config(), seed=2, scale=0.3)
    tensors = {k: v.astype(np.float16) for k, v in _to_hf_tensors(m).items()}
    save_file(tensors, tmp_path / "model.safetensors")
    (tmp_path / "config.json").write_text(json.dumps(m.config.to_hf()))
    loaded = load(tmp_path, device="cpu")
    assert loaded.dtype == np.float32
    np.testing.assert_array_equal(loaded.weights["embed"],
                                  tensors["model.embed_tokens.weight"].astype(np.float32))
    np.testing.assert_allclose(loaded.logits(TOKENS), m.logits(TOKENS), atol=0.01, rtol=0)


def _shard(tmp_path, m, n_shards=3):
    tensors = _to_hf_tensors(m)
    names = list(tensors)
    weight_map = {}
    for s in range(n_shards):
        fname = f"model-{s + 1:05d}-of-{n_shards:05d}.safetensors"
        part = {n: tensors[n] for n in names[s::n_shards]}
        save_file(part, tmp_path / fname)
        weight_map.update(dict.fromkeys(part, fname))
    (tmp_path / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": 0}, "weight_map": weight_map}))
    (tmp_path / "config.json").write_text(json.dumps(m.config.to_hf()))
    return weight_map


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_round_trip_sharded(tmp_path, family):
    m = random_model(tiny_config(family), seed=4, scale=0.3)
    _shard(tmp_path, m)
    np.testing.assert_array_equal(load(tmp_path, device="cpu").logits(TOKENS), m.logits(TOKENS))


def test_float16_compute_dtype(tmp_path):
    _saved(tmp_path)
    m = load(tmp_path, dtype="float16", device="cpu")
    assert m.dtype == np.float16 and m.weights["embed"].dtype == np.float16
    assert m.logits([1, 2]).dtype == np.float32
    with pytest.raises(MinispecError, match="dtype"):
        load(tmp_path, dtype="bfloat16", device="cpu")
