"""GGUF (llama.cpp's file format) -> a Hugging Face model directory that minispec and transformers
both load.

    python -m minispec.convert gguf SmolLM2-135M-Instruct.Q4_1.gguf smollm2/ [--bf16]

The `gguf` package (llama.cpp's own reader, `pip install gguf`) reads the file and dequantizes each
tensor to float32; this module renames the tensors to the Hugging Face names, undoes the one layout
change llama.cpp makes to llama checkpoints (the rows of the query and key projections, see
`unpermute`), and builds tokenizer.json with the `tokenizers` library from the vocabulary stored in
the GGUF. It writes config.json, generation_config.json, model.safetensors (float32, or BF16 with
--bf16), tokenizer.json and tokenizer_config.json. Offline, a few seconds for a 135M model.

The float32 weights are the values the file's quantized blocks hold. Its Q4_1 and Q8_0 blocks
(a 4- or 8-bit number per weight, a float16 scale per 32) are written too, as they are, into
gguf_blocks.safetensors (loader.GGUF_BLOCKS; bytes under the matrices' Hugging Face names, the
query and key rows reordered like the weights): on the CPU minispec.load hands them to the
few-rows kernel, which rebuilds each weight in a register and gives the same logits, bit for
bit, reading 96 MB a step for SmolLM2-135M instead of 538 MB (backend.keep_blocks).

Supported: general.architecture "llama" (Llama, SmolLM, TinyLlama, Mistral-style checkpoints
llama.cpp stores as llama), "qwen2" (Qwen2, Qwen2.5) and "qwen3", with a byte-level BPE vocabulary
(tokenizer.ggml.model "gpt2") whose pre-tokenizer (tokenizer.ggml.pre) is in PRE_TOKENIZERS, or a
SentencePiece vocabulary (tokenizer.ggml.model "llama": Llama 2, TinyLlama), whose merges are
rebuilt from the token scores as transformers rebuilds them. Anything else is refused with a
MinispecError.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from .config import ModelConfig
from .errors import MinispecError
from .loader import GGUF_BLOCKS, hf_shapes
from .safetensors import save_file

# general.architecture -> the Hugging Face class and model_type it becomes
ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
                 "qwen3": "Qwen3ForCausalLM"}
# tokenizer.ggml.pre -> what splits the text before byte-level BPE (llama.cpp's llama-vocab.cpp
# spells each as regexes; these are the same splits in the tokenizers library's terms)
PRE_TOKENIZERS = ("smollm", "starcoder", "gpt-2", "llama-bpe", "qwen2")
VOCABULARIES = ("gpt2", "llama")  # tokenizer.ggml.model: byte-level BPE, SentencePiece
# Llama 3's split (its tokenizer.json spells it so): contractions, words with one leading
# non-letter, numbers of up to 3 digits, punctuation runs, newlines, spaces
LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# Qwen2's (and Qwen3's): Llama 3's, but every digit a word of its own
QWEN2_SPLIT = LLAMA3_SPLIT.replace(r"\p{N}{1,3}", r"\p{N}")
# GGUF token types (llama.cpp's llama_token_type): 2 unknown (<unk>), 3 control tokens are special
# (<|im_start|>, <s>), 4 user-defined ones are added tokens matched whole
UNKNOWN, CONTROL, USER_DEFINED = 2, 3, 4
SPACE = "\u2581"  # SentencePiece's visible space


# ---- reading the GGUF --------------------------------------------------------------------------


def _value(field) -> Any:
    """A GGUF metadata field as Python: a str, a number, a bool or a list of them."""
    from gguf import GGUFValueType

    def one(part, kind):
        if kind == GGUFValueType.STRING:
            return part.tobytes().decode("utf-8")
        value = part[0].item()
        return bool(value) if kind == GGUFValueType.BOOL else value

    if field.types[0] == GGUFValueType.ARRAY:
        return [one(field.parts[i], field.types[-1]) for i in field.data]
    return one(field.parts[field.data[0]], field.types[0])


def read_gguf(path: str | Path) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The metadata (key -> value) and every tensor dequantized to float32, in NumPy's row-major
    order (a [out, in] matrix as PyTorch stores it), of a GGUF file."""
    try:
        import gguf
    except ImportError:
        raise MinispecError("minispec.convert needs the gguf package (pip install gguf), "
                            "llama.cpp's reader") from None
    path = Path(path)
    if not path.is_file():
        raise MinispecError(f"{path}: no such file (expected a .gguf file)")
    try:
        reader = gguf.GGUFReader(path)
    except (ValueError, KeyError, IndexError, OSError, UnicodeDecodeError) as e:
        # the reader maps the tensors' bytes as arrays: a file cut short fails to fit them
        short = isinstance(e, ValueError) and any(
            w in str(e) for w in ("reshape", "larger dtype", "buffer is smaller"))
        raise MinispecError(f"{path}: not a readable GGUF file"
                            + (" (its data end early: a truncated or damaged copy?)" if short
                               else "")
                            + f" ({type(e).__name__}: {str(e)[:200]})") from None
    try:
        meta = {name: _value(f) for name, f in reader.fields.items()}
    except (UnicodeDecodeError, IndexError) as e:
        raise MinispecError(f"{path}: a metadata field is not readable ({e})") from None
    tensors = {}
    for t in reader.tensors:
        try:
            a = gguf.quants.dequantize(t.data, t.tensor_type)
        except NotImplementedError as e:
            raise MinispecError(f"{path}: tensor {t.name!r}: {e}") from None
        # the reader gives rows in NumPy order already; t.shape is GGML's (fastest axis first)
        tensors[t.name] = np.asarray(a, dtype=np.float32).reshape(
            [int(n) for n in reversed(t.shape)])
    return meta, tensors


