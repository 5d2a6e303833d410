"""--html (minispec/html_trace.py): the recorded uniforms are the ones verify drew, so each
verdict on the page is the real one; the generation is unchanged; the page is written."""

import numpy as np
from conftest import tiny_config

import minispec
from minispec.html_trace import TracedVerify, page
from minispec.loader import random_model

TARGET = random_model(tiny_config(), seed=0, scale=0.5)
DRAFT = random_model(tiny_config(n_layers=1), seed=0, scale=0.4)


def test_the_traced_verify_records_the_uniforms_verify_used():
    rng = np.random.default_rng(0)
    traced = TracedVerify()
    for trial in range(200):
        V, g = int(rng.integers(2, 6)), int(rng.integers(0, 5))
        p, q = rng.dirichlet(np.ones(V), g + 1), rng.dirichlet(np.ones(V), g)
        drafts = np.array([rng.choice(V, p=row) for row in q], dtype=np.int64)
        plain = minispec.verify(p, q, drafts, np.random.default_rng(trial))
        out = traced(p, q, drafts, np.random.default_rng(trial))
        assert out.tolist() == plain.tolist()  # the same step, the same draws
        call = traced.calls[-1]
        kept = [s["kept"] for s in call["steps"]]
        assert sum(kept) == len(out) - 1 and kept == sorted(kept, reverse=True)
        assert call["rejected"] == (len(out) - 1 < g)
        for s in call["steps"]:  # the verdict is the rule applied to the recorded r
            assert s["kept"] == (s["r"] * s["q"] < s["p"])
        assert call["final"] == out[-1] and call["final_prob"] > 0


def test_a_generation_traced_is_the_same_generation_and_its_page_is_written(tmp_path):
    kw = {"gamma": 3, "max_new_tokens": 20, "temperature": 1.0, "seed": 5}
    plain = minispec.speculative_generate(TARGET, DRAFT, [3, 17, 5], **kw)
    traced = TracedVerify()
    out = minispec.speculative_generate(TARGET, DRAFT, [3, 17, 5], verify=traced, **kw)
    assert out.tokens == plain.tokens and len(traced.calls) == out.stats.target_calls
    html = page("x", out, traced, lambda ids: " ".join(map(str, ids)), "a title")
    assert html.count("<section>") == out.stats.target_calls
    assert f"<b>{out.stats.new_tokens}</b> tokens" in html and "a title" in html
