"""Weights kept as their GGUF blocks: the kernel's block product against the float32 product.

A GGUF's Q4_1 and Q8_0 blocks hold exactly the float32 values minispec.convert writes; the
few-rows kernel rebuilds each weight from them in a register. So a model given its blocks
(gguf_blocks.safetensors beside the conversion) must give the logits of the same model without
them, bit for bit, for one token, a verify call and a batch, while a step reads the blocks'
bytes; and a blocks file that does not belong to the weights is refused by name.
"""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import tiny_config

import minispec
from minispec import backend, kernels
from minispec.batch import generate_batch
from minispec.convert import convert_gguf, permute
from minispec.cpu_steps import enable
from minispec.errors import MinispecError
from minispec.loader import GGUF_BLOCKS, random_model, save_checkpoint
from minispec.measure.harness import decode_weight_bytes
from minispec.real import SOURCE_FILE, _source, converted
from minispec.safetensors import SafetensorsFile, save_file

gguf = pytest.importorskip("gguf", reason="writing GGUF files needs the gguf package (pip install "
                                          "'minispec[test]')")
pytestmark = pytest.mark.skipif(not backend.kernel_available(),
                                reason="the block product is a numba kernel (pip install numba)")
Q4_1, Q8_0 = gguf.GGMLQuantizationType.Q4_1, gguf.GGMLQuantizationType.Q8_0


