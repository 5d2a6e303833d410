"""Loading model directories: round trips in every dtype and layout, tokens, and every bad input."""

import json
import re

import numpy as np
import pytest
from conftest import FAMILIES, tiny_config

from minispec.backend import BF16, kernel_available
from minispec.errors import MinispecError
from minispec.loader import _to_hf_tensors, load, random_model, save_checkpoint, widened
from minispec.measure.harness import decode_weight_bytes
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
    if device == "cpu":
        np.testing.assert_array_equal(loaded.logits(TOKENS), m.logits(TOKENS))
    else:  # cuBLAS sums the products in another order than the CPU's kernel
        np.testing.assert_allclose(loaded.logits(TOKENS), m.logits(TOKENS), rtol=1e-4, atol=1e-4)


def test_loaded_weights_do_not_depend_on_the_file(tmp_path):
    m = _saved(tmp_path)
    loaded = load(tmp_path, device="cpu")
    before = loaded.logits(TOKENS)
    (tmp_path / "model.safetensors").write_bytes(b"")  # the file is gone; the model is not
    np.testing.assert_array_equal(loaded.logits(TOKENS), before)
    assert loaded.weights["embed"].flags.writeable and before.shape == (7, m.vocab_size)


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


def assert_same_logits(stored, wide, tokens):
    """Every logit the same bits: prefill (NumPy on widened weights), one-token steps and a
    5-token verify call (the few-rows kernel widening in registers)."""
    np.testing.assert_array_equal(stored.logits(tokens), wide.logits(tokens))
    caches = stored.new_cache(32), wide.new_cache(32)
    for m, c in zip((stored, wide), caches):
        m.forward(tokens[:2], c)
    for t in tokens[2:6]:
        np.testing.assert_array_equal(stored.forward([t], caches[0]), wide.forward([t], caches[1]))
    np.testing.assert_array_equal(stored.forward(tokens[:5], caches[0]),
                                  wide.forward(tokens[:5], caches[1]))


@pytest.mark.skipif(not kernel_available(), reason="weights stay as stored where numba runs "
                    "the few-rows kernel; without it they are widened at load")
@pytest.mark.parametrize("family", FAMILIES)
def test_a_bfloat16_checkpoint_stays_bfloat16_with_the_same_logits(tmp_path, family):
    save_checkpoint(random_model(tiny_config(family), seed=1, scale=0.1), tmp_path, bf16=True)
    stored = load(tmp_path, device="cpu")  # dtype None: the matrices as stored
    wide = load(tmp_path, device="cpu", dtype="float32")  # widened at load, as before
    layer = stored.weights["layers"][0]
    assert layer["wqkv"].dtype == layer["w_down"].dtype == stored.weights["lm_head"].dtype == BF16
    assert wide.weights["lm_head"].dtype == np.float32 == stored.weights["embed"].dtype
    assert 2 * decode_weight_bytes(stored) - decode_weight_bytes(wide) < 4096  # but the norms
    assert_same_logits(stored, wide, TOKENS)
    copy = widened(stored)  # float32 copies of the matrices (bench's NumPy-products path)
    head = copy.weights["lm_head"]
    assert head.dtype == np.float32 and head.T.flags.c_contiguous
    np.testing.assert_array_equal(copy.logits(TOKENS), wide.logits(TOKENS))
    save_checkpoint(stored, tmp_path / "again", bf16=True)  # written back as it was read
    np.testing.assert_array_equal(load(tmp_path / "again", dtype="float32").logits(TOKENS),
                                  wide.logits(TOKENS))


@pytest.mark.skipif(not kernel_available(), reason="weights stay as stored where numba runs "
                    "the few-rows kernel; without it they are widened at load")
def test_a_float16_checkpoint_stays_float16_with_the_same_logits():
    """The shipped draft model is stored F16: its matrices stay float16, every logit the
    widened-at-load model's, bit for bit (prefill, steps, a verify call)."""
    stored = load("shipped:draft", device="cpu")
    wide = load("shipped:draft", device="cpu", dtype="float32")
    layer = stored.weights["layers"][0]
    assert layer["wqkv"].dtype == layer["w_down"].dtype == np.float16
    assert wide.weights["layers"][0]["wqkv"].dtype == np.float32
    ids = [5, 17, 300, 12, 9, 41, 2, 77]
    assert_same_logits(stored, wide, ids)
    np.testing.assert_array_equal(widened(stored).logits(ids), wide.logits(ids))