BLOCK_TYPES = {"Q4_1": 20, "Q8_0": 34}  # the GGUF block formats the kernel reads: bytes a block


def read_gguf_blocks(path: str | Path) -> dict[str, np.ndarray]:
    """The matrices a GGUF file stores as Q4_1 or Q8_0 blocks, as they are: name -> uint8
    [D_out, D_in / 32, bytes of a block] (read_gguf has checked the file)."""
    import gguf

    out = {}
    for t in gguf.GGUFReader(Path(path)).tensors:
        size = BLOCK_TYPES.get(t.tensor_type.name)
        if size is not None and len(t.shape) == 2:
            d_in, d_out = int(t.shape[0]), int(t.shape[1])
            out[t.name] = np.array(t.data, dtype=np.uint8).reshape(d_out, d_in // 32, size)
    return out


# ---- config ------------------------------------------------------------------------------------


def _short_float(x: float) -> float:
    """A float32 read from the file, as the shortest decimal that is that float32 (1e-05, not
    9.999999747378752e-06)."""
    return float(str(np.float32(x)))


def hf_config(meta: dict[str, Any], tensors: dict[str, np.ndarray], source: str) -> dict[str, Any]:
    """config.json for the GGUF's hyperparameters (a LlamaForCausalLM, Qwen2ForCausalLM or
    Qwen3ForCausalLM)."""
    arch = meta.get("general.architecture")
    if arch not in ARCHITECTURES:
        raise MinispecError(f"{source}: general.architecture is {arch!r}; minispec.convert "
                            f"supports {', '.join(ARCHITECTURES)}")

    def need(key: str, default: Any = ...) -> Any:
        value = meta.get(f"{arch}.{key}", default)
        if value is ...:
            raise MinispecError(f"{source}: metadata field '{arch}.{key}' is missing")
        return value

    for key in meta:
        if key.startswith(f"{arch}.rope.scaling.") and meta[key] not in ("none", 1.0, 0, 0.0):
            raise MinispecError(f"{source}: {key} = {meta[key]!r}; minispec.convert supports "
                                f"plain RoPE only")
    if "rope_freqs.weight" in tensors:
        raise MinispecError(f"{source}: tensor 'rope_freqs.weight' (Llama 3.1 RoPE scaling) is "
                            f"not supported by minispec.convert")
    D, H = need("embedding_length"), need("attention.head_count")
    E = need("attention.key_length", D // H)
    if need("rope.dimension_count", E) != E:
        raise MinispecError(f"{source}: {arch}.rope.dimension_count is "
                            f"{need('rope.dimension_count')}, the head dim {E}; minispec rotates "
                            f"the whole head")
    V = tensors["token_embd.weight"].shape[0] if "token_embd.weight" in tensors else 0
    config = {
        "architectures": [ARCHITECTURES[arch]],
        "model_type": arch,
        "vocab_size": need("vocab_size", V),
        "hidden_size": D,
        "intermediate_size": need("feed_forward_length"),
        "num_hidden_layers": need("block_count"),
        "num_attention_heads": H,
        "num_key_value_heads": need("attention.head_count_kv", H),
        "head_dim": E,
        "max_position_embeddings": need("context_length"),
        "rms_norm_eps": _short_float(need("attention.layer_norm_rms_epsilon")),
        "rope_theta": _short_float(need("rope.freq_base", 10000.0)),
        "hidden_act": "silu",
        # llama.cpp leaves output.weight out when the LM head is the embedding matrix
        "tie_word_embeddings": "output.weight" not in tensors,
        "torch_dtype": "float32",
    }
    if arch == "llama":
        config.update(attention_bias="blk.0.attn_q.bias" in tensors, mlp_bias=False)
    elif arch == "qwen3":  # (qwen2's q, k, v biases are always there)
        config["attention_bias"] = "blk.0.attn_q.bias" in tensors
    if arch != "llama":
        config["use_sliding_window"] = False
    for key in ("bos", "eos", "padding"):
        if f"tokenizer.ggml.{key}_token_id" in meta:
            name = "pad" if key == "padding" else key
            config[f"{name}_token_id"] = meta[f"tokenizer.ggml.{key}_token_id"]
    return config


# ---- tensors -----------------------------------------------------------------------------------

_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.bias": "self_attn.o_proj.bias",
    "attn_q_norm.weight": "self_attn.q_norm.weight",  # qwen3
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_NAMES = {"token_embd.weight": "model.embed_tokens.weight",
          "output_norm.weight": "model.norm.weight", "output.weight": "lm_head.weight"}


def permute(w: np.ndarray, n_heads: int) -> np.ndarray:
    """What llama.cpp's convert_hf_to_gguf.py does to q_proj / k_proj rows: within each head, the
    rotary pairs (i, i + E/2) of Hugging Face's rotate_half become neighbours (2i, 2i + 1), the
    layout of llama.cpp's RoPE kernel (and of Meta's original checkpoints)."""
    return (w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, *w.shape[1:])  # [H, 2, E/2, ...]
            .swapaxes(1, 2).reshape(w.shape))  # [H, E/2, 2, ...] -> back to [H*E, ...]


def unpermute(w: np.ndarray, n_heads: int) -> np.ndarray:
    """The inverse of `permute`: GGUF's q/k rows back to Hugging Face's order."""
    return (w.reshape(n_heads, w.shape[0] // n_heads // 2, 2, *w.shape[1:])  # [H, E/2, 2, ...]
            .swapaxes(1, 2).reshape(w.shape))  # [H, 2, E/2, ...] -> [H*E, ...]


def _hf_named(config: dict[str, Any], tensors: dict[str, np.ndarray], source: str):
    """(Hugging Face name, tensor) for each GGUF tensor, the rows of llama's q and k
    unpermuted (any trailing axes: weights, or their blocks along the rows)."""
    H, K = config["num_attention_heads"], config["num_key_value_heads"]
    permuted = config["model_type"] == "llama"
    for name, w in tensors.items():
        m = re.fullmatch(r"blk\.(\d+)\.(.+)", name)
        if m and m.group(2) in _LAYER_NAMES:
            hf = f"model.layers.{m.group(1)}.{_LAYER_NAMES[m.group(2)]}"
            if permuted and m.group(2).startswith("attn_q."):
                w = unpermute(w, H)
            elif permuted and m.group(2).startswith("attn_k."):
                w = unpermute(w, K)
        elif name in _NAMES:
            hf = _NAMES[name]
        else:
            raise MinispecError(f"{source}: tensor {name!r} has no Hugging Face "
                                f"{config['model_type']} counterpart; minispec.convert does not "
                                f"know it")
        yield hf, w


def hf_tensors(config: dict[str, Any], tensors: dict[str, np.ndarray],
               source: str) -> dict[str, np.ndarray]:
    """The GGUF's tensors under their Hugging Face names, q/k rows unpermuted (llama only: for
    qwen2 and qwen3 llama.cpp keeps Hugging Face's rotate-half layout), shapes checked."""
    out = dict(_hf_named(config, tensors, source))
    shapes = hf_shapes(ModelConfig.from_hf(config, f"{source} (its metadata)"))
    for name, shape in shapes.items():
        if name not in out:
            raise MinispecError(f"{source}: no GGUF tensor for {name!r} (expected shape "
                                f"{list(shape)})")
        if out[name].shape != shape:
            raise MinispecError(f"{source}: tensor for {name!r} has shape {list(out[name].shape)}, "
                                f"expected {list(shape)} from the metadata")
    extra = sorted(set(out) - set(shapes))
    if extra:
        raise MinispecError(f"{source}: tensors the metadata does not call for: {extra[:4]}")
    return out


# ---- tokenizer ---------------------------------------------------------------------------------


def hf_tokenizer(meta: dict[str, Any], source: str):
    """A tokenizers.Tokenizer from the GGUF's vocabulary: byte-level BPE with the merges and the
    pre-tokenizer tokenizer.ggml.pre names, or SentencePiece BPE with merges rebuilt from the
    scores; control tokens as special tokens, BOS in front where llama.cpp puts it."""
    from tokenizers import AddedToken, processors

    kind = meta.get("tokenizer.ggml.model")
    if kind not in VOCABULARIES:
        raise MinispecError(f"{source}: tokenizer.ggml.model is {kind!r}; minispec.convert builds "
                            f"byte-level BPE ('gpt2') and SentencePiece ('llama') vocabularies "
                            f"only")
    tokens = meta["tokenizer.ggml.tokens"]
    types = meta.get("tokenizer.ggml.token_type", [1] * len(tokens))
    if len(set(tokens)) != len(tokens) or len(types) != len(tokens):
        raise MinispecError(f"{source}: tokenizer.ggml.tokens holds duplicates or its length "
                            f"differs from tokenizer.ggml.token_type's")
    tok = _byte_level_bpe(meta, tokens, source) if kind == "gpt2" else _sentencepiece_bpe(
        meta, tokens, types, source)
    bos = meta.get("tokenizer.ggml.bos_token_id")
    if _adds_bos(meta) and isinstance(bos, int) and 0 <= bos < len(tokens):
        # BOS in front of every text, as llama.cpp's tokenizer puts it (Llama 2 and 3)
        tok.post_processor = processors.TemplateProcessing(
            single=f"{tokens[bos]} $A", pair=f"{tokens[bos]} $A {tokens[bos]} $B",
            special_tokens=[(tokens[bos], bos)])
    elif kind == "gpt2":
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t, k in zip(tokens, types) if k == CONTROL])
    tok.add_tokens([AddedToken(t, special=False, normalized=False)
                    for t, k in zip(tokens, types) if k == USER_DEFINED])
    return tok


