"""Tests for the drafters beyond a second model (minispec/drafters/) and gamma="auto".

The n-gram lookup on its own, then every drafter inside the loop on tiny random models: greedy
output token for token against autoregressive decoding, sampled output against the target's
exact distribution (chi-square), and the early-exit drafter's shared KV cache against a recompute.
"""

import functools
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import binomtest, chisquare
from stats_helpers import pooled_chisquare

from minispec.backend import to_host
from minispec.config import ModelConfig
from minispec.core.model import Model
from minispec.core.sampling import warp
from minispec.core.speculative import (
    AUTO_GAMMA_MAX,
    AUTO_GAMMA_START,
    autoregressive_generate,
    next_gamma,
    speculative_generate,
    verify,
)
from minispec.drafters import (
    Draft,
    EarlyExitDrafter,
    ModelDrafter,
    NgramDrafter,
    default_exit_layer,
    find_ngram,
    make_drafter,
)
from minispec.errors import MinispecError
from minispec.loader import load, random_model

V = 48
CONFIG = {
    "family": "llama",
    "vocab_size": V,
    "hidden_size": 32,
    "n_layers": 4,
    "n_heads": 4,
    "n_kv_heads": 2,
    "intermediate_size": 64,
    "max_position_embeddings": 96,
}
GREEDY = {"temperature": 0.0}
TARGET = random_model(ModelConfig(**CONFIG), seed=0, scale=0.5)
DRAFT = random_model(ModelConfig(**{**CONFIG, "n_layers": 1}), seed=1, scale=0.5)
DRAFT_2L = random_model(ModelConfig(**{**CONFIG, "n_layers": 2}), seed=1, scale=0.5)
rng = np.random.default_rng(0)
PROMPTS = {
    # every token distinct: the n-gram drafter finds nothing to copy in the first round
    "distinct": [rng.permutation(V)[:n].tolist() for n in (1, 2, 5, 12)],
    "random": [rng.integers(0, V, size=n).tolist() for n in (3, 8, 20)],
    "repetitive": [[7] * 6, [3, 9, 4] * 5, [1, 2, 3, 4, 5, 6] * 3 + [1, 2]],
}
ALL_PROMPTS = [p for ps in PROMPTS.values() for p in ps]
REPO = Path(__file__).resolve().parents[1]


def ids(a):
    return np.asarray(a, dtype=np.int64)


# ---- the n-gram lookup ----------------------------------------------------------------------


def test_lookup_takes_the_most_recent_match():
    # "1 2" occurs at 0 and at 4; the later one (followed by 8) wins
    assert find_ngram(ids([1, 2, 7, 0, 1, 2, 8, 5, 1, 2]), max_n=2) == 6


def test_lookup_prefers_the_longest_suffix():
    # the 1-gram "3" last occurred at 6 (followed by 4); the 3-gram "1 2 3" at 0..2 (then 9)
    ctx = ids([1, 2, 3, 9, 5, 5, 3, 4, 1, 2, 3])
    assert find_ngram(ctx, max_n=3) == 3
    assert find_ngram(ctx, max_n=1) == 7
    assert find_ngram(ctx, max_n=2) == 3  # "2 3" occurs only at 1..2 as well


def test_lookup_falls_back_to_shorter_suffixes_and_to_nothing():
    assert find_ngram(ids([5, 6, 1, 7, 8, 6]), max_n=3) == 2  # only "6" recurs
    assert find_ngram(ids([5, 6, 1, 7, 8, 9]), max_n=3) == -1  # nothing recurs
    assert find_ngram(ids([5]), max_n=3) == -1  # no earlier token at all
    assert find_ngram(ids([5, 5]), max_n=3) == 1


def test_lookup_allows_overlap_with_the_suffix():
    assert find_ngram(ids([4, 4, 4]), max_n=3) == 2  # "4 4" at 0..1 overlaps the suffix 1..2
    assert find_ngram(ids([9, 1, 2, 1, 2]), max_n=3) == 3  # "1 2" at 1..2, then "1 2 ..." again


def propose(drafter, context, gamma):
    draft = drafter.propose(context, gamma, None, None)
    return draft.tokens, draft.q


def ngram(vocab_size, **kw):
    """An n-gram drafter for a target of `vocab_size` tokens."""
    target = random_model(ModelConfig(vocab_size=vocab_size, hidden_size=8, n_layers=1,
                                      n_heads=2, intermediate_size=8, max_position_embeddings=32))
    return NgramDrafter(target, **kw)


