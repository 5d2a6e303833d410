"""Loading a Hugging Face model directory into a Model, and making random or saved models for tests.

A directory as the hub serves it: config.json; model.safetensors or shards +
model.safetensors.index.json; tokenizer.json, generation_config.json, tokenizer_config.json when
present. Every checkpoint tensor name is mapped once, here, into the plain per-layer dicts model.py
takes, and every shape is checked against the config before any tensor data is read.
"""

from __future__ import annotations

import dataclasses
import json
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from . import shipped
from .backend import (
    BF16,
    F16,
    Arena,
    get_backend,
    int8_supported,
    keep_blocks,
    kernel_available,
    to_host,
    widen,
)
from .config import ModelConfig, read_config, read_json
from .core.model import Model
from .errors import MinispecError
from .safetensors import SUPPORTED, Checkpoint, save_file
from .tokenizer import Tokenizer

GGUF_BLOCKS = "gguf_blocks.safetensors"  # a GGUF conversion's Q4_1/Q8_0 blocks (minispec.convert)
# tensors some checkpoints carry that are buffers, not weights (recomputed or implied)
_IGNORED_SUFFIXES = (".rotary_emb.inv_freq", ".attn.bias", ".attn.masked_bias")


def _dims(c: ModelConfig) -> tuple[int, int, int, int, int, int, int]:
    return (c.vocab_size, c.hidden_size, c.n_heads, c.n_kv_heads, c.head_dim,
            c.intermediate_size, c.max_position_embeddings)


def hf_shapes(c: ModelConfig, prefix: str = "") -> dict[str, tuple[int, ...]]:
    """Every tensor a checkpoint of this config must hold, with its shape as stored by Hugging Face.

    prefix: only for gpt2, "transformer." (what transformers writes) or "" (the original files).
    """
    v, d, h, k, e, f, p = _dims(c)
    s: dict[str, tuple[int, ...]] = {}
    if c.family == "gpt2":
        s[f"{prefix}wte.weight"] = (v, d)
        s[f"{prefix}wpe.weight"] = (p, d)
        for i in range(c.n_layers):
            b = f"{prefix}h.{i}."
            s.update({
                b + "ln_1.weight": (d,), b + "ln_1.bias": (d,),
                b + "attn.c_attn.weight": (d, 3 * d), b + "attn.c_attn.bias": (3 * d,),
                b + "attn.c_proj.weight": (d, d), b + "attn.c_proj.bias": (d,),
                b + "ln_2.weight": (d,), b + "ln_2.bias": (d,),
                b + "mlp.c_fc.weight": (d, f), b + "mlp.c_fc.bias": (f,),
                b + "mlp.c_proj.weight": (f, d), b + "mlp.c_proj.bias": (d,),
            })
        s[f"{prefix}ln_f.weight"] = (d,)
        s[f"{prefix}ln_f.bias"] = (d,)
    else:
        s["model.embed_tokens.weight"] = (v, d)
        for i in range(c.n_layers):
            b = f"model.layers.{i}."
            s[b + "input_layernorm.weight"] = (d,)
            s[b + "self_attn.q_proj.weight"] = (h * e, d)
            s[b + "self_attn.k_proj.weight"] = (k * e, d)
            s[b + "self_attn.v_proj.weight"] = (k * e, d)
            s[b + "self_attn.o_proj.weight"] = (d, h * e)
            if c.attention_bias:
                s[b + "self_attn.q_proj.bias"] = (h * e,)
                s[b + "self_attn.k_proj.bias"] = (k * e,)
                s[b + "self_attn.v_proj.bias"] = (k * e,)
                if _o_proj_bias(c):
                    s[b + "self_attn.o_proj.bias"] = (d,)
            if c.family == "qwen3":  # RMSNorm weights of each query and key head
                s[b + "self_attn.q_norm.weight"] = (e,)
                s[b + "self_attn.k_norm.weight"] = (e,)
            s[b + "post_attention_layernorm.weight"] = (d,)
            s[b + "mlp.gate_proj.weight"] = (f, d)
            s[b + "mlp.up_proj.weight"] = (f, d)
            s[b + "mlp.down_proj.weight"] = (d, f)
            if c.mlp_bias:
                s[b + "mlp.gate_proj.bias"] = (f,)
                s[b + "mlp.up_proj.bias"] = (f,)
                s[b + "mlp.down_proj.bias"] = (d,)
        s["model.norm.weight"] = (d,)
    if not c.tie_word_embeddings:
        s["lm_head.weight"] = (v, d)
    return s