def _adds_bos(meta: dict[str, Any]) -> bool:
    # llama.cpp adds BOS to a SentencePiece vocabulary whose file does not say otherwise
    default = meta.get("tokenizer.ggml.model") == "llama"
    return bool(meta.get("tokenizer.ggml.add_bos_token", default))


def _byte_level_bpe(meta: dict[str, Any], tokens: list[str], source: str):
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

    pre = meta.get("tokenizer.ggml.pre", "default")
    if pre not in PRE_TOKENIZERS:
        raise MinispecError(f"{source}: tokenizer.ggml.pre is {pre!r}; minispec.convert knows "
                            f"{', '.join(PRE_TOKENIZERS)}")
    merges = [tuple(m.split(" ", 1)) for m in meta.get("tokenizer.ggml.merges", [])]
    vocab = {t: i for i, t in enumerate(tokens)}
    # Llama 3 takes a word found whole in the vocabulary as it is, before any merge
    whole = {"ignore_merges": True} if pre == "llama-bpe" else {}  # (tokenizers >= 0.19)
    tok = Tokenizer(models.BPE(vocab, merges, fuse_unk=False, byte_fallback=False, **whole))
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre in ("smollm", "starcoder"):  # every digit its own word, then GPT-2's split
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), byte_level])
    elif pre in ("llama-bpe", "qwen2"):  # Llama 3's or Qwen2's own split, then the bytes as is
        split = LLAMA3_SPLIT if pre == "llama-bpe" else QWEN2_SPLIT
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Split(Regex(split), behavior="isolated"),
             pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    else:  # "gpt-2"
        tok.pre_tokenizer = byte_level
    if pre == "qwen2":  # Qwen's own tokenizer.json composes the text (NFC) first
        tok.normalizer = normalizers.NFC()
    tok.decoder = decoders.ByteLevel()
    return tok


