"""ModelConfig: defaults, both config.json spellings of RoPE, every family, and bad fields."""

import json

import numpy as np
import pytest

from minispec.config import ModelConfig, read_config
from minispec.core.model import rope_inv_freq
from minispec.errors import MinispecError

LLAMA = {
    "model_type": "llama", "vocab_size": 128256, "hidden_size": 2048, "num_hidden_layers": 16,
    "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64,
    "intermediate_size": 8192, "max_position_embeddings": 131072, "rms_norm_eps": 1e-5,
    "hidden_act": "silu", "tie_word_embeddings": True, "bos_token_id": 128000,
    "eos_token_id": [128001, 128008, 128009],
}
LLAMA3_SCALING = {"factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 8192}


def test_keyword_construction_and_defaults():
    c = ModelConfig(family="llama", vocab_size=16, hidden_size=32, n_layers=2, n_heads=4,
                    n_kv_heads=2, intermediate_size=64, max_position_embeddings=128)
    assert (c.head_dim, c.n_kv_heads, c.rope_theta, c.rope_scaling) == (8, 2, 10000.0, None)
    assert c.eos_token_id is None and c.eos_token_ids == () and not c.tie_word_embeddings
    assert ModelConfig(family="gpt2", hidden_size=64, n_heads=4).intermediate_size == 256
    assert ModelConfig(family="qwen2").attention_bias  # Qwen2 always has q/k/v biases
    assert ModelConfig(eos_token_id=5).eos_token_ids == (5,)


def test_llama3_hub_spelling_and_transformers5_spelling_agree():
    hub = ModelConfig.from_hf({**LLAMA, "rope_theta": 500000.0,
                               "rope_scaling": {"rope_type": "llama3", **LLAMA3_SCALING}})
    tf5 = ModelConfig.from_hf({**LLAMA, "rope_parameters": {
        "rope_type": "llama3", "rope_theta": 500000.0, **LLAMA3_SCALING}})
    assert hub == tf5
    assert hub.rope_theta == 500000.0 and hub.rope_scaling == {"rope_type": "llama3",
                                                               **LLAMA3_SCALING}
    assert (hub.n_kv_heads, hub.head_dim, hub.tie_word_embeddings) == (8, 64, True)
    assert (hub.bos_token_id, hub.eos_token_id, hub.eos_token_ids) == (
        128000, 128001, (128001, 128008, 128009))
    # old spelling "type" and "default" rope
    old = ModelConfig.from_hf({**LLAMA, "rope_scaling": {"type": "linear", "factor": 2.0}})
    assert old.rope_scaling == {"rope_type": "linear", "factor": 2.0}
    plain = ModelConfig.from_hf({**LLAMA, "rope_parameters": {"rope_type": "default",
                                                               "rope_theta": 1e6}})
    assert plain.rope_scaling is None and plain.rope_theta == 1e6


def test_llama3_frequencies():
    c = ModelConfig.from_hf({**LLAMA, "rope_theta": 500000.0,
                             "rope_scaling": {"rope_type": "llama3", **LLAMA3_SCALING}})
    base = ModelConfig.from_hf({**LLAMA, "rope_theta": 500000.0})
    inv, inv0 = rope_inv_freq(c), rope_inv_freq(base)
    wavelen = 2 * np.pi / inv0
    high = wavelen < 8192 / 4  # short wavelengths: unchanged
    low = wavelen > 8192 / 1  # long wavelengths: divided by the factor
    np.testing.assert_allclose(inv[high], inv0[high])
    np.testing.assert_allclose(inv[low], inv0[low] / 32)
    mid = ~high & ~low
    assert mid.any() and np.all(inv[mid] < inv0[mid]) and np.all(inv[mid] > inv0[mid] / 32)


def test_families():
    qwen = ModelConfig.from_hf({
        "model_type": "qwen2", "vocab_size": 151936, "hidden_size": 896, "num_hidden_layers": 24,
        "num_attention_heads": 14, "num_key_value_heads": 2, "intermediate_size": 4864,
        "max_position_embeddings": 32768, "rope_theta": 1000000.0, "rms_norm_eps": 1e-6,
        "sliding_window": 32768, "use_sliding_window": False, "tie_word_embeddings": True})
    assert (qwen.family, qwen.head_dim, qwen.attention_bias, qwen.sliding_window) == (
        "qwen2", 64, True, None)
    mistral = ModelConfig.from_hf({
        "architectures": ["MistralForCausalLM"], "vocab_size": 32000, "hidden_size": 4096,
        "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
        "intermediate_size": 14336, "max_position_embeddings": 32768, "sliding_window": 4096})
    assert (mistral.family, mistral.sliding_window, mistral.n_kv_heads) == ("mistral", 4096, 8)
    gpt2 = ModelConfig.from_hf({"model_type": "gpt2", "vocab_size": 50257, "n_embd": 768,
                                "n_layer": 12, "n_head": 12, "n_positions": 1024,
                                "n_inner": None, "bos_token_id": 50256, "eos_token_id": 50256})
    assert (gpt2.family, gpt2.intermediate_size, gpt2.head_dim, gpt2.tie_word_embeddings) == (
        "gpt2", 3072, 64, True)


@pytest.mark.parametrize("family", ["llama", "qwen2", "mistral", "gpt2"])
def test_to_hf_round_trip(family):
    c = ModelConfig(family=family, vocab_size=40, hidden_size=32, n_layers=2, n_heads=4,
                    n_kv_heads=4 if family == "gpt2" else 2, intermediate_size=48,
                    max_position_embeddings=64, sliding_window=8 if family == "mistral" else None,
                    rope_scaling=None if family == "gpt2" else {"rope_type": "linear",
                                                                 "factor": 2.0},
                    eos_token_ids=(3, 4))
    assert ModelConfig.from_hf(json.loads(json.dumps(c.to_hf()))) == c


@pytest.mark.parametrize("change, message", [
    ({"model_type": "falcon"},
     "'falcon'.*supported families: llama, qwen2, qwen3, mistral, gpt2"),
    ({"hidden_size": None}, "field 'hidden_size' should be int"),
    ({"num_hidden_layers": "16"}, "field 'num_hidden_layers' should be int"),
    ({"hidden_act": "gelu"}, "field 'hidden_act' is 'gelu'"),
    ({"mlp_bias": "true"}, "field 'mlp_bias' should be true or false"),
    ({"num_key_value_heads": 7}, "n_heads 32 must be a multiple of n_kv_heads 7"),
    ({"rope_scaling": {"rope_type": "dynamic", "factor": 4.0}},
     "'rope_scaling': rope_type 'dynamic' is not supported; expected one of default, linear, "
     "llama3, yarn"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 0}}, "rope_scaling'.factor: expected a"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4, "beta_fast": -1}},
     "rope_scaling'.beta_fast: expected a non-negative"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4, "truncate": 1}},
     "rope_scaling'.truncate: expected true or false"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4}, "rope_theta": 1},
     "YaRN divides by log\\(rope_theta\\)"),
    ({"rope_parameters": {"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0}},
     "rope_parameters'.low_freq_factor: expected a positive number"),
    ({"rope_theta": -1}, "field 'rope_theta': expected a positive finite number, got -1"),
    ({"eos_token_id": "</s>"}, "field 'eos_token_id': expected a token id"),
])
def test_bad_fields(change, message):
    with pytest.raises(MinispecError, match=message):
        ModelConfig.from_hf({**LLAMA, **change}, "x/config.json")