def test_ngram_drafter_copies_what_followed_with_one_hot_q():
    d = ngram(12)
    drafts, q = propose(d, [1, 2, 3, 4, 5, 1, 2], 3)
    assert drafts.tolist() == [3, 4, 5]
    assert q.shape == (3, 12) and np.array_equal(q, np.eye(12)[[3, 4, 5]])
    drafts, _ = propose(d, [1, 2, 3, 4, 5, 1, 2], 8)  # the copy runs on into its own output
    assert drafts.tolist() == [3, 4, 5, 1, 2, 3, 4, 5]
    drafts, _ = propose(d, [0, 7, 7, 7], 5)
    assert drafts.tolist() == [7] * 5
    assert d.calls == 0


def test_ngram_drafter_without_a_match_drafts_nothing():
    drafts, q = propose(ngram(12), [1, 2, 3, 4], 4)
    assert drafts.shape == (0,) and q.shape == (0, 12)


def test_ngram_drafter_stops_at_ids_outside_its_vocabulary():
    drafts, q = propose(ngram(10), [1, 2, 4, 11, 5, 1, 2], 4)
    assert drafts.tolist() == [4] and q.shape == (1, 10)


@pytest.mark.parametrize("max_n", [0, 1.5, True])
def test_ngram_drafter_rejects_bad_parameters(max_n):
    with pytest.raises(MinispecError, match="max_n"):
        ngram(8, max_n=max_n)


def test_one_hot_q_accepts_with_p_of_the_draft_and_resamples_p_without_it():
    """What verify() does with an n-gram draft: accept x w.p. p(x), else sample p minus x."""
    p = np.array([[0.1, 0.4, 0.3, 0.2], [0.25, 0.25, 0.25, 0.25]])
    q = np.eye(4)[[2]]
    gen = np.random.default_rng(1)
    out = [verify(p, q, ids([2]), gen) for _ in range(4000)]
    accepted = sum(len(o) == 2 for o in out)
    assert binomtest(accepted, len(out), 0.3).pvalue > 1e-3
    corrections = np.array([o[0] for o in out if len(o) == 1])
    assert not (corrections == 2).any()
    counts = np.bincount(corrections, minlength=4)[[0, 1, 3]]
    assert chisquare(counts, len(corrections) * np.array([0.1, 0.4, 0.2]) / 0.7).pvalue > 1e-3


# ---- every drafter in the loop, greedy --------------------------------------------------------


def drafters():
    return {
        "model": ModelDrafter(TARGET, DRAFT),
        "ngram": NgramDrafter(TARGET),
        "early-exit k=1": EarlyExitDrafter(TARGET, 1),
        "early-exit k=3": EarlyExitDrafter(TARGET, 3),
    }


@functools.cache
def greedy_reference(prompt):
    return autoregressive_generate(TARGET, list(prompt), max_new_tokens=24, **GREEDY)


@pytest.mark.parametrize("name", list(drafters()))
@pytest.mark.parametrize("gamma", [1, 3, 8, "auto"])
def test_greedy_output_is_the_targets_for_every_drafter(name, gamma):
    drafter = drafters()[name]
    for prompt in ALL_PROMPTS:
        ar = greedy_reference(tuple(prompt))
        sd = speculative_generate(TARGET, drafter, prompt, gamma=gamma, max_new_tokens=24, **GREEDY)
        assert sd.tokens == ar.tokens, (name, gamma, prompt)
        st = sd.stats
        assert st.drafter == name.split()[0] and st.gamma == gamma
        assert [t for r in st.rounds for t in r.emitted] == sd.tokens
        assert all(len(r.drafted) <= r.gamma for r in st.rounds)
        assert st.drafted == sum(len(r.drafted) for r in st.rounds)


def test_ngram_drafts_nothing_without_repetition_and_much_with_it():
    d = NgramDrafter(TARGET)
    for prompt in PROMPTS["distinct"]:
        sd = speculative_generate(TARGET, d, prompt, gamma=4, max_new_tokens=2, **GREEDY)
        assert sd.stats.rounds[0].drafted == []
    for prompt in PROMPTS["repetitive"]:
        sd = speculative_generate(TARGET, d, prompt, gamma=4, max_new_tokens=8, **GREEDY)
        assert len(sd.stats.rounds[0].drafted) == 4


