"""Bad input gets MinispecError, every time: 144 cases of the fuzz campaign
(tests/fuzz.py: mutated checkpoints, configs and their numbers, tokenizers, BOS/EOS ids, FIFOs,
generation parameters, verify arguments, each in its own process with a memory cap and a
timeout), and property tests of the public API with hypothesis: generation parameters, verify()'s
arguments, config.json's float fields (an integer no float holds is refused naming the file and
field) and the BOS/EOS ids load() reads (refused at load, naming the file, when outside the
vocabulary)."""

import json
import math
import tempfile
from pathlib import Path

import numpy as np
import pytest
from fuzz import campaign, shared_model  # tests/ is on sys.path (conftest)
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import minispec
from minispec.errors import MinispecError


def test_a_few_hundred_mutated_inputs_end_in_minispec_error_or_a_valid_result():
    # 18 cases of each of the 8 kinds here (the suite's time budget); python tests/fuzz.py runs
    # thousands
    report = campaign(144, seed=7, jobs=2, quiet=True)
    counts = report["counts"]
    assert sum(counts.values()) == 144
    assert counts.get("error", 0) > 60  # the mutations do reach the checks
    for outcome in ("other", "hang", "memory", "crash", "silent"):
        assert counts.get(outcome, 0) == 0, (outcome, report["examples"].get(outcome))
    assert report["peak_rss_mb"]["max"] < 1500


ANY = st.one_of(st.none(), st.booleans(), st.integers(-10**30, 10**30),
                st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=5),
                st.lists(st.integers(-5, 5), max_size=3),
                st.lists(st.lists(st.integers(0, 3), max_size=2), max_size=2))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(temperature=ANY, top_k=ANY, top_p=ANY, gamma=ANY, max_new=ANY, prompt=ANY, eos=ANY)
def test_generation_parameters_are_checked(temperature, top_k, top_p, gamma, max_new, prompt,
                                           eos):
    target = shared_model()
    try:
        out = minispec.speculative_generate(
            target, target, prompt, gamma=gamma, max_new_tokens=max_new,
            temperature=temperature, top_k=top_k, top_p=top_p, eos_token_id=eos, seed=0)
    except MinispecError:
        return
    assert all(isinstance(t, int) and 0 <= t < target.vocab_size for t in out.tokens)


rows = st.integers(1, 6).flatmap(lambda V: st.tuples(
    st.just(V), st.integers(0, 3), st.integers(0, 2**31)))


@settings(max_examples=200, deadline=None)
@given(rows, st.sampled_from(["ok", "nan", "negative", "unnormalized", "token", "rng", "list",
                              "shape"]))
def test_verify_accepts_exactly_valid_arguments(spec, breakage):
    V, g, seed = spec
    r = np.random.default_rng(seed)
    p, q = r.dirichlet(np.ones(V), g + 1), r.dirichlet(np.ones(V), g)
    d = r.integers(0, V, g)
    rng = np.random.default_rng(seed)
    if breakage == "nan":
        p[0, 0] = math.nan
    elif breakage == "negative":
        p[0, 0] = -0.1
    elif breakage == "unnormalized":
        p = p * 1.5
    elif breakage == "token":
        d = np.append(d, V)[1:] if g else np.array([V])
    elif breakage == "rng":
        rng = None
    elif breakage == "list":
        p = p.tolist()
    elif breakage == "shape":
        q = q[:, :-1] if V > 1 else np.ones((g + 1, V))
    if breakage in ("ok", "list"):  # lists of numbers are arrays too
        out = minispec.verify(p, q, d, rng)
        assert out.ndim == 1 and 1 <= len(out) <= g + 1 and 0 <= out.min() and out.max() < V
    else:
        with pytest.raises(MinispecError, match="verify"):
            minispec.verify(p, q, d, rng)


# ---- config.json's numbers: a float, or MinispecError naming the file and the field ------------

NUMBER = st.one_of(st.integers(-10**500, 10**500), st.sampled_from([10**309, 10**400, -(10**400)]),
                   st.floats(allow_nan=False, allow_infinity=False), st.none(), st.booleans(),
                   st.text(max_size=3))
FLOAT_FIELDS = {  # where each number goes, and how the error names it
    "rms_norm_eps": ("rms_norm_eps", "'rms_norm_eps'"),
    "rope_theta": ("rope_theta", "'rope_theta'"),
    "rope_parameters.rope_theta": ("rope_parameters", "'rope_parameters.rope_theta'"),
    "llama3.factor": ("rope_scaling", "'rope_scaling'.factor"),
    "llama3.original_max_position_embeddings": (
        "rope_scaling", "'rope_scaling'.original_max_position_embeddings"),
    "yarn.factor": ("rope_parameters", "'rope_parameters'.factor"),
    "yarn.original_max_position_embeddings": (
        "rope_scaling", "'rope_scaling'.original_max_position_embeddings"),
    "yarn.beta_fast": ("rope_scaling", "'rope_scaling'.beta_fast"),
    "yarn.attention_factor": ("rope_scaling", "'rope_scaling'.attention_factor"),
    "yarn.mscale_all_dim": ("rope_scaling", "'rope_scaling'.mscale_all_dim"),
}
TINY = {"model_type": "llama", "vocab_size": 16, "hidden_size": 16, "num_hidden_layers": 1,
        "num_attention_heads": 2, "intermediate_size": 16, "max_position_embeddings": 64}