def test_float32_and_explicit_dtypes_are_not_kept_16_bit(tmp_path):
    save_checkpoint(random_model(tiny_config()), tmp_path / "f32")
    assert load(tmp_path / "f32", device="cpu").weights["lm_head"].dtype == np.float32
    save_checkpoint(random_model(tiny_config()), tmp_path / "bf16", bf16=True)
    assert load(tmp_path / "bf16", device="cpu", dtype="float16").weights["lm_head"].dtype == \
        np.float16


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


def test_gpt2_without_transformer_prefix(tmp_path):
    # the original gpt2 files on the hub name tensors "h.0.attn..." with no "transformer." and carry
    # the attention-mask buffers "h.N.attn.bias"
    m = random_model(tiny_config("gpt2"), seed=3, scale=0.3)
    tensors = {k.removeprefix("transformer."): v for k, v in _to_hf_tensors(m).items()}
    tensors["h.0.attn.bias"] = np.ones((1, 1, 64, 64), np.float32)
    save_file(tensors, tmp_path / "model.safetensors")
    (tmp_path / "config.json").write_text(json.dumps(m.config.to_hf()))
    np.testing.assert_array_equal(load(tmp_path, device="cpu").logits(TOKENS), m.logits(TOKENS))


# -- bad input ---------------------------------------------------------------------------------


def test_not_a_directory_and_missing_files(tmp_path):
    with pytest.raises(MinispecError, match="nowhere: does not exist"):
        load(tmp_path / "nowhere")
    (tmp_path / "a_file").write_text("x")
    with pytest.raises(MinispecError, match="a_file: not a model directory"):
        load(tmp_path / "a_file")
    for bad in (None, 123):
        with pytest.raises(MinispecError, match="path must be a directory path"):
            load(bad)
    with pytest.raises(MinispecError, match="config.json: file not found"):
        load(tmp_path)
    (tmp_path / "config.json").write_text('{"model_type": "llama",')
    with pytest.raises(MinispecError, match="config.json: not valid JSON"):
        load(tmp_path)
    _saved(tmp_path)
    (tmp_path / "model.safetensors").unlink()
    with pytest.raises(MinispecError, match="no model.safetensors or model.safetensors.index.json"):
        load(tmp_path)


def test_unsupported_architecture(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "mamba", "vocab_size": 8}))
    with pytest.raises(MinispecError, match="config.json: model_type 'mamba'.*supported families: "
                                            "llama, qwen2, qwen3, mistral, gpt2"):
        load(tmp_path)


def _rewrite(tmp_path, edit):
    from minispec.safetensors import SafetensorsFile

    f = SafetensorsFile(tmp_path / "model.safetensors")
    tensors = {k: np.array(f.get(k)) for k in f}
    del f
    edit(tensors)
    save_file(tensors, tmp_path / "model.safetensors")


def test_missing_tensor(tmp_path):
    _saved(tmp_path)
    _rewrite(tmp_path, lambda t: t.pop("model.layers.1.mlp.up_proj.weight"))
    missing = r"tensor 'model.layers.1.mlp.up_proj.weight' is missing from the checkpoint "
    with pytest.raises(MinispecError, match=missing + r"\(expected shape \[64, 32\]"):
        load(tmp_path)


def test_untied_config_needs_lm_head(tmp_path):
    _saved(tmp_path, tie_word_embeddings=True)
    cfg = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "tie_word_embeddings": False}))
    with pytest.raises(MinispecError, match=r"'lm_head.weight' is missing.*\[48, 32\].*"
                                            r"tie_word_embeddings=False"):
        load(tmp_path)


def test_shape_disagrees_with_config(tmp_path):
    _saved(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "intermediate_size": 80}))
    with pytest.raises(MinispecError, match=r"model.safetensors: tensor "
                                            r"'model.layers.0.mlp.gate_proj.weight' has shape "
                                            r"\[64, 32\], expected \[80, 32\] from config.json"):
        load(tmp_path)


def test_shape_error_names_the_shard(tmp_path):
    m = random_model(tiny_config())
    weight_map = _shard(tmp_path, m)
    cfg = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "vocab_size": 50}))
    shard = weight_map["model.embed_tokens.weight"]
    with pytest.raises(MinispecError, match=f"{shard}: tensor 'model.embed_tokens.weight' has "
                                            r"shape \[48, 32\], expected \[50, 32\]"):
        load(tmp_path)


