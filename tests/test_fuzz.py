"""Bad input gets MinispecError, every time: 140 cases of the fuzz campaign
(tests/fuzz.py: mutated checkpoints, configs, tokenizers, FIFOs, generation parameters, verify
arguments, each in its own process with a memory cap and a timeout), and property tests of the
public API with hypothesis."""

import math

import numpy as np
import pytest
from fuzz import campaign, shared_model  # tests/ is on sys.path (conftest)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import minispec
from minispec.errors import MinispecError


def test_a_few_hundred_mutated_inputs_end_in_minispec_error_or_a_valid_result():
    # 20 cases of each of the 7 kinds here (the suite's time budget); python tests/fuzz.py runs
    # thousands
    report = campaign(140, seed=7, jobs=2, quiet=True)
    counts = report["counts"]
    assert sum(counts.values()) == 140
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