def test_missing_field_and_other_families_errors():
    hf = dict(LLAMA)
    del hf["intermediate_size"]
    with pytest.raises(MinispecError, match="x/config.json: field 'intermediate_size' is missing"):
        ModelConfig.from_hf(hf, "x/config.json")
    with pytest.raises(MinispecError, match="activation_function"):
        ModelConfig.from_hf({"model_type": "gpt2", "vocab_size": 10, "activation_function": "relu"})
    with pytest.raises(MinispecError, match="scale_attn_weights' must be True"):
        ModelConfig.from_hf({"model_type": "gpt2", "vocab_size": 10, "scale_attn_weights": False})
    with pytest.raises(MinispecError, match="ModelConfig.family"):
        ModelConfig(family="bert")
    with pytest.raises(MinispecError, match="ModelConfig.vocab_size: expected a positive"):
        ModelConfig(vocab_size=0)


def test_read_config_files(tmp_path):
    with pytest.raises(MinispecError, match="config.json: file not found"):
        read_config(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(MinispecError, match="config.json: not valid JSON"):
        read_config(tmp_path)
    (tmp_path / "config.json").write_text("[]")
    with pytest.raises(MinispecError, match="expected a JSON object"):
        read_config(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(LLAMA))
    assert read_config(tmp_path).n_layers == 16


def test_boolean_fields_must_be_json_booleans(tmp_path):
    import json

    from minispec.config import read_config

    for value in ("false", 0, 1, [], "true"):
        (tmp_path / "config.json").write_text(json.dumps({
            "model_type": "llama", "vocab_size": 32, "hidden_size": 16, "num_hidden_layers": 1,
            "num_attention_heads": 2, "intermediate_size": 32, "max_position_embeddings": 16,
            "tie_word_embeddings": value}))
        with pytest.raises(MinispecError, match="tie_word_embeddings' should be true or false"):
            read_config(tmp_path / "config.json")


def test_large_integers_are_bounded_by_their_text_not_30_digits(tmp_path):
    from minispec.config import MAX_INT_DIGITS, read_json

    p = tmp_path / "tokenizer_config.json"
    # what transformers writes when a model has no fixed length: int(1e30), 31 digits
    p.write_text('{"model_max_length": 1000000000000000019884624838656}')
    assert read_json(p) == {"model_max_length": 10**30 + 19884624838656}
    p.write_text('{"n": -%s}' % ("9" * MAX_INT_DIGITS))
    assert read_json(p)["n"] == -(10**MAX_INT_DIGITS - 1)
    p.write_text('{"n": %s}' % ("9" * (MAX_INT_DIGITS + 1)))  # int() of it could get slow
    with pytest.raises(MinispecError, match=f"not valid JSON.*at most {MAX_INT_DIGITS}"):
        read_json(p)
    p.write_text('{"temperature": NaN}')
    with pytest.raises(MinispecError, match="NaN is not a JSON number"):
        read_json(p)
    assert np.isnan(read_json(p, allow_nan=True)["temperature"])


@pytest.mark.parametrize("act", ["gelu_new", "gelu_fast", "gelu_pytorch_tanh",
                                 "gelu_python_tanh", "gelu_accurate"])
def test_every_spelling_of_the_tanh_gelu_is_gpt2s(act):
    c = ModelConfig.from_hf({"model_type": "gpt2", "vocab_size": 10, "activation_function": act})
    assert c.family == "gpt2"


def test_a_different_activation_is_refused_naming_every_accepted_spelling():
    # exact (erf) GELU and quick_gelu are other functions: refused
    for act in ("gelu", "gelu_python", "quick_gelu", "relu"):
        with pytest.raises(MinispecError, match="'gelu_new', 'gelu_fast', 'gelu_pytorch_tanh', "
                                                "'gelu_python_tanh', 'gelu_accurate'"):
            ModelConfig.from_hf({"model_type": "gpt2", "vocab_size": 10,
                                 "activation_function": act})
    assert ModelConfig.from_hf({**LLAMA, "hidden_act": "swish"}).family == "llama"
    with pytest.raises(MinispecError, match="hidden_act' is 'gelu'.*'silu', 'swish'"):
        ModelConfig.from_hf({**LLAMA, "hidden_act": "gelu"})


def test_activation_spellings_match_transformers():
    """Each accepted spelling computes, in transformers, the function minispec computes."""
    torch = pytest.importorskip("torch", reason="needs torch to run transformers' activations")
    acts = pytest.importorskip("transformers.activations",
                               reason="needs transformers to compare activations")
    from minispec.config import GELU_TANH_NAMES, SILU_NAMES
    from minispec.core.model import gelu_new

    x = np.linspace(-8, 8, 401, dtype=np.float64)
    for names, ours in ((GELU_TANH_NAMES, gelu_new(np, x)), (SILU_NAMES, x / (1 + np.exp(-x)))):
        for name in names:
            theirs = acts.ACT2FN[name](torch.from_numpy(x)).numpy()
            np.testing.assert_allclose(theirs, ours, rtol=1e-9, atol=1e-9, err_msg=name)


@pytest.mark.parametrize("arch", ["LlamaForSequenceClassification", "LlamaForTokenClassification",
                                  "LlamaForQuestionAnswering", "LlamaModel"])
def test_a_non_causal_lm_head_is_refused(arch):
    with pytest.raises(MinispecError, match=f"x/config.json: field 'architectures' names '{arch}',"
                                            f" which is not a causal language model.*ForCausalLM"):
        ModelConfig.from_hf({**LLAMA, "architectures": [arch]}, "x/config.json")
    with pytest.raises(MinispecError, match="GPT2ForTokenClassification.*LMHeadModel"):
        ModelConfig.from_hf({"model_type": "gpt2", "vocab_size": 10,
                             "architectures": ["GPT2ForTokenClassification"]})
    with pytest.raises(MinispecError, match="'architectures' should be a list of class names"):
        ModelConfig.from_hf({**LLAMA, "architectures": "LlamaForCausalLM"})
    assert ModelConfig.from_hf({**LLAMA, "architectures": ["LlamaForCausalLM"]}).family == "llama"


# ---- numbers too big for a float, named with their file and field ----------------------------

HUGE = 10**400  # a JSON integer: valid JSON, and no float holds it


@pytest.mark.parametrize("change, field", [
    ({"rms_norm_eps": HUGE}, "field 'rms_norm_eps'"),
    ({"rope_theta": HUGE}, "field 'rope_theta'"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": HUGE}},
     "field 'rope_parameters.rope_theta'"),
    ({"rope_scaling": {"rope_type": "llama3", **LLAMA3_SCALING, "factor": HUGE}},
     "field 'rope_scaling'.factor"),
    ({"rope_scaling": {"rope_type": "llama3", **LLAMA3_SCALING,
                       "original_max_position_embeddings": HUGE}},
     "field 'rope_scaling'.original_max_position_embeddings"),
    ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e6, "factor": HUGE}},
     "field 'rope_parameters'.factor"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4, "beta_fast": HUGE}},
     "field 'rope_scaling'.beta_fast"),
])
def test_an_integer_too_big_for_a_float_is_refused_naming_the_file_and_field(tmp_path, change,
                                                                             field):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**LLAMA, **change}))
    with pytest.raises(MinispecError) as e:
        read_config(path)
    assert str(e.value).startswith(f"{path}: {field}") and "too large for a float" in str(e.value)


