"""One ModelConfig for every supported family, and reading it from a Hugging Face config.json.

config.json is read as the hub spells it (rope_theta and rope_scaling at the top level, GPT-2's
n_embd, n_layer, ...) and as transformers 5 writes it (rope_parameters: {"rope_type",
"rope_theta", ...}). Every field the math depends on is checked here once, so the model code can
trust the config.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .errors import MinispecError

FAMILIES = ("llama", "qwen2", "mistral", "gpt2")

# model_type values (and the architectures spelled in config.json) that map onto each family
_MODEL_TYPES = {"llama": "llama", "qwen2": "qwen2", "mistral": "mistral", "gpt2": "gpt2"}
_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "MistralForCausalLM": "mistral",
    "GPT2LMHeadModel": "gpt2",
}
# activation spellings transformers' ACT2FN maps to the very same function: the tanh GELU (gelu_fast
# rounds sqrt(2/pi) to 0.7978845608, 3e-12 off) for gpt2, SiLU for the others
GELU_TANH_NAMES = ("gelu_new", "gelu_fast", "gelu_pytorch_tanh", "gelu_python_tanh",
                   "gelu_accurate")
SILU_NAMES = ("silu", "swish")
# the heads a config's `architectures` may name: minispec runs causal language models only
CAUSAL_LM_SUFFIXES = ("ForCausalLM", "LMHeadModel")
_ARCH_OF = {family: arch for arch, family in _ARCHITECTURES.items()}
ROPE_TYPES = ("default", "linear", "llama3")
_LLAMA3_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")


@dataclass
class ModelConfig:
    """The shape and the few switches of a decoder-only transformer; one set of fields for all.

    family picks the parts: llama / qwen2 / mistral are RMSNorm + RoPE + SwiGLU; gpt2 is LayerNorm +
    learned positions + GELU (tanh approximation) with biases everywhere.
    """

    family: str = "llama"  # "llama" | "qwen2" | "mistral" | "gpt2"
    vocab_size: int = 32000  # rows of the embedding; may exceed the tokenizer's vocabulary
    hidden_size: int = 512  # D, the width of the residual stream
    n_layers: int = 4
    n_heads: int = 8  # H, query heads
    n_kv_heads: int | None = None  # K, key/value heads (grouped-query attention); None -> n_heads
    head_dim: int | None = None  # E; None -> hidden_size // n_heads (Llama 3.2 sets it)
    intermediate_size: int | None = None  # F, the MLP width; None -> 4 * hidden_size (GPT-2)
    max_position_embeddings: int = 2048  # the context length; no sequence may be longer
    norm_eps: float = 1e-5  # epsilon in RMSNorm / LayerNorm
    rope_theta: float = 10000.0  # RoPE base frequency (unused by gpt2)
    # None for plain RoPE, else {"rope_type": "linear", "factor": f} or {"rope_type": "llama3",
    # "factor",
    # "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"} (Llama 3.1+)
    rope_scaling: dict[str, Any] | None = None
    tie_word_embeddings: bool = False  # the LM head reuses the embedding matrix
    # q/k/v projections carry a bias (always on for qwen2; for llama it also adds a bias to o_proj,
    # as transformers' LlamaAttention does)
    attention_bias: bool = False
    sliding_window: int | None = None  # Mistral: a query sees at most this many latest positions
    bos_token_id: int | None = None
    eos_token_id: int | None = None  # the first stop token; all of them are in eos_token_ids
    eos_token_ids: tuple[int, ...] = field(default_factory=tuple)  # every stop token (Llama 3: 3)

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise MinispecError(
                f"ModelConfig.family: expected one of {', '.join(FAMILIES)}, got {self.family!r}"
            )
        if self.n_kv_heads is None:
            self.n_kv_heads = self.n_heads
        if self.head_dim is None:
            if self.n_heads <= 0 or self.hidden_size % self.n_heads:
                raise MinispecError(
                    f"ModelConfig: hidden_size {self.hidden_size} is not divisible by "
                    f"n_heads {self.n_heads}; set head_dim"
                )
            self.head_dim = self.hidden_size // self.n_heads
        if self.intermediate_size is None:
            self.intermediate_size = 4 * self.hidden_size
        if self.family == "qwen2":
            self.attention_bias = True
        if self.family == "gpt2" and self.head_dim * self.n_heads != self.hidden_size:
            raise MinispecError(f"ModelConfig: gpt2 needs head_dim * n_heads == hidden_size, got "
                                f"{self.head_dim} * {self.n_heads} != {self.hidden_size}")
        for name in ("vocab_size", "hidden_size", "n_layers", "n_heads", "n_kv_heads", "head_dim",
                     "intermediate_size", "max_position_embeddings"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise MinispecError(f"ModelConfig.{name}: expected a positive integer, got "
                                    f"{value!r}")
        if self.n_heads % self.n_kv_heads:
            raise MinispecError(
                f"ModelConfig: n_heads {self.n_heads} must be a multiple of n_kv_heads "
                f"{self.n_kv_heads}"
            )
        if self.family != "gpt2" and self.head_dim % 2:
            raise MinispecError(f"ModelConfig.head_dim: RoPE needs an even head_dim, got "
                                f"{self.head_dim}")
        if self.sliding_window is not None and (
            not isinstance(self.sliding_window, int) or self.sliding_window <= 0
        ):
            raise MinispecError(
                f"ModelConfig.sliding_window: expected a positive integer or None, got "
                f"{self.sliding_window!r}"
            )
        if not (isinstance(self.norm_eps, (int, float)) and self.norm_eps > 0):
            raise MinispecError(f"ModelConfig.norm_eps: expected a positive number, got "
                                f"{self.norm_eps!r}")
        if not (isinstance(self.rope_theta, (int, float)) and self.rope_theta > 0):
            raise MinispecError(f"ModelConfig.rope_theta: expected a positive number, got "
                                f"{self.rope_theta!r}")
        self.rope_scaling = _check_rope_scaling(self.rope_scaling, "ModelConfig.rope_scaling")
        if self.eos_token_id is not None and not self.eos_token_ids:
            self.eos_token_ids = (self.eos_token_id,)
        self.eos_token_ids = tuple(self.eos_token_ids)
        if self.eos_token_id is None and self.eos_token_ids:
            self.eos_token_id = self.eos_token_ids[0]

    @property
    def context_length(self) -> int:
        """The longest sequence the model accepts (max_position_embeddings)."""
        return self.max_position_embeddings

    def to_dict(self) -> dict[str, Any]:
        """The fields as a plain dict (JSON-serialisable)."""
        d = asdict(self)
        d["eos_token_ids"] = list(self.eos_token_ids)
        return d

    @classmethod
    def from_hf(cls, hf: dict[str, Any], source: str = "config.json") -> ModelConfig:
        """A ModelConfig from a Hugging Face config.json's dict; `source` names it in errors."""
        return _from_hf(hf, source)

    def to_hf(self) -> dict[str, Any]:
        """A config.json dict in the hub's spelling, which transformers and `from_hf` both read."""
        return _to_hf(self)