def _blocks(a: np.ndarray, kind) -> np.ndarray:
    """gguf's own quantization of a [D_out, D_in] float32 matrix -> its blocks [D_out, D_in /
    32, bytes]."""
    q = gguf.quants.quantize(np.ascontiguousarray(a, dtype=np.float32), kind)
    return q.reshape(a.shape[0], a.shape[1] // 32, -1)


@pytest.mark.parametrize("kind", [Q4_1, Q8_0], ids=["Q4_1", "Q8_0"])
def test_block_product_gives_the_float32_products_bits(kind):
    rng = np.random.default_rng(0)
    blocks = _blocks(rng.standard_normal((200, 192)).astype(np.float32) * 0.1, kind)  # 200: a
    # last tile of 8 outputs; 192 inputs: 6 blocks, unpacked 4 and 2 for more than 6 rows
    w = kernels.dequantize(blocks)  # [200, 192]
    raw = blocks.reshape(200, -1)
    assert np.array_equal(w, gguf.quants.dequantize(raw, kind).reshape(200, 192))  # gguf's
    tiles = kernels.block_tiles(blocks)
    loops = kernels.compiled()
    for t in (1, 2, 5, 6, 7, 13, 20, 37):  # one pass in registers; 2, 3 (7, 7, 6), 4, 7 passes
        x = rng.standard_normal((t, 192)).astype(np.float32)
        y = np.empty((t, 200), np.float32)
        loops.block_product(x, tiles, y)
        assert np.array_equal(y, backend.few_rows_matmul(x, np.ascontiguousarray(w).T)), t
        assert np.allclose(y, x @ w.T, rtol=1e-5, atol=1e-5)


def test_keep_blocks_refuses_blocks_of_another_shape():
    w = np.zeros((64, 100), np.float32).T  # [D_in 100, D_out 64], stored [64, 100]
    with pytest.raises(MinispecError, match=r"expected blocks uint8 \[64, 3, 20 or 34\] for a "
                                            r"float32 weight \[100, 64\], got uint8 \[64, 3, 20\]"):
        backend.keep_blocks(w, np.zeros((64, 3, 20), np.uint8))  # 100 inputs: no whole blocks


# ---- a converted GGUF of quantized blocks --------------------------------------------------

BYTES = sorted(__import__("tokenizers").pre_tokenizers.ByteLevel.alphabet())
TOKENS = ["<|endoftext|>", "<|im_start|>", *BYTES]


def _quantized_gguf(tmp_path: Path, tied: bool) -> Path:
    """A tiny llama GGUF whose matrices are Q4_1 blocks and whose embedding is Q8_0 blocks, as
    llama.cpp quantizes SmolLM2's; the norms float32."""
    c = tiny_config("llama", vocab_size=len(TOKENS), tie_word_embeddings=tied)
    model = random_model(c, seed=5, scale=0.3)
    save_checkpoint(model, tmp_path / "src")
    f = SafetensorsFile(tmp_path / "src" / "model.safetensors")
    names = {"model.embed_tokens.weight": "token_embd.weight", "lm_head.weight": "output.weight",
             "model.norm.weight": "output_norm.weight"}
    layer = {"input_layernorm.weight": "attn_norm.weight", "self_attn.q_proj.weight":
             "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
             "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight":
             "attn_output.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
             "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
             "mlp.down_proj.weight": "ffn_down.weight"}
    path = tmp_path / "tiny.gguf"
    w = gguf.GGUFWriter(path, "llama")
    for add, value in ((w.add_block_count, c.n_layers), (w.add_context_length, 64),
                       (w.add_embedding_length, c.hidden_size),
                       (w.add_feed_forward_length, c.intermediate_size),
                       (w.add_head_count, c.n_heads), (w.add_head_count_kv, c.n_kv_heads),
                       (w.add_rope_freq_base, c.rope_theta),
                       (w.add_layer_norm_rms_eps, c.norm_eps),
                       (w.add_rope_dimension_count, c.head_dim)):
        add(value)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(TOKENS)
    w.add_token_types([3, 3] + [1] * (len(TOKENS) - 2))
    w.add_token_merges([])
    w.add_bos_token_id(1)
    w.add_eos_token_id(0)
    for name in f.keys():
        a = np.ascontiguousarray(f.get(name), dtype=np.float32)
        i, rest = name[len("model.layers."):].split(".", 1) if "layers" in name else ("", name)
        if rest == "self_attn.q_proj.weight":
            a = permute(a, c.n_heads)
        elif rest == "self_attn.k_proj.weight":
            a = permute(a, c.n_kv_heads)
        g = f"blk.{i}.{layer[rest]}" if i else names[name]
        if a.ndim == 1:
            w.add_tensor(g, a)
        else:
            kind = Q8_0 if g == "token_embd.weight" else Q4_1
            w.add_tensor(g, gguf.quants.quantize(a, kind), raw_dtype=kind)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _without_blocks(out: Path, to: Path) -> Path:
    shutil.copytree(out, to)
    (to / GGUF_BLOCKS).unlink()
    return to


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "own-head"])
def test_a_model_with_its_blocks_gives_the_float32_models_logits_bit_for_bit(tmp_path, tied):
    out = convert_gguf(_quantized_gguf(tmp_path, tied), tmp_path / "hf")
    assert (out / GGUF_BLOCKS).is_file()
    fast, plain = minispec.load(out), minispec.load(_without_blocks(out, tmp_path / "f32"))
    layers = fast.weights["layers"]
    assert all(backend.kept_as_blocks(p[n]) for p in layers for n in ("wqkv", "wo", "w_up"))
    assert backend.kept_as_blocks(fast.weights["lm_head"])
    assert not backend.kept_as_blocks(plain.weights["lm_head"])
    # a step reads the blocks: Q4_1 is 20 bytes for 32 weights, Q8_0 34 (64-output tiles)
    assert decode_weight_bytes(fast) < decode_weight_bytes(plain) / 3
    for m in (fast, plain):
        enable(m)
    ids = np.random.default_rng(2).integers(0, len(TOKENS), 30).tolist()
    for new in ([7], [7, 8, 9, 10, 11]):  # one token, a verify call
        out_fast, out_plain = [], []
        for m, outs in ((fast, out_fast), (plain, out_plain)):
            cache = m.new_cache(64)
            m.hidden_states(ids, cache)
            outs.append(m.lm_head(m.hidden_states(new, cache)))
        assert np.array_equal(out_fast[0], out_plain[0]), len(new)
    # the values are gguf's dequantized weights, whatever path computes with them
    assert np.allclose(fast.logits(ids), plain.logits(ids), rtol=0, atol=1e-6)
    prompts = [ids[:9], ids[3:20], ids[5:12]]
    a = generate_batch(fast, None, prompts, gamma=0, max_new_tokens=12, temperature=1.0, seed=4)
    b = generate_batch(plain, None, prompts, gamma=0, max_new_tokens=12, temperature=1.0, seed=4)
    assert [r.tokens for r in a] == [r.tokens for r in b]


def test_blocks_that_do_not_hold_the_weights_are_refused_by_name(tmp_path):
    out = convert_gguf(_quantized_gguf(tmp_path, True), tmp_path / "hf")
    f = SafetensorsFile(out / GGUF_BLOCKS)
    blocks = {n: f.get_bytes(n) for n in f.keys()}
    name = "model.layers.1.mlp.up_proj.weight"
    original = blocks[name].copy()
    blocks[name][3, 0, 6] ^= 1  # one weight's number changed
    save_file(blocks, out / GGUF_BLOCKS)
    with pytest.raises(MinispecError, match=r"gguf_blocks.safetensors: the blocks of "
                                            r"'model.layers.1.mlp.up_proj.weight' do not hold"):
        minispec.load(out)
    blocks[name] = original
    down = "model.layers.1.mlp.down_proj.weight"  # 64 inputs: two blocks a row
    blocks[down] = blocks[down][:, :1]
    save_file(blocks, out / GGUF_BLOCKS)
    with pytest.raises(MinispecError, match=r"tensor 'model.layers.1.mlp.down_proj.weight' has "
                                            r"shape \[32, 1, 20\], expected \[rows, 2, 20"):
        minispec.load(out)
    assert minispec.load(out, dtype="float32").weights  # asked for float32: the file is unread


