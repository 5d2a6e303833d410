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

FLOAT32_MAX = 3.4028234663852886e38  # the largest float32: norm statistics are float32

FAMILIES = ("llama", "qwen2", "qwen3", "mistral", "gpt2")

# model_type values (and the architectures spelled in config.json) that map onto each family
_MODEL_TYPES = {family: family for family in FAMILIES}
_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
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
ROPE_TYPES = ("default", "linear", "llama3", "yarn")
_LLAMA3_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
# what each scaled rope_type needs, and (YaRN) may carry; transformers' defaults fill the rest
_ROPE_KEYS = {"linear": ("factor",), "llama3": _LLAMA3_KEYS,
              "yarn": ("factor", "original_max_position_embeddings")}
_YARN_OPTIONAL = ("attention_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim")


@dataclass
class ModelConfig:
    """The shape and the few switches of a decoder-only transformer; one set of fields for all.

    family picks the parts: llama / qwen2 / qwen3 / mistral are RMSNorm + RoPE + SwiGLU (qwen3 also
    RMSNorms each query and key head); gpt2 is LayerNorm + learned positions + GELU (tanh
    approximation) with biases everywhere.
    """

    family: str = "llama"  # "llama" | "qwen2" | "qwen3" | "mistral" | "gpt2"
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
    # None for plain RoPE, else {"rope_type": "linear", "factor": f}, {"rope_type": "llama3",
    # "factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"} (Llama
    # 3.1+) or {"rope_type": "yarn", "factor", "original_max_position_embeddings", and any of
    # "attention_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim", "truncate"}
    rope_scaling: dict[str, Any] | None = None
    tie_word_embeddings: bool = False  # the LM head reuses the embedding matrix
    # q/k/v projections carry a bias (always on for qwen2; for llama and qwen3 it also adds a bias
    # to o_proj, as transformers' LlamaAttention and Qwen3Attention do)
    attention_bias: bool = False
    mlp_bias: bool = False  # llama (Granite code): the gate, up and down projections carry biases
    # gpt2 (Stanford CRFM's, CodeParrot): layer i's attention scores are also divided by i + 1 (the
    # loader folds that into layer i's query weights, so the forward pass never sees it)
    scale_attn_by_inverse_layer_idx: bool = False
    # Mistral (and Qwen2/Qwen3 when every layer slides): a query sees at most this many latest
    # positions
    sliding_window: int | None = None
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
        self.norm_eps = positive_float(self.norm_eps, "ModelConfig.norm_eps")
        if self.norm_eps > FLOAT32_MAX:  # the norms' statistics are float32: it would be inf
            raise MinispecError(f"ModelConfig.norm_eps: expected a positive number float32 "
                                f"holds (<= 3.4e38), got {self.norm_eps!r:.60}")
        self.rope_theta = positive_float(self.rope_theta, "ModelConfig.rope_theta")
        if self.family != "gpt2":
            _check_theta(self.rope_theta, self.head_dim, "ModelConfig.rope_theta")
        self.rope_scaling = _check_rope_scaling(self.rope_scaling, "ModelConfig.rope_scaling",
                                                self.max_position_embeddings)
        if (self.rope_scaling or {}).get("rope_type") == "yarn" and self.rope_theta == 1:
            raise MinispecError("ModelConfig.rope_theta: YaRN divides by log(rope_theta), so it "
                                "needs rope_theta != 1")
        for name, family in (("mlp_bias", "llama"), ("scale_attn_by_inverse_layer_idx", "gpt2")):
            if not isinstance(getattr(self, name), bool):
                raise MinispecError(f"ModelConfig.{name}: expected True or False, got "
                                    f"{getattr(self, name)!r:.40}")
            if getattr(self, name) and self.family != family:
                raise MinispecError(f"ModelConfig.{name}: only {family} has it, got family "
                                    f"{self.family!r}")
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