def read_config(path: str | Path) -> ModelConfig:
    """Read a config.json file (a path to the file or to the model directory)."""
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    hf = read_json(path)
    if not isinstance(hf, dict):
        raise MinispecError(f"{path}: expected a JSON object, got {type(hf).__name__}")
    return ModelConfig.from_hf(hf, str(path))


MAX_JSON_BYTES = 64 * 2**20  # config.json and friends are kilobytes; tokenizer.json megabytes
# the most digits a JSON integer may have: int() of it stays cheap (Python's own limit is 4300),
# and transformers' int(1e30) "model_max_length" (31 digits) reads as what it is
MAX_INT_DIGITS = 4000


def read_json(path: Path, max_bytes: int = MAX_JSON_BYTES, *, allow_nan: bool = False) -> Any:
    """json.load with MinispecError naming the file for a missing, special (a FIFO would hang
    the read), oversized or corrupt file; integers of more than MAX_INT_DIGITS digits and nesting
    deeper than Python's recursion limit are refused as corrupt, and so are NaN/Infinity unless
    allow_nan (for files of which minispec reads a few fields and ignores the rest)."""
    if not path.exists():
        raise MinispecError(f"{path}: file not found")
    if not path.is_file():
        raise MinispecError(f"{path}: not a regular file")
    try:
        if path.stat().st_size > max_bytes:
            raise MinispecError(f"{path}: {path.stat().st_size} bytes, more than the "
                                f"{max_bytes} a JSON file here may have")
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise MinispecError(f"{path}: cannot read ({str(e)[:200]})") from None
    try:
        return json.loads(text, parse_int=bounded_int,
                          parse_constant=float if allow_nan else _no_constant)
    except (json.JSONDecodeError, ValueError, RecursionError) as e:
        raise MinispecError(f"{path}: not valid JSON ({str(e)[:200]})") from None