def _o_proj_bias(c: ModelConfig) -> bool:
    # transformers' Llama and Qwen3 put attention_bias on o_proj too; Qwen2 on q, k, v only
    return c.attention_bias and c.family in ("llama", "qwen3")


def _query_scale(c: ModelConfig, i: int) -> np.ndarray:
    """[3D] multipliers of GPT-2 layer i's fused q, k, v outputs: 1 / (i + 1) on the queries when
    scale_attn_by_inverse_layer_idx (the scores q.k / sqrt(E) / (i + 1), as transformers computes
    them, folded into the query weights once here), 1 elsewhere."""
    s = np.ones(3 * c.hidden_size, dtype=np.float32)
    if c.scale_attn_by_inverse_layer_idx:
        s[:c.hidden_size] /= i + 1
    return s


def _gpt2_prefix(names) -> str:
    return "transformer." if "transformer.wte.weight" in names else ""


def _build_weights(c: ModelConfig, get: Callable[[str], np.ndarray], put, prefix: str = "",
                   put_linear=None):
    """The weight dicts model.py takes, from HF-named tensors. get(name) -> host array (HF layout);
    put(host array) -> contiguous device array in the compute dtype; put_linear, if given, puts
    the linear weights instead (as stored: `_as_stored`)."""
    # every linear weight w [in, out] is a view of an [out, in] array: each output's weights one
    # contiguous row, which the few-rows products stream (backend.few_rows_matmul on the CPU,
    # cuda_graphs.py's kernel on a GPU; cuBLAS reads the view as a transposed matrix, no copy)
    def lin(a):  # the checkpoint's [out, in] -> w [in, out]
        return (put_linear or put)(a).T

    layers = []
    if c.family == "gpt2":
        for i in range(c.n_layers):
            b = f"{prefix}h.{i}."
            scale = _query_scale(c, i)  # [3D]
            layers.append({  # GPT-2's Conv1D already stores [in, out]
                "attn_norm_w": put(get(b + "ln_1.weight")),
                "attn_norm_b": put(get(b + "ln_1.bias")),
                "wqkv": lin(get(b + "attn.c_attn.weight").T * scale[:, None]),
                "bqkv": put(get(b + "attn.c_attn.bias") * scale),
                "q_norm_w": None, "k_norm_w": None,
                "wo": lin(get(b + "attn.c_proj.weight").T), "bo": put(get(b + "attn.c_proj.bias")),
                "mlp_norm_w": put(get(b + "ln_2.weight")), "mlp_norm_b": put(get(b + "ln_2.bias")),
                "w_gate": None, "b_gate": None,
                "w_up": lin(get(b + "mlp.c_fc.weight").T), "b_up": put(get(b + "mlp.c_fc.bias")),
                "w_down": lin(get(b + "mlp.c_proj.weight").T),
                "b_down": put(get(b + "mlp.c_proj.bias")),
            })
        top = {"embed": put(get(f"{prefix}wte.weight")),
               "pos_embed": put(get(f"{prefix}wpe.weight")),
               "norm_w": put(get(f"{prefix}ln_f.weight")), "norm_b": put(get(f"{prefix}ln_f.bias"))}
    else:
        for i in range(c.n_layers):
            b = f"model.layers.{i}."
            a = b + "self_attn."
            # q, k, v fused into one [D, (H+2K)E] matrix: one matmul instead of three
            wqkv = np.concatenate([get(a + n + "_proj.weight") for n in "qkv"], axis=0)
            bqkv = (np.concatenate([get(a + n + "_proj.bias") for n in "qkv"])
                    if c.attention_bias else None)
            qk_norm = c.family == "qwen3"

            def bias(name: str, present: bool):
                return put(get(name)) if present else None

            layers.append({
                "attn_norm_w": put(get(b + "input_layernorm.weight")), "attn_norm_b": None,
                "wqkv": lin(wqkv), "bqkv": None if bqkv is None else put(bqkv),
                "q_norm_w": bias(a + "q_norm.weight", qk_norm),
                "k_norm_w": bias(a + "k_norm.weight", qk_norm),
                "wo": lin(get(a + "o_proj.weight")), "bo": bias(a + "o_proj.bias", _o_proj_bias(c)),
                "mlp_norm_w": put(get(b + "post_attention_layernorm.weight")), "mlp_norm_b": None,
                "w_gate": lin(get(b + "mlp.gate_proj.weight")),
                "b_gate": bias(b + "mlp.gate_proj.bias", c.mlp_bias),
                "w_up": lin(get(b + "mlp.up_proj.weight")),
                "b_up": bias(b + "mlp.up_proj.bias", c.mlp_bias),
                "w_down": lin(get(b + "mlp.down_proj.weight")),
                "b_down": bias(b + "mlp.down_proj.bias", c.mlp_bias),
            })
        top = {"embed": put(get("model.embed_tokens.weight")), "pos_embed": None,
               "norm_w": put(get("model.norm.weight")), "norm_b": None}
    # a tied head is a transposed view of the embedding (no copy; a copy of its own where the
    # linear weights are held as stored and the embedding is not)
    if not c.tie_word_embeddings:
        top["lm_head"] = lin(get("lm_head.weight"))
    elif put_linear is None:
        top["lm_head"] = top["embed"].T
    else:
        top["lm_head"] = lin(get(f"{prefix}wte.weight" if c.family == "gpt2"
                                 else "model.embed_tokens.weight"))
    top["layers"] = layers
    return top