class CountingTarget(Model):
    """A stand-in target that always continues t with t + 1 (mod 8): its text repeats with
    period 8, so once the context holds one period the n-gram drafter predicts it exactly."""

    def __init__(self):
        super().__init__(ModelConfig(**{**CONFIG, "vocab_size": 8}), {}, xp=np, device="cpu",
                         dtype=np.float32, name="counting")

    def hidden_states(self, tokens, cache):
        cache.length += len(tokens)
        return np.asarray(tokens)  # the "hidden state" is the token itself

    def lm_head(self, h):
        return 30.0 * np.eye(8, dtype=np.float32)[(h + 1) % 8]  # [T, V]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_ngram_on_repeating_text_accepts_every_draft(temperature):
    target, prompt = CountingTarget(), list(range(8)) + [0, 1]
    sd = speculative_generate(target, make_drafter("ngram", target), prompt, gamma=4,
                              max_new_tokens=20, temperature=temperature, seed=0)
    assert sd.tokens == [(2 + i) % 8 for i in range(20)]
    assert sd.stats.rounds[0].drafted == [2, 3, 4, 5]
    assert sd.stats.acceptance_rate == 1.0 and sd.stats.tokens_per_target_call == 5.0


# ---- the early-exit drafter's shared cache --------------------------------------------------


class CheckedEarlyExit(EarlyExitDrafter):
    """An EarlyExitDrafter whose every q row and every verify call is checked against a
    recompute without cache (the first k layers for q, the whole target for the logits), and
    which counts the positions each half of the network computes."""

    def __init__(self, target, k):
        super().__init__(target, k)
        self.ids: list[int] = []  # the tokens in the target cache, position by position
        self.shallow = self.deep = self.verified = 0

    def run_layers(self, h, caches, starts, sizes, start, stop):
        if start == 0:
            self.shallow += h.shape[0]
        else:
            self.deep += h.shape[0]
        return super().run_layers(h, caches, starts, sizes, start, stop)

    def propose(self, context, gamma, warp_fn, rng):
        draft = super().propose(context, gamma, warp_fn, rng)
        t = self.target
        for i in range(len(draft.tokens)):
            seq = list(context) + draft.tokens[:i].tolist()
            h = t.run_layers(t.embed(seq, 0), None, 0, 0, self.exit_layer)  # no cache
            np.testing.assert_allclose(draft.q[i], warp_fn(t.lm_head(h)[-1]), rtol=1e-4, atol=1e-6)
        return draft

    def target_forward(self, prefix, draft, cache):
        assert len(self.ids) >= cache.length
        del self.ids[cache.length :]  # what the loop's rollback forgot
        tokens = list(prefix) + draft.tokens.tolist()
        self.ids += tokens
        self.verified += len(tokens)
        hidden = super().target_forward(prefix, draft, cache)
        assert cache.length == len(self.ids) - len(draft.tokens)  # the drafts wait after it
        assert hidden.shape[0] == len(tokens)
        reference = self.target.logits(self.ids)[-len(tokens) :]
        # the cached path runs the few-rows kernel, the recompute BLAS: float32 sums in another
        # order, ~1e-4 apart on this random model's logits of magnitude ~10
        np.testing.assert_allclose(to_host(self.target.lm_head(hidden)), reference, rtol=1e-4,
                                   atol=5e-4)
        return hidden


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("k", [1, 2])
def test_early_exit_shares_the_cache_and_computes_each_position_once(temperature, k):
    for prompt in ALL_PROMPTS[::2]:
        d = CheckedEarlyExit(TARGET, k)
        sd = speculative_generate(TARGET, d, prompt, gamma=3, max_new_tokens=20,
                                  temperature=temperature, seed=1)
        if temperature == 0:
            ar = autoregressive_generate(TARGET, prompt, max_new_tokens=20, **GREEDY)
            assert sd.tokens == ar.tokens
        # every position the target verified went through layers 0..k-1 once (while drafting,
        # or in the verify call for the last draft) and through layers k..L-1 once
        assert d.shallow == d.verified == d.deep
        assert d.calls == sd.stats.draft_calls == sd.stats.drafted  # one step per draft