def bounded_int(s: str) -> int:
    """int(s) for json's parse_int, refusing a number too long to convert cheaply."""
    digits = len(s) - s.startswith("-")
    if digits > MAX_INT_DIGITS:
        raise ValueError(f"an integer of {digits} digits (at most {MAX_INT_DIGITS})")
    return int(s)


def _no_constant(s: str):
    raise ValueError(f"{s} is not a JSON number")


def _check_rope_scaling(rs: Any, where: str) -> dict[str, Any] | None:
    """Normalise a rope scaling dict to {"rope_type": ..., factors...}, or None for plain RoPE."""
    if rs is None:
        return None
    if not isinstance(rs, dict):
        raise MinispecError(f"{where}: expected an object or null, got {rs!r}")
    rope_type = rs.get("rope_type", rs.get("type", "default"))
    if rope_type not in ROPE_TYPES:
        raise MinispecError(
            f"{where}: rope_type {rope_type!r} is not supported; expected one of "
            f"{', '.join(ROPE_TYPES)}"
        )
    if rope_type == "default":
        return None
    keys = ("factor",) if rope_type == "linear" else _LLAMA3_KEYS
    out: dict[str, Any] = {"rope_type": rope_type}
    for key in keys:
        value = rs.get(key)
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
            raise MinispecError(f"{where}.{key}: expected a positive number for rope_type "
                                f"{rope_type!r}, got {value!r}")
        out[key] = value
    if rope_type == "llama3" and out["low_freq_factor"] >= out["high_freq_factor"]:
        raise MinispecError(f"{where}: llama3 needs low_freq_factor < high_freq_factor, got "
                            f"{out['low_freq_factor']} and {out['high_freq_factor']}")
    return out


def _family(hf: dict[str, Any], source: str) -> str:
    model_type = hf.get("model_type")
    archs = hf.get("architectures")
    if archs is not None and not (isinstance(archs, list)
                                  and all(isinstance(a, str) for a in archs)):
        raise MinispecError(f"{source}: field 'architectures' should be a list of class names, "
                            f"got {archs!r:.100}")
    archs = archs or []
    family = _MODEL_TYPES.get(model_type) if isinstance(model_type, str) else None
    if family is None and model_type is None:
        family = next((_ARCHITECTURES[a] for a in archs if a in _ARCHITECTURES), None)
    if family is None and model_type is None and not archs:
        raise MinispecError(f"{source}: field 'model_type' is missing and no 'architectures' "
                            f"names a model class, so nothing says which family this is; "
                            f"supported families: {', '.join(FAMILIES)}")
    if family is None:
        raise MinispecError(
            f"{source}: model_type {model_type!r:.60} (architectures {archs!r:.200}) is not "
            f"supported; supported families: {', '.join(FAMILIES)}"
        )
    heads = [a for a in archs if not a.endswith(CAUSAL_LM_SUFFIXES)]
    if heads:  # e.g. LlamaForSequenceClassification: the same body under another head
        raise MinispecError(
            f"{source}: field 'architectures' names {heads[0]!r:.80}, which is not a causal "
            f"language model; minispec runs {family} checkpoints saved as "
            f"...{' or ...'.join(CAUSAL_LM_SUFFIXES)} (e.g. {_ARCH_OF[family]})"
        )
    return family