def _to_hf_tensors(model: Model) -> dict[str, np.ndarray]:
    """The inverse of _build_weights: HF-named float32 host arrays (gpt2: "transformer." names)."""
    c, w = model.config, model.weights

    def h(a) -> np.ndarray:
        return np.ascontiguousarray(widen(to_host(a)), dtype=np.float32)

    out: dict[str, np.ndarray] = {}
    if c.family == "gpt2":
        p = "transformer."
        out[p + "wte.weight"], out[p + "wpe.weight"] = h(w["embed"]), h(w["pos_embed"])
        names = {"attn_norm_w": "ln_1.weight", "attn_norm_b": "ln_1.bias",
                 "wqkv": "attn.c_attn.weight", "bqkv": "attn.c_attn.bias",
                 "wo": "attn.c_proj.weight", "bo": "attn.c_proj.bias",
                 "mlp_norm_w": "ln_2.weight", "mlp_norm_b": "ln_2.bias",
                 "w_up": "mlp.c_fc.weight", "b_up": "mlp.c_fc.bias",
                 "w_down": "mlp.c_proj.weight", "b_down": "mlp.c_proj.bias"}
        for i, layer in enumerate(w["layers"]):
            for key, name in names.items():
                out[f"{p}h.{i}.{name}"] = h(layer[key])
            scale = 1 / _query_scale(c, i)  # unfold what _build_weights folded in
            out[f"{p}h.{i}.attn.c_attn.weight"] = out[f"{p}h.{i}.attn.c_attn.weight"] * scale
            out[f"{p}h.{i}.attn.c_attn.bias"] = out[f"{p}h.{i}.attn.c_attn.bias"] * scale
        out[p + "ln_f.weight"], out[p + "ln_f.bias"] = h(w["norm_w"]), h(w["norm_b"])
    else:
        he, ke = c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim
        out["model.embed_tokens.weight"] = h(w["embed"])
        for i, layer in enumerate(w["layers"]):
            b, a = f"model.layers.{i}.", f"model.layers.{i}.self_attn."
            out[b + "input_layernorm.weight"] = h(layer["attn_norm_w"])
            wqkv = h(layer["wqkv"])
            for n, cols in zip("qkv", (slice(0, he), slice(he, he + ke), slice(he + ke, None))):
                out[a + n + "_proj.weight"] = h(wqkv[:, cols].T)
                if layer["bqkv"] is not None:
                    out[a + n + "_proj.bias"] = h(h(layer["bqkv"])[cols])
            out[a + "o_proj.weight"] = h(h(layer["wo"]).T)
            if layer["bo"] is not None:
                out[a + "o_proj.bias"] = h(layer["bo"])
            if layer.get("q_norm_w") is not None:
                out[a + "q_norm.weight"] = h(layer["q_norm_w"])
                out[a + "k_norm.weight"] = h(layer["k_norm_w"])
            out[b + "post_attention_layernorm.weight"] = h(layer["mlp_norm_w"])
            for n in ("gate", "up", "down"):
                out[b + f"mlp.{n}_proj.weight"] = h(h(layer[f"w_{n}"]).T)
                if layer.get(f"b_{n}") is not None:
                    out[b + f"mlp.{n}_proj.bias"] = h(layer[f"b_{n}"])
        out["model.norm.weight"] = h(w["norm_w"])
    if not c.tie_word_embeddings:
        out["lm_head.weight"] = h(h(w["lm_head"]).T)
    return out