def test_a_cache_converted_before_the_blocks_gets_them_once(tmp_path):
    path = _quantized_gguf(tmp_path, True)
    cache = tmp_path / "cache"
    convert_gguf(path, cache)
    (cache / GGUF_BLOCKS).unlink()  # as minispec.convert wrote it before the blocks
    (cache / SOURCE_FILE).write_text(json.dumps(_source(path)) + "\n")
    assert converted(path, cache) == cache
    assert (cache / GGUF_BLOCKS).is_file()
    assert backend.kept_as_blocks(minispec.load(cache).weights["lm_head"])


def test_bench_reads_the_blocks_unless_asked_for_float32(tmp_path, capsys):
    from minispec.measure import bench

    out = convert_gguf(_quantized_gguf(tmp_path, True), tmp_path / "hf")
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("the cat sat on\nab ab ab ab\n")  # a byte a token: short enough
    reports = {}
    for dtype in ([], ["--dtype", "float32"]):
        argv = ["--target", str(out), "--draft", "none", "--drafters", "ngram", "--quick",
                "--json", "--hf", "off", "--prompts", str(prompts), "--max-new-tokens", "8",
                *dtype]
        assert bench.main(argv) == 0
        reports[bool(dtype)] = json.loads(capsys.readouterr().out)
    blocks, floats = reports[False], reports[True]
    # float32: 4 bytes a weight (the norms' too); the blocks: Q4_1 20 bytes and Q8_0 34 for 32
    w = minispec.load(out, dtype="float32").weights
    assert floats["target"]["weight_bytes"] == 4 * (sum(
        a.size for layer in w["layers"] for a in layer.values() if a is not None)
        + w["lm_head"].size + w["norm_w"].size)
    assert blocks["target"]["weight_bytes"] < floats["target"]["weight_bytes"] / 3
    assert blocks["floor"]["weight_bytes"] == blocks["target"]["weight_bytes"]
    for r in (blocks, floats):
        agree = r["greedy_agreement"]["minispec ngram vs minispec autoregressive"]
        assert agree["identical"] == agree["total"]


def test_a_bf16_conversion_over_a_float32_one_leaves_no_blocks(tmp_path):
    path = _quantized_gguf(tmp_path, True)
    out = convert_gguf(path, tmp_path / "hf")
    assert (out / GGUF_BLOCKS).is_file()
    convert_gguf(path, out, bf16=True)  # the same directory, now bfloat16 values
    assert not (out / GGUF_BLOCKS).exists()
    assert not backend.kept_as_blocks(minispec.load(out).weights["lm_head"])


def test_q_k_v_in_two_formats_read_float32_for_them_and_blocks_elsewhere(tmp_path):
    # a GGUF may mix formats (llama.cpp's Q4_K_M keeps some matrices in Q6_K, others in Q4_K);
    # the fused q, k, v product reads one format: mixed, it reads the float32 values
    out = convert_gguf(_quantized_gguf(tmp_path, True), tmp_path / "hf")
    f = SafetensorsFile(out / GGUF_BLOCKS)
    blocks = {n: f.get_bytes(n) for n in f.keys()}
    v = "model.layers.0.self_attn.v_proj.weight"
    values = kernels.dequantize(blocks[v])
    blocks[v] = _blocks(values, Q8_0)  # the same rows in Q8_0: other values, so
    w = SafetensorsFile(out / "model.safetensors")  # model.safetensors gets them too
    weights = {n: np.array(w.get(n)) for n in w.keys()}
    weights[v] = kernels.dequantize(blocks[v])
    save_file(weights, out / "model.safetensors")
    save_file(blocks, out / GGUF_BLOCKS)
    m = minispec.load(out)
    assert not backend.kept_as_blocks(m.weights["layers"][0]["wqkv"])
    assert backend.kept_as_blocks(m.weights["layers"][0]["wo"])
    assert backend.kept_as_blocks(m.weights["layers"][1]["wqkv"])
