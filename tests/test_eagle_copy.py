"""EAGLE's chain with prompt lookup inside it (`copy`, minispec/drafters/eagle.py): once a drawn
draft is the token a lookup of the context proposes, the rest of the chain is copied with one-hot
q. Each draft equals the rule recomputed by a plain search; greedy output stays the target's, one
sequence or a batch; sampled output keeps the target's law, and the same test rejects copied
tokens reported with the head's q; bad values are named."""

import numpy as np
import pytest
from conftest import lookup_by_search, tiny_config
from drafters_for_tests import Wrapping
from stats_helpers import sample_joint

import minispec
from minispec.drafters import PRESETS, random_eagle
from minispec.errors import MinispecError
from minispec.loader import random_model

TARGET = random_model(tiny_config(), seed=0, scale=0.5)
# text that repeats: the target's own greedy continuation of a short prompt (a tiny random model
# soon loops), so lookups find something to copy and the target often agrees with the copy
LOOP = [3, 17, 5] + minispec.autoregressive_generate(TARGET, [3, 17, 5], max_new_tokens=12,
                                                     temperature=0.0).tokens
ALPHABET = sorted(set(LOOP))


def _narrow_head(drafter, tokens=ALPHABET):
    """The head proposes only `tokens`, equally: its draws agree with a lookup over text made of
    them often (a random head over 48 ids seldom would)."""
    logits = np.full((1, drafter.vocab_size), -np.inf)
    logits[0, tokens] = 0.0
    drafter.draft_head = lambda g: logits.copy()
    return drafter


def _expected(context, plain, gamma, min_n):
    """The chain the rule drafts, given the chain the head alone drew with the same numbers."""
    tokens = []
    for x in plain:
        text = context + tokens
        src = lookup_by_search(text, min_n)
        tokens.append(x)
        if src is not None and text[src] == x:  # agreement: copy the rest (it may run on)
            full = text + [x]
            for j in range(src + 1, src + 1 + gamma - len(tokens)):
                full.append(full[j])
                tokens.append(full[j])
            return tokens, len(text) - len(context) + 1
    return tokens, None


def _draft(drafter, context, temperature, seed):
    cache = TARGET.new_cache(64)
    drafter.start(context, cache)
    drafter.accept(context, TARGET.hidden_states(context[:-1], cache))
    return drafter.propose(context, 4, minispec.Sampling(temperature).warp,
                           np.random.default_rng(seed))


@pytest.mark.parametrize("min_n", [1, 2])
def test_each_draft_is_the_heads_chain_until_it_agrees_with_a_lookup_then_the_copy(min_n):
    rng = np.random.default_rng(min_n)
    ABC = ALPHABET[:3]  # contexts of 3 tokens, a head proposing them: frequent agreement
    switched = set()
    for trial in range(60):
        context = [int(x) for x in rng.choice(ABC, size=int(rng.integers(4, 12)))]
        plain = _draft(_narrow_head(random_eagle(TARGET, seed=2), ABC), context, 1.0, trial)
        d = _draft(_narrow_head(random_eagle(TARGET, seed=2, copy=min_n), ABC), context, 1.0,
                   trial)
        tokens, drawn = _expected(context, plain.tokens.tolist(), 4, min_n)
        assert d.tokens.tolist() == tokens
        drawn = len(tokens) if drawn is None else drawn
        np.testing.assert_array_equal(d.q[:drawn], plain.q[:drawn])  # the head's rows
        np.testing.assert_array_equal(d.q[drawn:], np.eye(d.q.shape[1])[tokens[drawn:]])
        switched.add(drawn)
    assert {1, 2, 4} <= switched  # copies after the first and a later draft, and none at all