def _compute_dtype(dtype) -> np.dtype:
    if dtype is None:
        return np.dtype(np.float32)
    try:
        dt = np.dtype(dtype)
    except Exception:  # noqa: BLE001 - np.dtype raises TypeError, ValueError, ... on odd input
        dt = None
    if dt not in (np.dtype(np.float32), np.dtype(np.float16)):
        raise MinispecError(f"dtype: expected None, 'float32' or 'float16', got {dtype!r:.100} "
                            f"(bfloat16 weights are converted; compute in float32 or float16)")
    return dt


def _as_stored(ckpt, config: ModelConfig, prefix: str, xp, dtype, requested) -> Callable | None:
    """How the linear weights are put when they stay as stored: a bfloat16 or float16 checkpoint
    loaded on the CPU with the default dtype keeps its matrices 16-bit (backend.BF16, F16),
    which the few-rows kernels widen in registers: the same logits, bit for bit, for half the
    bytes each step reads. None (every weight widened to `dtype` at load) on the GPU, for an
    explicit dtype, without numba, or for a checkpoint whose matrices are not all BF16 or all
    F16."""
    if requested is not None or xp is not np or not kernel_available():
        return None
    names = [n for n, shape in hf_shapes(config, prefix).items() if len(shape) == 2
             and "wpe" not in n]  # GPT-2's position table is looked up, not multiplied
    stored = {ckpt.dtype(n) for n in names}
    return as_stored_putter(stored.pop(), dtype) if len(stored) == 1 else None


def as_stored_putter(stored: str, dtype) -> Callable | None:
    """put(float32 [out, in]) for matrices stored as `stored` ("BF16", "F16"): held in that
    format where it holds the values exactly, else as `dtype` (GPT-2's folded query scale); None
    for any other format."""
    if stored == "BF16":
        def put(a: np.ndarray) -> np.ndarray:
            bits = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
            if (bits & 0xFFFF).any():  # not a bfloat16: float32 as it is
                return np.array(a, dtype=dtype, order="C")
            return (bits >> 16).astype(BF16)
    elif stored == "F16":
        def put(a: np.ndarray) -> np.ndarray:
            half = np.ascontiguousarray(a, dtype=F16)
            if not np.array_equal(half.astype(np.float32), a):  # not a float16: as it is
                return np.array(a, dtype=dtype, order="C")
            return half
    else:
        return None
    return put


def widened(model: Model) -> Model:
    """`model` with every matrix held as stored (BF16) widened to float32: what dtype="float32"
    would have loaded, sharing every other array."""
    def wide(a):
        return widen(a.T).T if isinstance(a, np.ndarray) and a.dtype in (BF16, F16) else a

    w = model.weights
    weights = {k: wide(v) for k, v in w.items() if k != "layers"}
    weights["layers"] = [{k: wide(v) for k, v in layer.items()} for layer in w["layers"]]
    return Model(model.config, weights, xp=model.xp, device=model.device, dtype=model.dtype,
                 tokenizer=model.tokenizer, name=model.name)