def _int_ids(value: Any, where: str) -> tuple[int, ...]:
    if value is None:
        return ()
    values = value if isinstance(value, list) else [value]
    for v in values:
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise MinispecError(f"{where}: expected a token id (non-negative integer) or a list "
                                f"of them, got {value!r}")
    return tuple(values)


def _from_hf(hf: dict[str, Any], source: str) -> ModelConfig:
    family = _family(hf, source)

    def flag(key: str, default: bool) -> bool:  # a JSON boolean, not "false" or 0
        value = hf.get(key, default)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise MinispecError(f"{source}: field {key!r} should be true or false, got "
                                f"{value!r:.60}")
        return value

    def need(key: str, default: Any = ..., kind: type | tuple = int) -> Any:
        value = hf.get(key, default)
        if value is ...:
            raise MinispecError(f"{source}: field {key!r} is missing (needed for {family})")
        optional = default is not ...
        if value is None and optional:  # null where a default exists: the default
            return default
        if not (isinstance(value, kind) and not isinstance(value, bool)):
            kind_name = getattr(kind, "__name__", kind)
            raise MinispecError(f"{source}: field {key!r} should be {kind_name}, got "
                                f"{value!r:.60}")
        if isinstance(value, float) and not math.isfinite(value):
            raise MinispecError(f"{source}: field {key!r} should be finite, got {value!r}")
        return value

    number = (int, float)
    eos = _int_ids(hf.get("eos_token_id"), f"{source}: field 'eos_token_id'")
    bos = _int_ids(hf.get("bos_token_id"), f"{source}: field 'bos_token_id'")
    common = {
        "family": family,
        "vocab_size": need("vocab_size"),
        "bos_token_id": bos[0] if bos else None,
        "eos_token_id": eos[0] if eos else None,
        "eos_token_ids": eos,
    }
    if family == "gpt2":
        act = hf.get("activation_function", "gelu_new")
        if act not in GELU_TANH_NAMES:
            raise MinispecError(f"{source}: field 'activation_function' is {act!r:.60}; minispec "
                                f"supports the tanh GELU for gpt2, spelled "
                                f"{', '.join(map(repr, GELU_TANH_NAMES))}")
        for key, ok in (("scale_attn_weights", True), ("scale_attn_by_inverse_layer_idx", False),
                        ("reorder_and_upcast_attn", False), ("add_cross_attention", False)):
            if hf.get(key, ok) != ok:
                raise MinispecError(f"{source}: field {key!r} must be {ok} for gpt2, got "
                                    f"{hf.get(key)!r}")
        kw = {
            "hidden_size": need("n_embd", 768),
            "n_layers": need("n_layer", 12),
            "n_heads": need("n_head", 12),
            "intermediate_size": need("n_inner", None),
            "max_position_embeddings": need("n_positions", 1024),
            "norm_eps": float(need("layer_norm_epsilon", 1e-5, number)),
            "tie_word_embeddings": flag("tie_word_embeddings", True),
        }
    else:
        act = hf.get("hidden_act", "silu")
        if act not in SILU_NAMES:
            raise MinispecError(f"{source}: field 'hidden_act' is {act!r:.60}; minispec supports "
                                f"SiLU for {family}, spelled {', '.join(map(repr, SILU_NAMES))}")
        if hf.get("mlp_bias", False):
            raise MinispecError(f"{source}: field 'mlp_bias' is true; minispec supports MLPs "
                                f"without bias only")
        rope = hf.get("rope_parameters")
        if rope is not None and not isinstance(rope, dict):
            raise MinispecError(f"{source}: field 'rope_parameters' should be an object, got "
                                f"{rope!r}")
        if rope is not None:  # transformers 5: theta and scaling together
            theta = rope.get("rope_theta", hf.get("rope_theta", 10000.0))
            scaling = _check_rope_scaling(rope, f"{source}: field 'rope_parameters'")
        else:  # the hub spelling
            theta = hf.get("rope_theta", 10000.0)
            scaling = _check_rope_scaling(hf.get("rope_scaling"), f"{source}: field 'rope_scaling'")
        if not isinstance(theta, number) or isinstance(theta, bool) or theta <= 0:
            raise MinispecError(f"{source}: field 'rope_theta' should be a positive number, got "
                                f"{theta!r}")
        window = None
        if family == "mistral":
            window = need("sliding_window", None)
        elif family == "qwen2" and hf.get("use_sliding_window", False):
            raise MinispecError(f"{source}: field 'use_sliding_window' is true; minispec supports "
                                f"qwen2 with full attention in every layer only")
        n_heads = need("num_attention_heads")
        kw = {
            "hidden_size": need("hidden_size"),
            "n_layers": need("num_hidden_layers"),
            "n_heads": n_heads,
            "n_kv_heads": need("num_key_value_heads", None) or n_heads,
            "head_dim": need("head_dim", None),
            "intermediate_size": need("intermediate_size"),
            "max_position_embeddings": need("max_position_embeddings"),
            "norm_eps": float(need("rms_norm_eps", 1e-6, number)),
            "rope_theta": float(theta),
            "rope_scaling": scaling,
            "tie_word_embeddings": flag("tie_word_embeddings", False),
            "attention_bias": flag("attention_bias", family == "qwen2"),
            "sliding_window": window,
        }
    try:
        return ModelConfig(**common, **kw)
    except MinispecError as e:
        raise MinispecError(f"{source}: {e}") from None