def test_early_exit_drafter_of_another_model_is_refused():
    with pytest.raises(MinispecError, match="early-exit"):
        speculative_generate(TARGET, EarlyExitDrafter(DRAFT_2L, 1), [1, 2], max_new_tokens=4,
                             **GREEDY)


def test_early_exit_target_forward_recomputes_what_was_not_drafted():
    # target_forward is a drop-in target forward: with nothing drafted it computes everything
    d = EarlyExitDrafter(TARGET, 2)
    cache = TARGET.new_cache(32)
    d.start([5], cache)
    seq = [5, 9, 2, 7, 7, 1]
    h1 = d.target_forward(seq[:4], d.empty_draft(), cache)
    h2 = d.target_forward(seq[4:5], Draft(np.array(seq[5:]), np.ones((1, V)) / V), cache)
    assert cache.length == 5  # the context; the draft's keys and values wait after it
    reference = TARGET.logits(seq)
    np.testing.assert_allclose(to_host(TARGET.lm_head(np.vstack([h1, h2]))), reference, rtol=1e-4,
                               atol=1e-4)


def test_model_free_drafters_on_each_device(device):
    """The shared-cache path (embed/run_layers/head on device arrays) and the n-gram lookup
    (host arrays) against autoregressive decoding, on the CPU and, when there is one, the GPU."""
    target = random_model(ModelConfig(**CONFIG), seed=0, scale=0.5, device=device)
    for prompt in PROMPTS["repetitive"][1:] + PROMPTS["random"][1:]:
        ar = autoregressive_generate(target, prompt, max_new_tokens=20, **GREEDY)
        for name in ("ngram", "early-exit"):
            d = make_drafter(name, target, exit_layer=2)
            sd = speculative_generate(target, d, prompt, gamma=3, max_new_tokens=20, **GREEDY)
            assert sd.tokens == ar.tokens, (device, name)
            runs = [speculative_generate(target, d, prompt, gamma="auto", max_new_tokens=12,
                                         temperature=1.0, seed=5).tokens for _ in range(2)]
            assert runs[0] == runs[1]  # seeded: the same tokens


# ---- sampled output: the target's distribution ------------------------------------------------

SMALL = dict(CONFIG, vocab_size=8, hidden_size=16, n_layers=2, n_heads=2, n_kv_heads=1)


@pytest.mark.parametrize("name", ["ngram", "early-exit"])
@pytest.mark.parametrize("warping", [{"temperature": 1.0}, {"temperature": 0.8, "top_k": 5}])
def test_sampled_output_has_the_target_distribution(name, warping):
    target = random_model(ModelConfig(**SMALL), seed=3, scale=0.3)
    prompt = [1, 5, 2, 1, 5]  # "1 5" recurs: the n-gram drafter proposes "2 1 ..." first
    drafter = make_drafter(name, target, exit_layer=1)
    # the exact distribution of the next two tokens, by enumeration with the target alone
    p1 = warp(target.logits(prompt)[-1], **warping)
    joint = np.stack([p1[a] * warp(target.logits(prompt + [a])[-1], **warping) for a in range(8)])
    n = 1000
    counts = np.zeros((8, 8))
    accepted = drafted = 0
    for seed in range(n):
        r = speculative_generate(target, drafter, prompt, gamma=2, max_new_tokens=3, seed=seed,
                                 **warping)
        counts[r.tokens[0], r.tokens[1]] += 1
        accepted, drafted = accepted + r.stats.accepted, drafted + r.stats.drafted
    assert 0.05 < accepted / drafted < 0.95  # both branches of verify() are exercised
    assert pooled_chisquare(counts.ravel(), n * joint.ravel()) > 1e-3


# ---- gamma = "auto" ---------------------------------------------------------------------------


def test_next_gamma_follows_the_schedule_within_its_bounds():
    assert next_gamma(5, 5, 5) == 7  # every draft accepted: +2
    assert next_gamma(5, 5, 4) == 4  # a rejection: -1
    assert next_gamma(5, 3, 3) == 7  # fewer proposed than asked, all accepted
    assert next_gamma(1, 1, 0) == 1  # never below 1
    assert next_gamma(AUTO_GAMMA_MAX - 1, 3, 3) == AUTO_GAMMA_MAX  # capped
    assert next_gamma(AUTO_GAMMA_MAX, 16, 16) == AUTO_GAMMA_MAX
    assert next_gamma(6, 0, 0) == 6  # nothing drafted: nothing learned
    g = AUTO_GAMMA_START
    for depth, accepted in [(1, 1)] * 20 + [(1, 0)] * 30:
        g = next_gamma(g, depth, accepted)
        assert 1 <= g <= AUTO_GAMMA_MAX