SCALING = {"llama3": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                      "original_max_position_embeddings": 16},
           "yarn": {"factor": 4.0, "original_max_position_embeddings": 16, "mscale": 1.0,
                    "mscale_all_dim": 0.8}}


def _config_with(field: str, value) -> dict:
    doc = dict(TINY)
    if field in ("rms_norm_eps", "rope_theta"):
        doc[field] = value
    elif field == "rope_parameters.rope_theta":
        doc["rope_parameters"] = {"rope_type": "default", "rope_theta": value}
    else:
        kind, key = field.split(".")
        scaling = {"rope_type": kind, **SCALING[kind], key: value}
        doc[FLOAT_FIELDS[field][0]] = scaling if FLOAT_FIELDS[field][0] == "rope_scaling" else {
            "rope_theta": 1e4, **scaling}
    return doc


@settings(max_examples=300, deadline=None)
@given(field=st.sampled_from(list(FLOAT_FIELDS)), value=NUMBER)
@example(field="llama3.factor", value=1.1125369292536007e-308)  # finite frequencies, whose
# angles overflow from position 2: once NaN logits, found by this test
@example(field="rms_norm_eps", value=1e300)  # inf in the float32 norm: every hidden state 0
@example(field="llama3.factor", value=5e-324)  # refused, once with NumPy's overflow warnings
@pytest.mark.filterwarnings("error::RuntimeWarning")  # a refusal says it in its own words
def test_config_float_fields_are_a_float_or_refused_naming_file_and_field(field, value):
    from minispec.config import ModelConfig
    from minispec.loader import random_model

    try:
        config = ModelConfig.from_hf(_config_with(field, value), "m/config.json")
    except MinispecError as e:
        message = str(e)
        assert message.startswith("m/config.json: ")
        assert FLOAT_FIELDS[field][1] in message or "ModelConfig." in message, message
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 1.8e308:
            assert "too large for a float" in message  # said so, not an OverflowError
        return
    # accepted: a model of it computes finite logits at every position it allows (or refuses,
    # naming the rope scaling: an attention factor that would overflow the scores, or RoPE
    # frequencies no float holds, as a factor of 5e-324 divides them to infinity)
    try:
        model = random_model(config, seed=0)
    except MinispecError as e:
        message = str(e)
        assert (field.startswith("yarn.") and "attention factor" in message) or (
            "rope_scaling" in message and "RoPE frequencies are not finite" in message), message
        return
    assert np.isfinite(model.logits(list(range(16)) * 4)).all()


# ---- the BOS/EOS ids load() reads: inside the vocabulary, or refused naming their file ---------

IDS = st.one_of(st.integers(-3, 40), st.integers(0, 10**500), st.lists(st.integers(0, 40),
                                                                       max_size=3),
                st.none(), st.booleans(), st.text(max_size=2))


@settings(max_examples=200, deadline=None)
@given(where=st.sampled_from(["config.json", "generation_config.json"]),
       key=st.sampled_from(["bos_token_id", "eos_token_id"]), value=IDS,
       token=st.sampled_from([None, "a", "</s>", "<big>", "nope"]))
def test_special_token_ids_are_checked_against_the_vocabulary_at_load(where, key, value, token):
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import models

    from minispec.config import ModelConfig
    from minispec.loader import _special_tokens
    from minispec.tokenizer import Tokenizer

    vocab = {"[UNK]": 0, "a": 1, "</s>": 2, "<big>": 30}  # <big>: a token past the 20 model rows
    tok = Tokenizer(HFTokenizer(models.WordLevel(vocab, unk_token="[UNK]")))
    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        doc = {**TINY, "vocab_size": 20, "bos_token_id": 1, "eos_token_id": 2}
        if where == "config.json":
            doc[key] = value
        else:
            (d / where).write_text(json.dumps({key: value}))
        (d / "tokenizer_config.json").write_text(json.dumps({"eos_token": token}))
        try:
            config = ModelConfig.from_hf(doc, str(d / "config.json"))
            out = _special_tokens(config, d, tok)
        except MinispecError as e:
            assert str(e).startswith(str(d)), e  # names the file the id came from
            return
    ids = [out.bos_token_id, out.eos_token_id, *out.eos_token_ids, tok.bos_id, tok.eos_id]
    assert all(i is None or 0 <= i < 20 for i in ids), ids