def test_truncated_and_bad_dtype_weights(tmp_path):
    _saved(tmp_path)
    raw = (tmp_path / "model.safetensors").read_bytes()
    (tmp_path / "model.safetensors").write_bytes(raw[: len(raw) // 2])
    with pytest.raises(MinispecError, match="model.safetensors: tensor .* run past the end"):
        load(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(raw[:5])
    with pytest.raises(MinispecError, match="model.safetensors: truncated"):
        load(tmp_path)


def test_unknown_dtype_in_a_used_tensor(tmp_path):
    m = random_model(tiny_config())
    tensors = _to_hf_tensors(m)
    save_file(tensors, tmp_path / "model.safetensors")
    (tmp_path / "config.json").write_text(json.dumps(m.config.to_hf()))
    raw = bytearray((tmp_path / "model.safetensors").read_bytes())
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    header["model.norm.weight"]["dtype"] = "U32"  # same size as F32: only the dtype is wrong
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (n - len(text))
    raw[8:8 + n] = text
    (tmp_path / "model.safetensors").write_bytes(bytes(raw))
    with pytest.raises(MinispecError, match="'model.norm.weight' has dtype U32; minispec reads "
                                            "F32, F16, BF16"):
        load(tmp_path)


def test_sequence_longer_than_context(tmp_path):
    _saved(tmp_path, max_position_embeddings=10)
    m = load(tmp_path, device="cpu")
    assert m.new_cache().max_len == 10
    with pytest.raises(MinispecError, match="longer than the context length .*"
                                            "max_position_embeddings=10"):
        m.forward(list(range(11)), m.new_cache())


# -- tokenizer and special tokens ----------------------------------------------------------------


def _write_tokenizer(path, bos_template: bool):
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    vocab = {"[UNK]": 0, "<s>": 1, "</s>": 2, "hello": 3, "world": 4, "<eot>": 5}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(["<s>", "</s>", "<eot>"])
    if bos_template:
        tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[
            ("<s>", 1)])
    tok.save(str(path / "tokenizer.json"))


def test_tokenizer_llama_style_adds_bos(tmp_path):
    _saved(tmp_path)
    _write_tokenizer(tmp_path, bos_template=True)
    m = load(tmp_path, device="cpu")
    tok = m.tokenizer
    assert tok.encode("hello world") == [1, 3, 4]
    assert tok.encode("hello world", add_bos=False) == [3, 4]
    assert tok.decode([1, 3, 4], skip_special_tokens=True) == "hello world"
    assert tok.vocab_size == 6 and m.vocab_size == 48  # the model's rows may exceed the tokenizer
    assert (m.config.bos_token_id, m.config.eos_token_id, tok.eos_id) == (1, 2, 2)


def test_tokenizer_without_bos_template(tmp_path):
    _saved(tmp_path)  # config.json has bos_token_id 1, but this tokenizer adds none (GPT-2, Qwen)
    _write_tokenizer(tmp_path, bos_template=False)
    tok = load(tmp_path, device="cpu").tokenizer
    assert tok.bos_id is None and tok.encode("hello world") == [3, 4]
    # tokenizer_config.json can switch it on explicitly
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"add_bos_token": True}))
    assert load(tmp_path, device="cpu").tokenizer.encode("world") == [1, 4]


def test_special_tokens_from_generation_and_tokenizer_config(tmp_path):
    _saved(tmp_path, bos_token_id=None, eos_token_id=None)
    _write_tokenizer(tmp_path, bos_template=True)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": "<s>", "eos_token": {"content": "</s>"}}))
    m = load(tmp_path, device="cpu")
    assert (m.config.bos_token_id, m.config.eos_token_ids) == (1, (2,))
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [5, 2]}))
    m = load(tmp_path, device="cpu")
    assert (m.config.eos_token_id, m.config.eos_token_ids, m.tokenizer.eos_id) == (5, (5, 2), 5)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"add_bos_token": False}))
    assert load(tmp_path, device="cpu").tokenizer.encode("hello") == [3]


def test_no_tokenizer_and_corrupt_tokenizer(tmp_path):
    _saved(tmp_path)
    assert load(tmp_path, device="cpu").tokenizer is None
    (tmp_path / "tokenizer.json").write_text("{broken")
    with pytest.raises(MinispecError, match="tokenizer.json: not valid JSON"):
        load(tmp_path, device="cpu")
    (tmp_path / "tokenizer.json").write_text('{"model": {"type": "Nonsense"}}')
    with pytest.raises(MinispecError, match="tokenizer.json: not a valid tokenizer.json"):
        load(tmp_path, device="cpu")