@pytest.mark.parametrize("draft", ["same", "other", "ngram"])
def test_auto_gamma_adapts_round_by_round_and_stays_exact(draft):
    drafter = {"same": TARGET, "other": DRAFT, "ngram": NgramDrafter(TARGET)}[draft]
    prompt = PROMPTS["repetitive"][1]
    max_new = 60
    sd = speculative_generate(TARGET, drafter, prompt, gamma="auto", max_new_tokens=max_new,
                              **GREEDY)
    assert sd.tokens == autoregressive_generate(TARGET, prompt, max_new_tokens=max_new,
                                                **GREEDY).tokens
    assert sd.stats.gamma == "auto"
    gamma, done = AUTO_GAMMA_START, 0
    for r in sd.stats.rounds:  # each round asked for what the rule said after the rounds before
        assert r.gamma == min(gamma, max_new - done - 1)
        gamma = next_gamma(gamma, len(r.drafted), r.accepted)
        assert 1 <= gamma <= AUTO_GAMMA_MAX
        done += len(r.emitted)
    asked = [r.gamma for r in sd.stats.rounds]
    if draft == "same":  # the target drafting for itself: every draft accepted, gamma grows
        assert asked[:4] == [5, 7, 9, 11]
    if draft == "other":  # a poor draft: gamma shrinks
        assert min(asked) < AUTO_GAMMA_START


# ---- make_drafter -----------------------------------------------------------------------------


def test_make_drafter_builds_each_drafter():
    assert isinstance(make_drafter("model", TARGET, draft_model=DRAFT), ModelDrafter)
    ngram = make_drafter("ngram", TARGET)
    assert isinstance(ngram, NgramDrafter) and ngram.vocab_size == V
    ee = make_drafter("early-exit", TARGET)
    assert isinstance(ee, EarlyExitDrafter) and ee.exit_layer == default_exit_layer(TARGET) == 1
    assert make_drafter("early-exit", TARGET, exit_layer=3).exit_layer == 3
    assert {d.name for d in (ngram, ee)} == {"ngram", "early-exit"}
    big = random_model(ModelConfig(**{**CONFIG, "n_layers": 12}), seed=0)
    assert make_drafter("early-exit", big).exit_layer == 3


def test_make_drafter_errors_name_what_is_wrong():
    with pytest.raises(MinispecError, match="draft model"):
        make_drafter("model", TARGET)
    with pytest.raises(MinispecError, match=r"drafter: expected one of model \| ngram"):
        make_drafter("lookahead", TARGET)
    # the shipped heads fit the shipped targets, not this one
    with pytest.raises(MinispecError, match="no Medusa heads trained for this target"):
        make_drafter("medusa", TARGET)
    for k in (0, 4, -1, 1.5, True):
        with pytest.raises(MinispecError, match="exit_layer"):
            make_drafter("early-exit", TARGET, exit_layer=k)
    with pytest.raises(MinispecError, match="exit_layer"):  # one layer: nothing to exit early from
        make_drafter("early-exit", DRAFT)
    big_vocab = random_model(ModelConfig(**{**CONFIG, "vocab_size": V + 8}), seed=0)
    with pytest.raises(MinispecError, match="vocab_size"):
        make_drafter("model", TARGET, draft_model=big_vocab)


# ---- the shipped pair -------------------------------------------------------------------------


@pytest.mark.skipif(not (REPO / "weights/target/config.json").exists(),
                    reason="the shipped target (weights/target) is not in this checkout yet")
def test_shipped_target_greedy_with_the_model_free_drafters():
    target = load(REPO / "weights/target", device="cpu")
    for text in ["import os\nimport sys\nimport os\n", "def main(x):\n    return x\n\ndef "]:
        prompt = target.tokenizer.encode(text)
        ar = autoregressive_generate(target, prompt, max_new_tokens=16, **GREEDY)
        for name in ("ngram", "early-exit"):
            sd = speculative_generate(target, make_drafter(name, target), prompt, gamma=3,
                                      max_new_tokens=16, **GREEDY)
            assert sd.tokens == ar.tokens, name