def positive_float(value: Any, where: str, *, zero: bool = False) -> float:
    """value as a finite float > 0 (>= 0 if zero), else MinispecError naming `where`: JSON's
    integers have no size limit, and 10**400 is an int that no float can hold."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise MinispecError(f"{where}: expected a positive number, got {value!r:.60}")
    try:
        x = float(value)
    except OverflowError:  # (str() of an int past 4300 digits raises: count them from its bits)
        digits = int(abs(value).bit_length() * math.log10(2)) + 1
        raise MinispecError(f"{where}: an integer of {digits} digits is too large for a float; "
                            f"expected a positive number") from None
    if not math.isfinite(x) or x < 0 or (x == 0 and not zero):
        raise MinispecError(f"{where}: expected a {'non-negative' if zero else 'positive'} "
                            f"finite number, got {value!r:.60}")
    return x


def _check_theta(theta: float, head_dim: int, where: str) -> None:
    # the fastest RoPE frequency is 1 / theta^((E-2)/E) for theta < 1 (1 for theta >= 1): it must
    # be a float, or every angle is infinite and every logit NaN
    try:
        theta ** -((head_dim - 2) / head_dim)
    except (OverflowError, ZeroDivisionError):
        raise MinispecError(f"{where}: {theta!r} is so small that its RoPE frequencies overflow "
                            f"a float") from None


def _check_rope_scaling(rs: Any, where: str, max_positions: Any = None) -> dict[str, Any] | None:
    """Normalise a rope scaling dict to {"rope_type": ..., factors...}, or None for plain RoPE.
    max_positions: YaRN's original_max_position_embeddings when the dict has none (transformers'
    default)."""
    if rs is None:
        return None
    if not isinstance(rs, dict):
        raise MinispecError(f"{where}: expected an object or null, got {rs!r:.100}")
    rope_type = rs.get("rope_type", rs.get("type", "default"))
    if rope_type not in ROPE_TYPES:
        raise MinispecError(
            f"{where}: rope_type {rope_type!r:.60} is not supported; expected one of "
            f"{', '.join(ROPE_TYPES)}"
        )
    if rope_type == "default":
        return None
    out: dict[str, Any] = {"rope_type": rope_type}
    for key in _ROPE_KEYS[rope_type]:
        value = rs.get(key)
        if (value is None and rope_type == "yarn" and key == "original_max_position_embeddings"
                and isinstance(max_positions, int)):
            value = max_positions
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise MinispecError(f"{where}.{key}: expected a positive number for rope_type "
                                f"{rope_type!r}, got {value!r:.60}")
        positive_float(value, f"{where}.{key}")  # refuses 0, negatives and 10**400
        out[key] = value
    if rope_type == "llama3" and out["low_freq_factor"] >= out["high_freq_factor"]:
        raise MinispecError(f"{where}: llama3 needs low_freq_factor < high_freq_factor, got "
                            f"{out['low_freq_factor']} and {out['high_freq_factor']}")
    if rope_type == "yarn":
        for key in _YARN_OPTIONAL:  # null or absent: transformers' default
            if rs.get(key) is not None:
                # mscale 0 turns it off; beta 0 means the default; attention_factor scales cos/sin
                out[key] = positive_float(rs[key], f"{where}.{key}",
                                          zero=key != "attention_factor")
        if rs.get("truncate") is not None:
            if not isinstance(rs["truncate"], bool):
                raise MinispecError(f"{where}.truncate: expected true or false, got "
                                    f"{rs['truncate']!r:.40}")
            out["truncate"] = rs["truncate"]
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


class _Fields:
    """Typed reads of a config.json dict, each error naming the file and the field."""

    def __init__(self, hf: dict[str, Any], source: str, family: str):
        self.hf, self.source, self.family = hf, source, family

    def flag(self, key: str, default: bool) -> bool:
        """A JSON boolean (not "false" or 0); null or absent: the default."""
        value = self.hf.get(key, default)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise MinispecError(f"{self.source}: field {key!r} should be true or false, got "
                                f"{value!r:.60}")
        return value

    def need(self, key: str, default: Any = ..., kind: type | tuple = int) -> Any:
        """The field, of type `kind` (never a bool); null or absent: the default if one is
        given, else an error."""
        value = self.hf.get(key, default)
        if value is ...:
            raise MinispecError(f"{self.source}: field {key!r} is missing (needed for "
                                f"{self.family})")
        if value is None and default is not ...:  # null where a default exists: the default
            return default
        if not (isinstance(value, kind) and not isinstance(value, bool)):
            kind_name = getattr(kind, "__name__", kind)
            raise MinispecError(f"{self.source}: field {key!r} should be {kind_name}, got "
                                f"{value!r:.60}")
        return value

    def number(self, key: str, default: float, value: Any = ...) -> float:
        """A positive finite float (an integer too big for a float is refused, not an
        OverflowError); null or absent: the default."""
        value = self.hf.get(key) if value is ... else value
        if value is None:
            return default
        return positive_float(value, f"{self.source}: field {key!r}")


def _from_hf(hf: dict[str, Any], source: str) -> ModelConfig:
    family = _family(hf, source)
    f = _Fields(hf, source, family)
    eos = _int_ids(hf.get("eos_token_id"), f"{source}: field 'eos_token_id'")
    bos = _int_ids(hf.get("bos_token_id"), f"{source}: field 'bos_token_id'")
    common = {
        "family": family,
        "vocab_size": f.need("vocab_size"),
        "bos_token_id": bos[0] if bos else None,
        "eos_token_id": eos[0] if eos else None,
        "eos_token_ids": eos,
    }
    kw = _gpt2_fields(f) if family == "gpt2" else _rope_family_fields(f)
    try:
        return ModelConfig(**common, **kw)
    except MinispecError as e:
        raise MinispecError(f"{source}: {e}") from None


def _gpt2_fields(f: _Fields) -> dict[str, Any]:
    act = f.hf.get("activation_function", "gelu_new")
    if act not in GELU_TANH_NAMES:
        raise MinispecError(f"{f.source}: field 'activation_function' is {act!r:.60}; minispec "
                            f"supports the tanh GELU for gpt2, spelled "
                            f"{', '.join(map(repr, GELU_TANH_NAMES))}")
    for key, ok in (("scale_attn_weights", True), ("add_cross_attention", False)):
        if f.hf.get(key, ok) != ok:
            raise MinispecError(f"{f.source}: field {key!r} must be {ok} for gpt2, got "
                                f"{f.hf.get(key)!r:.60}")
    # reorder_and_upcast_attn computes the scores in float32 with the scale applied first: the
    # same function as minispec's float32 scores, so it is read only to be checked
    f.flag("reorder_and_upcast_attn", False)
    return {
        "hidden_size": f.need("n_embd", 768),
        "n_layers": f.need("n_layer", 12),
        "n_heads": f.need("n_head", 12),
        "intermediate_size": f.need("n_inner", None),
        "max_position_embeddings": f.need("n_positions", 1024),
        "norm_eps": f.number("layer_norm_epsilon", 1e-5),
        "tie_word_embeddings": f.flag("tie_word_embeddings", True),
        "scale_attn_by_inverse_layer_idx": f.flag("scale_attn_by_inverse_layer_idx", False),
    }


def _rope_family_fields(f: _Fields) -> dict[str, Any]:
    hf, source, family = f.hf, f.source, f.family
    act = hf.get("hidden_act", "silu")
    if act not in SILU_NAMES:
        raise MinispecError(f"{source}: field 'hidden_act' is {act!r:.60}; minispec supports "
                            f"SiLU for {family}, spelled {', '.join(map(repr, SILU_NAMES))}")
    rope = hf.get("rope_parameters")
    if rope is not None and not isinstance(rope, dict):
        raise MinispecError(f"{source}: field 'rope_parameters' should be an object, got "
                            f"{rope!r:.100}")
    max_positions = f.need("max_position_embeddings")
    if rope is not None:  # transformers 5: theta and scaling together
        theta = f.number("rope_parameters.rope_theta", 10000.0,
                         rope.get("rope_theta", hf.get("rope_theta")))
        scaling = _check_rope_scaling(rope, f"{source}: field 'rope_parameters'", max_positions)
    else:  # the hub spelling
        theta = f.number("rope_theta", 10000.0)
        scaling = _check_rope_scaling(hf.get("rope_scaling"), f"{source}: field 'rope_scaling'",
                                      max_positions)
    n_heads, n_layers = f.need("num_attention_heads"), f.need("num_hidden_layers")
    if family == "mistral":
        window = f.need("sliding_window", None)
    else:
        window = _qwen_window(f, n_layers) if family in ("qwen2", "qwen3") else None
    return {
        "hidden_size": f.need("hidden_size"),
        "n_layers": n_layers,
        "n_heads": n_heads,
        "n_kv_heads": f.need("num_key_value_heads", None) or n_heads,
        "head_dim": f.need("head_dim", None),
        "intermediate_size": f.need("intermediate_size"),
        "max_position_embeddings": max_positions,
        "norm_eps": f.number("rms_norm_eps", 1e-6),
        "rope_theta": theta,
        "rope_scaling": scaling,
        "tie_word_embeddings": f.flag("tie_word_embeddings", False),
        "attention_bias": f.flag("attention_bias", family == "qwen2"),
        # transformers builds qwen2/qwen3/mistral MLPs without biases whatever the file says
        "mlp_bias": f.flag("mlp_bias", False) if family == "llama" else False,
        "sliding_window": window,
    }


def _qwen_window(f: _Fields, n_layers: int) -> int | None:
    """The one window every qwen2/qwen3 layer attends within, or None for full attention.

    As transformers reads it: no layer slides unless use_sliding_window is true and
    sliding_window is set; then layer i slides where layer_types says "sliding_attention", or,
    without layer_types, where i >= max_window_layers. A mix of sliding and full layers is
    refused (docs/limits.md says why)."""
    window = f.need("sliding_window", None)
    if not f.flag("use_sliding_window", False) or window is None:
        return None
    types = f.hf.get("layer_types")
    if types is None:
        first = f.need("max_window_layers", 28)  # transformers' default
        sliding = min(max(n_layers - first, 0), n_layers)
    else:
        kinds = ("full_attention", "sliding_attention")
        if (not isinstance(types, list) or len(types) != n_layers
                or any(t not in kinds for t in types)):
            raise MinispecError(f"{f.source}: field 'layer_types' should list "
                                f"{' or '.join(map(repr, kinds))} for each of the {n_layers} "
                                f"layers, got {types!r:.100}")
        sliding = types.count("sliding_attention")
    if sliding == n_layers:
        return window
    if sliding == 0:
        return None
    raise MinispecError(f"{f.source}: fields 'use_sliding_window', 'sliding_window' and "
                        f"'max_window_layers' (or 'layer_types') make {sliding} of the "
                        f"{n_layers} layers attend within {window} positions and the others to "
                        f"every position; minispec runs one attention span for every layer "
                        f"(docs/limits.md)")


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
            "scale_attn_by_inverse_layer_idx": c.scale_attn_by_inverse_layer_idx,
        }
    arch = _ARCH_OF[c.family]
    hf = {
        "architectures": [arch], "model_type": c.family, **common,
        "hidden_size": c.hidden_size, "num_hidden_layers": c.n_layers,
        "num_attention_heads": c.n_heads, "num_key_value_heads": c.n_kv_heads,
        "head_dim": c.head_dim, "intermediate_size": c.intermediate_size,
        "max_position_embeddings": c.max_position_embeddings, "rms_norm_eps": c.norm_eps,
        "hidden_act": "silu", "rope_theta": c.rope_theta, "rope_scaling": c.rope_scaling,
    }
    if c.family in ("llama", "qwen3"):
        hf["attention_bias"] = c.attention_bias
    if c.family == "llama":
        hf["mlp_bias"] = c.mlp_bias
    if c.family == "mistral":
        hf["sliding_window"] = c.sliding_window
    if c.family in ("qwen2", "qwen3"):  # every layer slides, or none
        hf.update(use_sliding_window=c.sliding_window is not None,
                  sliding_window=c.sliding_window, max_window_layers=0)
    return hf