def test_a_fifo_or_a_huge_padding_is_refused_not_hung_or_aborted(tmp_path):
    import json
    import os

    _saved(tmp_path)
    os.mkfifo(tmp_path / "config.json.fifo")
    os.replace(tmp_path / "config.json.fifo", tmp_path / "tokenizer.json")
    with pytest.raises(MinispecError, match="tokenizer.json: not a regular file"):
        load(tmp_path, device="cpu")  # reading a FIFO would wait for a writer forever
    os.remove(tmp_path / "tokenizer.json")
    _write_tokenizer(tmp_path, bos_template=False)
    doc = json.loads((tmp_path / "tokenizer.json").read_text())
    doc["padding"] = {"strategy": {"Fixed": 1000000000}, "direction": "Right",
                      "pad_to_multiple_of": None, "pad_id": 0, "pad_type_id": 0,
                      "pad_token": "[PAD]"}
    (tmp_path / "tokenizer.json").write_text(json.dumps(doc))
    assert load(tmp_path, device="cpu").tokenizer.encode("hello world") == [3, 4]  # no padding


def test_non_finite_weights_are_refused_at_load(tmp_path):
    _saved(tmp_path)
    _rewrite(tmp_path, lambda t: t["model.layers.0.mlp.up_proj.weight"].__setitem__(
        (0, 0), np.nan))
    with pytest.raises(MinispecError, match="up_proj.weight' holds NaN or infinite"):
        load(tmp_path)


def test_fields_minispec_ignores_never_fail_a_load(tmp_path):
    _saved(tmp_path)
    _write_tokenizer(tmp_path, bos_template=True)
    # as transformers writes them: int(1e30) for "no fixed length", NaN from a float('nan')
    (tmp_path / "tokenizer_config.json").write_text(
        '{"model_max_length": 1000000000000000019884624838656, "eos_token": "<eot>", '
        '"chat_template": "{{ messages }}", "added_tokens_decoder": {"1": {"content": "<s>"}}}')
    (tmp_path / "generation_config.json").write_text(
        '{"bos_token_id": 1, "temperature": NaN, "top_p": Infinity, "max_length": 1e400}')
    m = load(tmp_path, device="cpu")
    assert (m.config.bos_token_id, m.config.eos_token_ids, m.tokenizer.encode("hello")) == (
        1, (2,), [1, 3])  # eos from config.json; the rest of both files ignored
    (tmp_path / "tokenizer_config.json").write_text('{"add_bos_token": "yes"}')
    with pytest.raises(MinispecError, match="tokenizer_config.json: field 'add_bos_token' "
                                            "should be true, false or null, got 'yes'"):
        load(tmp_path, device="cpu")
    (tmp_path / "tokenizer_config.json").write_text("{}")
    (tmp_path / "generation_config.json").write_text('{"eos_token_id": "</s>"}')
    with pytest.raises(MinispecError, match="generation_config.json: field 'eos_token_id'"):
        load(tmp_path, device="cpu")


@pytest.mark.parametrize("dtype", [
    [("a", "f4", (-1,))],  # a structured dtype np.dtype refuses with ValueError
    {"names": ["a"], "formats": ["f4"], "offsets": [-4]},
    [("a", "f4")], "bfloat16", "int8", object, "no such dtype", 3.5,
])
def test_any_bad_dtype_is_a_minispec_error(tmp_path, dtype):
    _saved(tmp_path)
    with pytest.raises(MinispecError, match="dtype: expected None, 'float32' or 'float16'"):
        load(tmp_path, dtype=dtype, device="cpu")


def test_an_unreadable_special_tokens_file_is_ignored_with_a_warning(tmp_path):
    _saved(tmp_path)  # config.json: bos 1, eos 2
    _write_tokenizer(tmp_path, bos_template=True)
    # as published in DracoUnion/Qwen1.5-moe-8x0.5B-Chat: a comma missing after a hand-added field
    (tmp_path / "generation_config.json").write_text('{"eos_token_id": 5\n"max_new_tokens": 9}')
    (tmp_path / "tokenizer_config.json").write_text('{"add_bos_token": false,}')
    with pytest.warns(UserWarning) as caught:
        m = load(tmp_path, device="cpu")
    assert [str(w.message).split(": ")[0] for w in caught] == [
        str(tmp_path / "generation_config.json"), str(tmp_path / "tokenizer_config.json")]
    assert all("not valid JSON" in str(w.message) and "ignored" in str(w.message) for w in caught)
    # both files set aside: EOS from config.json, BOS as the tokenizer's own template adds it
    assert (m.config.eos_token_ids, m.tokenizer.encode("hello")) == ((2,), [1, 3])