def test_huge_numbers_elsewhere_and_rope_theta_too_small_for_its_frequencies():
    with pytest.raises(MinispecError, match="field .layer_norm_epsilon.: an integer of 401 digits"):
        ModelConfig.from_hf({"model_type": "gpt2", "vocab_size": 10, "layer_norm_epsilon": HUGE})
    for name in ("norm_eps", "rope_theta"):
        with pytest.raises(MinispecError, match=f"ModelConfig.{name}: .*too large for a float"):
            ModelConfig(**{name: HUGE})
    # 5e-324 is a float, but 1 / 5e-324^(62/64) is not: every angle would be infinite
    with pytest.raises(MinispecError, match="x/config.json: ModelConfig.rope_theta: 5e-324 is so "
                                            "small that its RoPE frequencies overflow"):
        ModelConfig.from_hf({**LLAMA, "rope_theta": 5e-324}, "x/config.json")
    assert ModelConfig.from_hf({**LLAMA, "rope_theta": 1e-300}).rope_theta == 1e-300
    # a float, but not a float32: the norm's float32 statistics would divide by infinity
    with pytest.raises(MinispecError, match="ModelConfig.norm_eps: .*float32 holds"):
        ModelConfig(norm_eps=10**300)
    assert ModelConfig(norm_eps=3e38).norm_eps == 3e38  # big, but a float32