def _putter(xp, dtype: np.dtype):
    def put(a: np.ndarray):
        # always a copy: a view into the memory-mapped file would break if the file changed later
        host = np.array(a, dtype=dtype, order="C", copy=True if xp is np else None)
        return host if xp is np else xp.asarray(host)
    return put


def _into(arena: Arena, put: Callable) -> Callable:
    """put, its result copied into the arena (backend.Arena: 2 MB pages where the kernel grants
    them, each matrix on a cache line, one after the other as a step reads them). Same values;
    the products ran 5-7% faster so for one row, 14-20% for five (SmolLM2-135M and the shipped
    target, weights/README.md)."""
    return lambda a: arena.put(put(a))


def _describe(c: ModelConfig) -> str:
    return (f"vocab_size={c.vocab_size}, hidden_size={c.hidden_size}, n_heads={c.n_heads}, "
            f"n_kv_heads={c.n_kv_heads}, head_dim={c.head_dim}, "
            f"intermediate_size={c.intermediate_size}, tie_word_embeddings={c.tie_word_embeddings}")


def load(path: str | Path, *, dtype=None, device: str = "auto",
         activations: str = "float32") -> Model:
    """Load a Hugging Face model directory (config.json + safetensors [+ tokenizer.json]) -> Model.

    dtype: compute dtype, None -> float32 ("float16" is meant for the GPU); with None, a bfloat16
    checkpoint on the CPU keeps its matrices bfloat16 in memory (`_as_stored`: the same logits,
    half the bytes read), dtype="float32" widens them at load; likewise a GGUF's conversion
    with its blocks beside it (GGUF_BLOCKS) has the kernel read its Q4_1 and Q8_0 matrices as
    they were stored (`_keep_gguf_blocks`). activations="int8", for such a conversion on the
    CPU: those matrices multiply activations quantized to int8 per block of 32, llama.cpp's
    arithmetic (kernels.py, "int8 activations"): faster, and not the float32 model's logits
    (within ~1% of each product); needs numba and AVX-512 VNNI. Turn the CPU speed path on
    for it (minispec.use_speed_path(model), as the command line and benchmarks do): there every
    call, Model.logits too, takes one arithmetic, so a verify call gives one-token steps'
    logits; on the plain path a call's attention can differ from a step's in the last bits,
    and an activation rounded the other way moves a logit by far more. device: "auto" | "cpu" |
    "gpu". Raises MinispecError naming the file and what was expected for anything missing or wrong.
    "shipped:target" (or "shipped:draft") names a shipped model from any directory.
    """
    path = shipped.resolve(path)  # minispec/shipped.py; any other path passes unchanged
    if not isinstance(path, (str, Path)):
        raise MinispecError(f"load: path must be a directory path (str or Path), got "
                            f"{type(path).__name__}")
    path = Path(path)
    if not path.exists():
        raise MinispecError(f"{path}: does not exist (expected a model directory with "
                            f"config.json and model.safetensors)")
    if not path.is_dir():
        raise MinispecError(f"{path}: not a model directory (expected config.json and "
                            f"model.safetensors in it)")
    _check_activations(activations, path, dtype, device)
    xp, dev = get_backend(device)
    if activations == "int8" and xp is not np:
        raise MinispecError("activations='int8': runs on the CPU (device 'auto' found a GPU: "
                            "pass device='cpu')")
    dt = _compute_dtype(dtype)
    config = read_config(path / "config.json")
    ckpt = Checkpoint(path)
    prefix = _gpt2_prefix(ckpt.keys()) if config.family == "gpt2" else ""
    # the layer count first: a config claiming ten million layers must not make the table below
    stem = f"{prefix}h." if config.family == "gpt2" else "model.layers."
    present = {name[len(stem):].split(".", 1)[0] for name in ckpt.keys() if name.startswith(stem)}
    if config.n_layers > len(present):
        raise MinispecError(f"{path / 'config.json'}: {str(config.n_layers)[:20]} layers "
                            f"(num_hidden_layers), but the checkpoint holds {len(present)}")
    for name, shape in hf_shapes(config, prefix).items():  # checked before any data is read
        if name not in ckpt:
            raise MinispecError(f"{path}: tensor {name!r} is missing from the checkpoint (expected "
                                f"shape {list(shape)} for {config.family}: {_describe(config)})")
        if ckpt.shape(name) != shape:
            raise MinispecError(f"{ckpt.file_of(name)}: tensor {name!r} has shape "
                                f"{list(ckpt.shape(name))}, expected {list(shape)} from "
                                f"config.json "
                                f"({_describe(config)})")
        if ckpt.dtype(name) not in SUPPORTED:
            raise MinispecError(f"{ckpt.file_of(name)}: tensor {name!r} has dtype "
                                f"{ckpt.dtype(name)}; minispec reads {', '.join(SUPPORTED)}")
    tokenizer = None
    if (path / "tokenizer.json").exists():
        tokenizer = Tokenizer.from_file(path / "tokenizer.json")
    config = _special_tokens(config, path, tokenizer)
    get = _finite_getter(ckpt)
    put, as_stored = _putter(xp, dt), _as_stored(ckpt, config, prefix, xp, dt, dtype)
    if xp is np:  # on the CPU every weight is copied into one arena, as a step reads them
        arena = Arena()
        put = _into(arena, lambda a: np.asarray(a, dtype=dt))  # the arena's copy is the copy
        if as_stored is not None:  # (None when the matrices are widened at load)
            as_stored = _into(arena, as_stored)
    weights = _build_weights(config, get, put, prefix, as_stored)
    try:
        model = Model(config, weights, xp=xp, device=dev, dtype=dt, tokenizer=tokenizer,
                      name=path.resolve().name)
    except MinispecError as e:  # e.g. RoPE frequencies no float holds: name the file
        raise MinispecError(f"{path / 'config.json'}: {e}") from None
    if (path / GGUF_BLOCKS).is_file() and xp is np and dtype is None and kernel_available():
        _keep_gguf_blocks(model, path / GGUF_BLOCKS, int8=activations == "int8")
    return model