def _sentencepiece_bpe(meta: dict[str, Any], tokens: list[str], types: list[int], source: str):
    """Llama 2's tokenizer as transformers' LlamaTokenizer builds it: BPE over the pieces with
    byte fallback (<0x0A> for a byte no piece covers), spaces as U+2581 and one in front of the
    text (unless tokenizer.ggml.add_space_prefix is false)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    scores = meta.get("tokenizer.ggml.scores")
    if not isinstance(scores, list) or len(scores) != len(tokens):
        raise MinispecError(f"{source}: a SentencePiece vocabulary needs tokenizer.ggml.scores, "
                            f"one per token (the merges are rebuilt from them)")
    vocab = {t: i for i, t in enumerate(tokens)}
    unk = next((t for t, k in zip(tokens, types) if k == UNKNOWN), None)
    tok = Tokenizer(models.BPE(vocab, sentencepiece_merges(tokens, scores), unk_token=unk,
                               fuse_unk=True, byte_fallback=True))
    prefix = bool(meta.get("tokenizer.ggml.add_space_prefix", True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(
        replacement=SPACE, prepend_scheme="first" if prefix else "never", split=False)
    steps = [decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    tok.decoder = decoders.Sequence(steps + ([decoders.Strip(" ", 1, 0)] if prefix else []))
    return tok


def sentencepiece_merges(tokens: list[str], scores: list[float]) -> list[tuple[str, str]]:
    """The BPE merges a SentencePiece vocabulary implies: every split of a piece into two pieces,
    the merge of a higher-scored piece first (transformers' generate_merges, the same order)."""
    vocab = {t: i for i, t in enumerate(tokens)}
    merges = []
    for piece, score in zip(tokens, scores):
        pairs = [(piece[:k], piece[k:], score) for k in range(1, len(piece))
                 if piece[:k] in vocab and piece[k:] in vocab]
        merges += sorted(pairs, key=lambda m: (vocab[m[0]], vocab[m[1]]))
    merges.sort(key=lambda m: (m[2], len(m[0]), len(m[1])), reverse=True)
    return [(left, right) for left, right, _ in merges]


def tokenizer_config(meta: dict[str, Any], context_length: int) -> dict[str, Any]:
    """tokenizer_config.json: the special tokens by name, BOS or not, the chat template."""
    tokens = meta["tokenizer.ggml.tokens"]
    doc: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "add_bos_token": _adds_bos(meta),
        "add_eos_token": bool(meta.get("tokenizer.ggml.add_eos_token", False)),
        "clean_up_tokenization_spaces": False,
        # the context length, not transformers' int(1e30) "no limit"
        "model_max_length": context_length,
    }
    for key, name in (("bos", "bos_token"), ("eos", "eos_token"), ("unknown", "unk_token"),
                      ("padding", "pad_token")):
        i = meta.get(f"tokenizer.ggml.{key}_token_id")
        if isinstance(i, int) and 0 <= i < len(tokens):
            doc[name] = tokens[i]
    if "tokenizer.chat_template" in meta:
        doc["chat_template"] = meta["tokenizer.chat_template"]
    return doc