# ---- Qwen3, Granite's MLP biases, GPT-2's layer-scaled attention, YaRN, Qwen's windows ------

QWEN3 = {  # Qwen/Qwen3-0.6B's config.json, the fields minispec reads
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 151936,
    "hidden_size": 1024, "num_hidden_layers": 28, "num_attention_heads": 16,
    "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 3072,
    "max_position_embeddings": 40960, "rms_norm_eps": 1e-6, "rope_theta": 1000000,
    "attention_bias": False, "use_sliding_window": False, "sliding_window": None,
    "max_window_layers": 28, "tie_word_embeddings": True, "bos_token_id": 151643,
    "eos_token_id": 151645}


def test_qwen3_reads_its_head_dim_and_no_biases():
    c = ModelConfig.from_hf(QWEN3)
    assert (c.family, c.head_dim, c.hidden_size // c.n_heads, c.attention_bias) == (
        "qwen3", 128, 64, False)
    assert (c.sliding_window, c.rope_theta, c.tie_word_embeddings) == (None, 1e6, True)
    assert ModelConfig.from_hf({**QWEN3, "attention_bias": True}).attention_bias
    # transformers builds Qwen3 MLPs without biases whatever the file says; Llama's follow mlp_bias
    assert not ModelConfig.from_hf({**QWEN3, "mlp_bias": True}).mlp_bias
    assert ModelConfig.from_hf({**LLAMA, "mlp_bias": True}).mlp_bias
    with pytest.raises(MinispecError, match="ModelConfig.mlp_bias: only llama has it"):
        ModelConfig(family="qwen2", mlp_bias=True)