def _check_activations(activations, path: Path, dtype, device: str) -> None:
    """load's `activations`: "float32", or "int8" where it can run (a MinispecError saying what
    is missing otherwise)."""
    if activations not in ("float32", "int8"):
        raise MinispecError(f"activations: expected 'float32' or 'int8', got {activations!r:.100}")
    if activations == "float32":
        return
    if device == "gpu" or dtype is not None:
        raise MinispecError("activations='int8': the CPU's product with GGUF blocks, as stored "
                            f"(device 'cpu' or 'auto' and dtype None; got device {device!r}, "
                            f"dtype {dtype!r})")
    if not (path / GGUF_BLOCKS).is_file():
        raise MinispecError(f"{path}: activations='int8' multiplies a GGUF conversion's Q4_1 "
                            f"and Q8_0 blocks, and there is no {GGUF_BLOCKS} here "
                            "(minispec.convert writes it beside the conversion of a GGUF file)")
    if not int8_supported():
        raise MinispecError("activations='int8': needs numba and a CPU with AVX-512 VNNI "
                            "(avx512vnni); this one has not")


def _keep_gguf_blocks(model: Model, path: Path, int8: bool = False) -> None:
    """The few-rows kernel reads each matrix `path` (minispec.convert's GGUF_BLOCKS beside a
    GGUF's float32 conversion) holds from its Q4_1 or Q8_0 blocks (backend.keep_blocks): the
    same values, a fifth of the bytes a step reads. Every matrix is checked to hold, bit for
    bit, the weights model.safetensors gave (a MinispecError naming the file otherwise: blocks
    of another conversion); the float32 weights stay the reference and the prefill's. int8: they
    multiply int8 activations (backend.keep_blocks)."""
    from .kernels import Q4_1_BLOCK, Q8_0_BLOCK, dequantize
    from .safetensors import SafetensorsFile

    f, c, w = SafetensorsFile(path), model.config, model.weights

    def take(names: list[str], weight) -> None:
        if weight is None or weight.dtype != np.float32 or not all(n in f for n in names):
            return  # (weights not float32 do not hold the blocks' values)
        parts = [f.get_bytes(n) for n in names]  # [rows, D_in / 32, bytes] each, along D_out
        d_in, d_out = weight.shape
        for n, b in zip(names, parts):
            if b.ndim != 3 or b.shape[1] * 32 != d_in or b.shape[2] not in (Q4_1_BLOCK, Q8_0_BLOCK):
                raise MinispecError(f"{path}: tensor {n!r} has shape {list(b.shape)}, expected "
                                    f"[rows, {d_in // 32}, {Q4_1_BLOCK} or {Q8_0_BLOCK}] (GGUF "
                                    f"blocks of a weight of {d_in} inputs)")
        if len({b.shape[2] for b in parts}) > 1:  # q, k, v in two formats (a GGUF may mix
            return  # them): one product reads one format, so this one reads float32
        blocks = np.concatenate(parts) if len(parts) > 1 else parts[0]
        with np.errstate(all="ignore"):  # a corrupt scale (NaN) fails the comparison below
            values = dequantize(blocks) if blocks.shape[0] == d_out else None
        if values is None or not np.array_equal(values.view(np.uint32),
                                                weight.T.view(np.uint32)):
            raise MinispecError(f"{path}: the blocks of {names[0]!r} do not hold the weights "
                                f"of model.safetensors (a conversion of another file?); remove "
                                f"{path.name} or convert again")
        keep_blocks(weight, blocks, int8=int8)

    for i, layer in enumerate(w["layers"]):
        a, m = f"model.layers.{i}.self_attn.", f"model.layers.{i}.mlp."
        take([a + "q_proj.weight", a + "k_proj.weight", a + "v_proj.weight"], layer["wqkv"])
        take([a + "o_proj.weight"], layer["wo"])
        for n in ("gate", "up", "down"):
            take([m + f"{n}_proj.weight"], layer[f"w_{n}"])
    take(["model.embed_tokens.weight" if c.tie_word_embeddings else "lm_head.weight"],
         w["lm_head"])