def test_greedy_decoding_with_copies_is_the_targets():
    prompts = (LOOP[:6], [9] * 9, [3, 17, 5])
    differs = 0  # rounds whose drafts the copy changed
    for prompt in prompts:
        base = minispec.autoregressive_generate(TARGET, prompt, max_new_tokens=32,
                                                temperature=0.0)
        for make in (lambda **kw: random_eagle(TARGET, seed=2, scale=0.1, **kw),
                     lambda **kw: _narrow_head(random_eagle(TARGET, seed=2, stop=0.2, **kw))):
            outs = [minispec.speculative_generate(TARGET, make(**kw), prompt, gamma=4,
                                                  max_new_tokens=32, temperature=0.0)
                    for kw in ({}, {"copy": 1})]
            assert outs[1].tokens == base.tokens
            differs += sum(a.drafted != b.drafted for a, b in zip(*[o.stats.rounds for o in outs]))
    assert differs
    batch = minispec.generate_batch(TARGET, random_eagle(TARGET, seed=2, scale=0.1, copy=1),
                                    list(prompts), gamma=4, max_new_tokens=32, temperature=0.0)
    assert [r.tokens for r in batch] == [
        minispec.autoregressive_generate(TARGET, p, max_new_tokens=32, temperature=0.0).tokens
        for p in prompts]


# for the law test: a prompt of three tokens the target often ranks in its top 2 and a head
# proposing those three, so the first draft is often kept, often agrees with a lookup, and the
# copied tokens after it are verified (found by a search over such prompts for the control's
# power: most prompts rarely get that far within 5 tokens)
ABC, PROMPT = [16, 41, 1], [1, 1, 16, 41, 41, 41, 1, 41]


class CopiesWithTheHeadsQ(Wrapping):
    """A planted bug, the control: the same drafts, but each copied token reported with the
    head's q row (what it would have been drawn from) instead of one-hot."""

    name = "copy-with-head-q"

    def __init__(self):
        super().__init__(_narrow_head(random_eagle(TARGET, seed=2, copy=1), ABC))

    def propose(self, context, gamma, warp, rng):
        d = self.inner.propose(context, gamma, warp, rng)
        head = warp(self.inner.draft_head(None))[0]
        q = [head if row.max() == 1.0 and i else row for i, row in enumerate(d.q)]
        return minispec.Draft(d.tokens, np.array(q).reshape(d.q.shape))


def test_sampling_with_copies_follows_the_target_and_the_test_rejects_the_heads_q():
    # the exact law of the next 5 tokens (top-k 2) against 3,000 generations each
    drafter = _narrow_head(random_eagle(TARGET, seed=2, copy=1), ABC)
    row = sample_joint(TARGET, drafter, 3000, top_k=2, L=5, prompt=PROMPT, gamma=4)[0]
    assert row.fit.pvalue > 1e-4, row.fit
    control = sample_joint(TARGET, CopiesWithTheHeadsQ(), 3000, top_k=2, L=5, prompt=PROMPT,
                           gamma=4)[0]
    assert control.fit.pvalue < 1e-6, control.fit


def test_the_preset_and_bad_values():
    assert PRESETS["eagle-copy"][1]["copy"] >= 1
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(MinispecError, match="copy must be an integer >= 1"):
            random_eagle(TARGET, copy=bad)
    with pytest.raises(MinispecError, match="is for a chain"):
        random_eagle(TARGET, copy=2, shape=(2, 1))


def test_the_shipped_head_copies_through_make_drafter_and_the_command_line(capsys):
    from minispec.cli import main
    from minispec.drafters import make_drafter
    from minispec.loader import load
    from minispec.shipped import SHIPPED

    assert make_drafter("eagle", load(SHIPPED / "target", device="cpu"), copy=2).copy == 2
    argv = ["--prompt", "def f(x):\n    return x\n\n\ndef g(x):\n", "--max-new-tokens", "16",
            "--no-color", "--drafter", "eagle"]
    assert main([*argv, "--copy", "2", "--compare"]) == 0
    assert "outputs identical" in capsys.readouterr().out
    for bad in (["--copy", "0"], ["--tree", "2,1", "--copy", "2"],
                ["--drafter", "ngram", "--copy", "2"]):
        assert main([*argv, *bad]) != 0
        assert "--copy: an integer >= 1 for the eagle drafter's chain" in capsys.readouterr().err