def _to_hf(c: ModelConfig) -> dict[str, Any]:
    common: dict[str, Any] = {
        "vocab_size": c.vocab_size,
        "tie_word_embeddings": c.tie_word_embeddings,
        "bos_token_id": c.bos_token_id,
        "eos_token_id": list(c.eos_token_ids) if len(c.eos_token_ids) > 1 else c.eos_token_id,
        "torch_dtype": "float32",
    }
    if c.family == "gpt2":
        return {
            "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", **common,
            "n_embd": c.hidden_size, "n_layer": c.n_layers, "n_head": c.n_heads,
            "n_inner": c.intermediate_size, "n_positions": c.max_position_embeddings,
            "layer_norm_epsilon": c.norm_eps, "activation_function": "gelu_new",
        }
    arch = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
            "mistral": "MistralForCausalLM"}[c.family]
    hf = {
        "architectures": [arch], "model_type": c.family, **common,
        "hidden_size": c.hidden_size, "num_hidden_layers": c.n_layers,
        "num_attention_heads": c.n_heads, "num_key_value_heads": c.n_kv_heads,
        "head_dim": c.head_dim, "intermediate_size": c.intermediate_size,
        "max_position_embeddings": c.max_position_embeddings, "rms_norm_eps": c.norm_eps,
        "hidden_act": "silu", "rope_theta": c.rope_theta, "rope_scaling": c.rope_scaling,
    }
    if c.family == "llama":
        hf["attention_bias"] = c.attention_bias
    if c.family == "mistral":
        hf["sliding_window"] = c.sliding_window
    if c.family == "qwen2":
        hf["use_sliding_window"] = False
    return hf