def test_gpt2_layer_scaled_attention_and_reordered_upcast_are_read():
    gpt2 = {"model_type": "gpt2", "vocab_size": 10, "scale_attn_by_inverse_layer_idx": True,
            "reorder_and_upcast_attn": True}
    assert ModelConfig.from_hf(gpt2).scale_attn_by_inverse_layer_idx
    with pytest.raises(MinispecError, match="'reorder_and_upcast_attn' should be true or false"):
        ModelConfig.from_hf({**gpt2, "reorder_and_upcast_attn": "yes"})
    with pytest.raises(MinispecError, match="scale_attn_by_inverse_layer_idx: only gpt2"):
        ModelConfig(family="llama", scale_attn_by_inverse_layer_idx=True)


def test_yarn_both_spellings_and_transformers_defaults():
    yarn_mistral = {  # NousResearch/Yarn-Mistral-7b-128k's rope_scaling (old "type" spelling)
        "factor": 16.0, "finetuned": True, "original_max_position_embeddings": 8192,
        "type": "yarn"}
    c = ModelConfig.from_hf({**LLAMA, "rope_theta": 1e4, "rope_scaling": yarn_mistral})
    assert c.rope_scaling == {"rope_type": "yarn", "factor": 16.0,
                              "original_max_position_embeddings": 8192}
    tf5 = ModelConfig.from_hf({**LLAMA, "rope_parameters": {
        "rope_type": "yarn", "rope_theta": 1e4, "factor": 16.0,
        "original_max_position_embeddings": 8192}})
    assert tf5 == c
    # no original length: transformers takes max_position_embeddings
    c = ModelConfig.from_hf({**LLAMA, "rope_scaling": {"rope_type": "yarn", "factor": 4,
                                                       "beta_fast": None, "mscale": 0.7}})
    assert c.rope_scaling == {"rope_type": "yarn", "factor": 4, "mscale": 0.7,
                              "original_max_position_embeddings": 131072}