# -- issue 50: token ids checked at load, tokenizer.json errors at the file's own positions, and
# the new parts saved and loaded -------------------------------------------------------------------


@pytest.mark.parametrize("file, doc, field", [
    ("generation_config.json", {"eos_token_id": [2, 48]}, "eos_token_id"),
    ("generation_config.json", {"bos_token_id": 10**30}, "bos_token_id"),
    ("config.json", {"eos_token_id": 1000}, "eos_token_id"),
])
def test_a_bos_or_eos_id_outside_the_vocabulary_is_refused_at_load_naming_its_file(
        tmp_path, file, doc, field):
    _saved(tmp_path)  # vocab_size 48
    path = tmp_path / file
    old = json.loads(path.read_text()) if path.exists() else {}
    path.write_text(json.dumps({**old, **doc}))
    with pytest.raises(MinispecError) as e:
        load(tmp_path, device="cpu")
    assert str(e.value).startswith(f"{path}: field '{field}' is token ")
    assert "outside the model's vocabulary (ids 0..47" in str(e.value)


def test_a_special_token_the_tokenizer_places_past_the_model_rows_is_refused(tmp_path):
    _saved(tmp_path, vocab_size=5, bos_token_id=None, eos_token_id=None)
    _write_tokenizer(tmp_path, bos_template=False)  # "<eot>" is id 5 of the tokenizer
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<eot>"}))
    with pytest.raises(MinispecError, match="tokenizer_config.json: field 'eos_token' is token 5, "
                                            "outside the model's vocabulary \\(ids 0..4"):
        load(tmp_path, device="cpu")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>"}))
    assert load(tmp_path, device="cpu").config.eos_token_ids == (2,)


@pytest.mark.parametrize("truncation", [None, {"max_length": 8, "stride": 0,
                                               "strategy": "LongestFirst", "direction": "Right"}])
def test_tokenizer_json_errors_point_into_the_file_as_written(tmp_path, truncation):
    from tokenizers import Tokenizer as HFTokenizer

    from minispec.tokenizer import Tokenizer

    _write_tokenizer(tmp_path, bos_template=False)
    doc = json.loads((tmp_path / "tokenizer.json").read_text())
    doc["truncation"] = truncation  # set: blanked out before the library reads the file
    doc["model"]["unk_token"] = 7  # a number where the library wants a string
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(doc, indent=2))
    with pytest.raises(Exception) as theirs:  # the library reading the file itself
        HFTokenizer.from_file(str(path))
    where = re.search(r"line (\d+) column (\d+)", str(theirs.value))
    assert where and int(where.group(1)) > 20  # deep in a pretty-printed file
    with pytest.raises(MinispecError) as ours:
        Tokenizer.from_file(path)
    assert str(ours.value).startswith(f"{path}: not a valid tokenizer.json")
    assert where.group(0) in str(ours.value)


def test_blanking_padding_keeps_every_other_character_in_place():
    from minispec.tokenizer import blank_fields

    text = ('{\n  "truncation": {\n    "max_length": 512\n  },\n  "padding": 5, "x": [1,\n'
            '  2],\n  "padding": {"a": "}\\""}\n}')
    out = blank_fields(text, ("padding", "truncation"))
    assert json.loads(out) == {"truncation": None, "padding": None, "x": [1, 2]}
    assert [len(line) for line in out.split("\n")][1:] == [
        len(line) + (line.endswith("5, \"x\": [1,") * 3) + (line.endswith("{") * 3)
        for line in text.split("\n")][1:]


@pytest.mark.parametrize("family, extra", [
    ("qwen3", {"head_dim": 16}), ("qwen3", {"attention_bias": True}),
    ("llama", {"mlp_bias": True}), ("gpt2", {"scale_attn_by_inverse_layer_idx": True}),
])
def test_round_trip_of_the_new_parts(tmp_path, family, extra):
    m = _saved(tmp_path, family, **extra)
    names = set(_to_hf_tensors(m))
    if family == "qwen3":
        assert "model.layers.1.self_attn.q_norm.weight" in names
        assert ("model.layers.0.self_attn.o_proj.bias" in names) == extra.get("attention_bias",
                                                                              False)
    if extra.get("mlp_bias"):
        assert {f"model.layers.0.mlp.{n}_proj.bias" for n in ("gate", "up", "down")} <= names
    loaded = load(tmp_path, device="cpu")
    assert loaded.config == m.config
    # gpt2's folded query scale is unfolded on save and folded again on load: rounding only
    np.testing.assert_allclose(loaded.logits(TOKENS), m.logits(TOKENS), atol=1e-6, rtol=0)