def _finite_getter(ckpt):
    """ckpt.get, refusing a tensor holding NaN or infinity (a flipped byte, a shifted header):
    such weights load fine and then make every logit NaN, so greedy decoding would emit token 0
    forever. Checked once per tensor at load, never per token."""
    def get(name):
        a = ckpt.get(name)
        if not np.isfinite(a).all():
            raise MinispecError(f"{ckpt.file_of(name)}: tensor {name!r} holds NaN or infinite "
                                "values")
        return a

    return get


def _token_ids_from(doc: dict, key: str, where: str) -> tuple[int, ...] | None:
    value = doc.get(key)
    if value is None:
        return None
    values = value if isinstance(value, list) else [value]
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values):
        raise MinispecError(f"{where}: field {key!r} should be a token id or a list of them, got "
                            f"{value!r}")
    return tuple(values)


def read_special_tokens_file(path: Path) -> dict:
    """generation_config.json or tokenizer_config.json as a dict, read for the few fields minispec
    takes from it (BOS/EOS ids or strings, add_bos_token): what it holds besides (a NaN sampling
    setting, transformers' int(1e30) model_max_length, a chat template, fields of other tools) is
    never looked at, so never refused. A file that cannot be read at all (not JSON, too large) is
    ignored with a warning, as transformers ignores a broken generation_config.json: the ids
    then come from config.json and the tokenizer."""
    try:
        doc = read_json(path, allow_nan=True)
    except MinispecError as e:
        warnings.warn(f"{e}; ignored (minispec reads only special tokens from it)", stacklevel=3)
        return {}
    return doc if isinstance(doc, dict) else {}