# ---- the whole conversion ----------------------------------------------------------------------


def convert_gguf(path: str | Path, out_dir: str | Path, *, bf16: bool = False) -> Path:
    """Convert the GGUF file `path` into a Hugging Face directory `out_dir` (created if needed):
    config.json, generation_config.json, model.safetensors (float32, or BF16 if `bf16`), and
    tokenizer.json, tokenizer_config.json when the GGUF carries a vocabulary. Returns out_dir.
    Raises MinispecError for a file that is not a GGUF, or a GGUF of an architecture or tokenizer
    not supported (module docstring)."""
    path, out_dir = Path(path), Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise MinispecError(f"{out_dir}: exists and is not a directory (OUT_DIR)")
    meta, tensors = read_gguf(path)
    config = hf_config(meta, tensors, str(path))
    weights = hf_tensors(config, tensors, str(path))
    tok = hf_tokenizer(meta, str(path)) if "tokenizer.ggml.tokens" in meta else None
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise MinispecError(f"{out_dir}: cannot make the folder (OUT_DIR; {e.strerror}: "
                            f"{e.filename})") from None
    if bf16:
        config["torch_dtype"] = "bfloat16"
    generation = {k: config[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id")
                  if k in config}
    for name, doc in (("config.json", config), ("generation_config.json", generation)):
        (out_dir / name).write_text(json.dumps(doc, indent=2) + "\n")
    save_file(weights, out_dir / "model.safetensors", bf16=bf16,
              metadata={"format": "pt", "source": f"minispec.convert from {path.name}"})
    if not bf16:
        write_blocks(path, out_dir, config)
    else:  # the blocks hold the float32 values, not these: none beside them
        (out_dir / GGUF_BLOCKS).unlink(missing_ok=True)
    if tok is not None:
        tok.save(str(out_dir / "tokenizer.json"))
        doc = tokenizer_config(meta, config["max_position_embeddings"])
        (out_dir / "tokenizer_config.json").write_text(json.dumps(doc, indent=2) + "\n")
    return out_dir


def write_blocks(path: str | Path, out_dir: str | Path, config: dict[str, Any] | None = None
                 ) -> Path | None:
    """Write the GGUF file's Q4_1 and Q8_0 matrices, as they are, into out_dir/GGUF_BLOCKS
    beside its float32 conversion (the module docstring) -> that file, or None if the GGUF
    has no such matrix. config: the conversion's config.json (read from out_dir if None)."""
    path, out_dir = Path(path), Path(out_dir)
    if config is None:
        config = json.loads((out_dir / "config.json").read_text())
    blocks = dict(_hf_named(config, read_gguf_blocks(path), str(path)))
    if not blocks:
        return None
    out, part = out_dir / GGUF_BLOCKS, out_dir / (GGUF_BLOCKS + ".part")
    save_file(blocks, part, metadata={"format": "gguf blocks",
                                      "source": f"minispec.convert from {path.name}"})
    part.rename(out)  # whole or not at all: the loader checks every block it finds
    return out


def main(argv: list[str] | None = None) -> int:
    """python -m minispec.convert gguf FILE OUT_DIR [--bf16]"""
    ap = argparse.ArgumentParser(prog="python -m minispec.convert",
                                 description="Convert a checkpoint into a Hugging Face directory "
                                             "that minispec.load and transformers read.")
    sub = ap.add_subparsers(dest="format", required=True)
    g = sub.add_parser("gguf", help="a llama.cpp GGUF file (llama, qwen2 or qwen3 architecture; "
                                    "byte-level BPE or SentencePiece vocabulary)")
    g.add_argument("file", help="the .gguf file")
    g.add_argument("out_dir", help="the directory to write (created if missing)")
    g.add_argument("--bf16", action="store_true", help="store the weights as BF16, not float32")
    args = ap.parse_args(argv)
    start = time.perf_counter()
    try:
        out = convert_gguf(args.file, args.out_dir, bf16=args.bf16)
    except MinispecError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    config = json.loads((out / "config.json").read_text())
    blocks = " (and its GGUF blocks, gguf_blocks.safetensors)" if (out / GGUF_BLOCKS).is_file() \
        else ""
    print(f"wrote {out} in {time.perf_counter() - start:.1f} s: {config['num_hidden_layers']} "
          f"layers, hidden size {config['hidden_size']}, vocab {config['vocab_size']}, "
          f"{'bf16' if args.bf16 else 'float32'}{blocks}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