@pytest.mark.parametrize("params", [
    {"factor": 16.0, "original_max_position_embeddings": 8192},
    {"factor": 4.0, "original_max_position_embeddings": 2048, "beta_fast": 16, "beta_slow": 2,
     "truncate": False},
    {"factor": 40.0, "original_max_position_embeddings": 4096, "mscale": 1.0,
     "mscale_all_dim": 0.707},
    {"factor": 8.0, "original_max_position_embeddings": 1000, "attention_factor": 0.9},
    {"factor": 0.5, "original_max_position_embeddings": 64},
])
def test_yarn_frequencies_and_attention_factor_are_transformers(params):
    transformers = pytest.importorskip("transformers", reason="compares with transformers")
    pytest.importorskip("torch", reason="transformers' RoPE code runs on torch")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from minispec.rope_scaling import rope_attention_factor

    rope = {"rope_type": "yarn", "rope_theta": 1e4, **params}
    theirs = transformers.LlamaConfig(hidden_size=512, num_attention_heads=4, head_dim=128,
                                      max_position_embeddings=32768, rope_parameters=dict(rope))
    inv, factor = ROPE_INIT_FUNCTIONS["yarn"](theirs, "cpu")
    ours = ModelConfig.from_hf({**LLAMA, "head_dim": 128, "max_position_embeddings": 32768,
                                "rope_parameters": rope})
    np.testing.assert_allclose(rope_inv_freq(ours), inv.double().numpy(), rtol=1e-6)
    assert rope_attention_factor(ours) == pytest.approx(factor, rel=1e-12)


@pytest.mark.parametrize("family", ["qwen2", "qwen3"])
def test_qwen_sliding_windows_every_layer_or_none_and_a_mix_is_refused(family):
    base = {**QWEN3, "model_type": family, "architectures": None, "num_hidden_layers": 4,
            "sliding_window": 4096}
    assert ModelConfig.from_hf(base).sliding_window is None  # use_sliding_window false
    on = {**base, "use_sliding_window": True}
    assert ModelConfig.from_hf({**on, "max_window_layers": 28}).sliding_window is None  # >= 4
    assert ModelConfig.from_hf({**on, "max_window_layers": 0}).sliding_window == 4096
    assert ModelConfig.from_hf({**on, "sliding_window": None}).sliding_window is None
    every = {**on, "layer_types": ["sliding_attention"] * 4}
    assert ModelConfig.from_hf(every).sliding_window == 4096
    with pytest.raises(MinispecError, match="x/config.json: fields 'use_sliding_window'.* make 2 "
                                            "of the 4 layers attend within 4096 positions"):
        ModelConfig.from_hf({**on, "max_window_layers": 2}, "x/config.json")
    with pytest.raises(MinispecError, match="make 1 of the 4 layers"):
        ModelConfig.from_hf({**on, "layer_types": ["full_attention"] * 3 + ["sliding_attention"]})
    with pytest.raises(MinispecError, match="field 'layer_types' should list"):
        ModelConfig.from_hf({**on, "layer_types": ["sliding_attention"] * 3})


@pytest.mark.parametrize("case", ["qwen3", "qwen2-window", "qwen3-window", "llama-mlp-bias",
                                  "gpt2-layer-scale", "yarn"])
def test_to_hf_round_trip_of_the_new_fields(case):
    kw = {"vocab_size": 40, "hidden_size": 32, "n_layers": 2, "n_heads": 4,
          "intermediate_size": 48, "max_position_embeddings": 64}
    family, extra = {
        "qwen3": ("qwen3", {"head_dim": 16, "attention_bias": True}),
        "qwen2-window": ("qwen2", {"sliding_window": 8}),
        "qwen3-window": ("qwen3", {"sliding_window": 8}),
        "llama-mlp-bias": ("llama", {"mlp_bias": True}),
        "gpt2-layer-scale": ("gpt2", {"scale_attn_by_inverse_layer_idx": True}),
        "yarn": ("mistral", {"rope_scaling": {"rope_type": "yarn", "factor": 4.0,
                                              "original_max_position_embeddings": 16,
                                              "beta_fast": 8.0, "truncate": False}}),
    }[case]
    c = ModelConfig(family=family, **kw, **extra)
    assert ModelConfig.from_hf(json.loads(json.dumps(c.to_hf()))) == c