def _special_tokens(config: ModelConfig, path: Path, tok: Tokenizer | None) -> ModelConfig:
    """BOS/EOS from config.json, overridden by generation_config.json, else
    tokenizer_config.json; every id checked against the vocabulary here, naming the file it came
    from, so that no generation later meets a stop token the model cannot emit."""
    where = {}  # the file and field each id came from
    bos = (config.bos_token_id,) if config.bos_token_id is not None else None
    eos = config.eos_token_ids or None
    for key, ids in (("bos_token_id", bos), ("eos_token_id", eos)):
        where.update({(key, i): (path / "config.json", key) for i in ids or ()})
    gen_path = path / "generation_config.json"
    if gen_path.exists():
        gen = read_special_tokens_file(gen_path)
        for key in ("bos_token_id", "eos_token_id"):
            ids = _token_ids_from(gen, key, str(gen_path))
            where.update({(key, i): (gen_path, key) for i in ids or ()})
            if key == "bos_token_id":
                bos = ids or bos
            else:
                eos = ids or eos
    tc_path = path / "tokenizer_config.json"
    tc = read_special_tokens_file(tc_path) if tc_path.exists() else {}
    if tok is not None:
        def token_id(key: str) -> int | None:
            t = tc.get(key)
            t = t.get("content") if isinstance(t, dict) else t
            return tok.token_to_id(t) if isinstance(t, str) else None

        if bos is None and token_id("bos_token") is not None:
            bos = (token_id("bos_token"),)
            where[("bos_token_id", bos[0])] = (tc_path, "bos_token")
        if eos is None and token_id("eos_token") is not None:
            eos = (token_id("eos_token"),)
            where[("eos_token_id", eos[0])] = (tc_path, "eos_token")
    for key, ids in (("bos_token_id", bos), ("eos_token_id", eos)):
        for i in ids or ():
            if i >= config.vocab_size:
                file, field = where[(key, i)]
                raise MinispecError(f"{file}: field {field!r} is token {str(i)[:30]}, outside the "
                                    f"model's vocabulary (ids 0..{config.vocab_size - 1}, "
                                    f"vocab_size in config.json)")
    if tok is not None:
        _tokenizer_bos_eos(tok, tc, tc_path, bos, eos)
    return dataclasses.replace(config, bos_token_id=bos[0] if bos else None,
                               eos_token_id=eos[0] if eos else None, eos_token_ids=eos or ())


def _tokenizer_bos_eos(tok: Tokenizer, tc: dict, tc_path: Path, bos, eos) -> None:
    """encode() adds BOS exactly when the model's own tokenizer would."""
    add_bos = tc.get("add_bos_token")
    if add_bos is not None and not isinstance(add_bos, bool):
        raise MinispecError(f"{tc_path}: field 'add_bos_token' should be true, false or "
                            f"null, got {add_bos!r:.60}")
    pp_bos = tok.post_processor_bos()
    if add_bos is False or (add_bos is None and pp_bos is None):
        tok.bos_id = None
    else:
        tok.bos_id = pp_bos if pp_bos is not None else (bos[0] if bos else None)
    tok.eos_id = eos[0] if eos else None


def random_model(config: ModelConfig, *, seed: int = 0, device: str = "cpu", dtype=None,
                 scale: float = 0.02) -> Model:
    """A model with random normal weights (std `scale`; norm weights 1 + that), seeded.

    No files, no tokenizer: for tests and benchmarks. Larger scale -> peakier logits.
    """
    xp, dev = get_backend(device)
    dt = _compute_dtype(dtype)
    rng = np.random.default_rng(seed)
    prefix = "transformer." if config.family == "gpt2" else ""
    tensors = {}
    for name, shape in hf_shapes(config, prefix).items():
        a = rng.standard_normal(shape, dtype=np.float32) * np.float32(scale)
        if name.endswith("weight") and ("norm" in name or "ln_" in name):
            a += np.float32(1.0)
        tensors[name] = a
    weights = _build_weights(config, tensors.__getitem__, _putter(xp, dt), prefix)
    return Model(config, weights, xp=xp, device=dev, dtype=dt, name=f"random-{config.family}")


def save_checkpoint(model: Model, path: str | Path, *, bf16: bool = False) -> None:
    """Write config.json + model.safetensors in the Hugging Face layout (float32, or BF16 if bf16).

    load() and transformers' from_pretrained both read the result back.
    """
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    hf: dict[str, Any] = model.config.to_hf()
    if bf16:
        hf["torch_dtype"] = "bfloat16"
    (path / "config.json").write_text(json.dumps(hf, indent=2) + "\n", encoding="utf-8")
    save_file(_to_hf_tensors(model), path / "model.safetensors", bf16=bf16)
