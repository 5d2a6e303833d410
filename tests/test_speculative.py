"""Tests for minispec/core/speculative.py: the generation loops on tiny models (verify() alone is
tests/test_verify.py's).

ModelDrafter (minispec/core/drafter.py) is tested here too, inside the loop it serves.
"""

from pathlib import Path

import numpy as np
import pytest
from stats_helpers import pooled_chisquare

from minispec.backend import get_backend, to_host
from minispec.config import ModelConfig
from minispec.core.model import Model
from minispec.core.sampling import warp
from minispec.core.speculative import autoregressive_generate, speculative_generate
from minispec.drafters import Draft, Drafter, ModelDrafter
from minispec.errors import MinispecError
from minispec.loader import load, random_model
from minispec.tokenizer import Tokenizer

# ---- the generation loops -------------------------------------------------------------------

V = 48
CONFIG = {
    "family": "llama",
    "vocab_size": V,
    "hidden_size": 32,
    "n_layers": 2,
    "n_heads": 4,
    "n_kv_heads": 2,
    "intermediate_size": 64,
    "max_position_embeddings": 64,
}
GREEDY = {"temperature": 0.0}


def tiny(seed=0, scale=0.5, **overrides):
    """A tiny random Llama; scale 0.5 gives peaky next-token distributions."""
    return random_model(ModelConfig(**{**CONFIG, **overrides}), seed=seed, scale=scale)


def noisy_copy(seed, noise, **overrides):
    """TARGET with noise on the LM head: a draft that agrees with the target often."""
    draft = tiny(seed=0, **overrides)  # TARGET's weights: the same seed
    rng = np.random.default_rng(seed)
    w = draft.weights["lm_head"]
    draft.weights["lm_head"] = w + rng.normal(scale=noise, size=w.shape).astype(w.dtype)
    return draft


TARGET = tiny(seed=0)
UNRELATED = tiny(seed=1, n_layers=1)
CLOSE = noisy_copy(seed=2, noise=0.1)
PROMPTS = [
    np.random.default_rng(i).integers(0, V, size=n).tolist() for i, n in enumerate(range(1, 11))
]
REPO = Path(__file__).resolve().parents[1]


class CheckedModel(Model):
    """A Model whose every forward call is checked against a recompute without cache: the KV
    cache then holds exactly the tokens it should, through every rollback and catch-up."""

    def __init__(self, model):
        super().__init__(model.config, model.weights, xp=model.xp, device=model.device,
                         dtype=model.dtype, tokenizer=model.tokenizer, name=model.name)
        self.ids: list[int] = []  # the tokens in the cache, position by position

    def hidden_states(self, tokens, cache):
        assert len(self.ids) >= cache.length  # the cache holds nothing we did not feed it
        del self.ids[cache.length :]  # what rollback() forgot
        self.ids += [int(t) for t in tokens]
        h = super().hidden_states(tokens, cache)
        reference = self.logits(self.ids)[-len(tokens) :]
        np.testing.assert_allclose(to_host(self.lm_head(h)), reference, rtol=1e-4, atol=1e-4)
        return h


def check_stats(result, max_new_tokens):
    s = result.stats
    assert 1 <= len(result.tokens) <= max_new_tokens
    assert s.new_tokens == len(result.tokens)
    assert [t for r in s.rounds for t in r.emitted] == result.tokens
    assert s.target_calls == len(s.rounds)
    assert s.drafted == sum(len(r.drafted) for r in s.rounds)
    assert s.accepted == sum(r.accepted for r in s.rounds)
    assert s.acceptance_rate == (s.accepted / s.drafted if s.drafted else 0.0)
    assert s.tokens_per_target_call == len(result.tokens) / s.target_calls
    for r in s.rounds:
        assert r.kind == ("bonus" if r.accepted == len(r.drafted) else "correction")
        assert r.emitted == (r.drafted[: r.accepted] + [r.token])[: len(r.emitted)]
    assert s.total_seconds >= s.draft_seconds + s.verify_seconds > 0
    assert s.tokens_per_second > 0
    d = s.as_dict(rounds=True)
    assert d["acceptance_rate"] == s.acceptance_rate and len(d["rounds"]) == len(s.rounds)
    if result.stop_reason == "length":
        assert len(result.tokens) == max_new_tokens
    else:
        assert result.stop_reason == "eos"


@pytest.mark.parametrize("gamma", [1, 2, 4, 8])
@pytest.mark.parametrize("draft", ["same", "unrelated", "close"])
def test_greedy_speculative_equals_greedy_autoregressive(draft, gamma):
    drafter = {"same": TARGET, "unrelated": UNRELATED, "close": CLOSE}[draft]
    accepted = drafted = 0
    for prompt in PROMPTS:
        ar = autoregressive_generate(TARGET, prompt, max_new_tokens=30, **GREEDY)
        sd = speculative_generate(TARGET, drafter, prompt, gamma=gamma, max_new_tokens=30, **GREEDY)
        assert sd.tokens == ar.tokens
        assert sd.stop_reason == ar.stop_reason == "length"
        check_stats(sd, 30)
        accepted, drafted = accepted + sd.stats.accepted, drafted + sd.stats.drafted
        if draft == "same":  # the target drafting for itself: every draft is accepted
            assert sd.stats.acceptance_rate == 1.0
            assert sd.stats.draft_calls == sd.stats.drafted
            assert sd.stats.target_calls == -(-30 // (gamma + 1))
    rate = accepted / drafted
    assert {"same": rate == 1.0, "unrelated": rate < 0.15, "close": 0.2 < rate < 0.95}[draft]


def test_autoregressive_stats():
    r = autoregressive_generate(TARGET, PROMPTS[3], max_new_tokens=12, **GREEDY)
    check_stats(r, 12)
    s = r.stats
    assert (s.drafter, s.gamma, s.drafted, s.draft_calls, s.target_calls) == ("none", 0, 0, 0, 12)
    assert s.tokens_per_target_call == 1.0
    assert all(r.kind == "bonus" and r.drafted == [] for r in s.rounds)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_caches_hold_the_right_tokens_through_rollbacks(temperature):
    # CLOSE accepts some drafts and rejects others: full acceptance (the draft catches up on two
    # tokens), rejection at every position, and the draft cache rolled back each time.
    target, draft = CheckedModel(TARGET), CheckedModel(CLOSE)
    for seed, prompt in enumerate(PROMPTS[:4]):
        r = speculative_generate(
            target, draft, prompt, gamma=4, max_new_tokens=25, temperature=temperature, seed=seed
        )
        check_stats(r, 25)
        counts = {r.accepted for r in r.stats.rounds}
        assert len(counts) > 1  # not all rounds alike


def test_model_drafter_catches_up_and_rolls_back():
    drafter = ModelDrafter(TARGET, CLOSE)
    context = list(PROMPTS[5])
    drafter.start(context, TARGET.new_cache())
    rng = np.random.default_rng(0)

    def warp_fn(logits):
        return warp(logits, 1.0)

    for keep in [4, 0, 2, 4, 1, 3]:  # drafts the "target" keeps, then its own token 7
        draft = drafter.propose(context, 4, warp_fn, rng)
        assert draft.tokens.shape == (4,) and draft.q.shape == (4, V)
        for i in range(4):  # q_i is the draft model's distribution after context + drafts[:i]
            expected = warp(CLOSE.logits(context + draft.tokens[:i].tolist())[-1], 1.0)
            np.testing.assert_allclose(draft.q[i], expected, rtol=1e-4, atol=1e-6)
        context += draft.tokens[:keep].tolist() + [7]
        drafter.accept(context, None)
        assert drafter.cache.length <= len(context) - 1
    assert drafter.calls == 6 * 4


def test_model_drafter_grows_a_small_cache():
    drafter = ModelDrafter(TARGET, CLOSE)
    drafter.cache = CLOSE.new_cache(8)  # start() keeps a cache it already has
    prompt = PROMPTS[6]
    r = speculative_generate(TARGET, drafter, prompt, gamma=4, max_new_tokens=30, **GREEDY)
    assert r.tokens == autoregressive_generate(TARGET, prompt, max_new_tokens=30, **GREEDY).tokens
    assert drafter.cache.max_len > 8


def test_eos_inside_the_drafts_ends_generation_there():
    prompt = PROMPTS[2]
    full = autoregressive_generate(TARGET, prompt, max_new_tokens=30, **GREEDY).tokens
    # with the target as its own draft and gamma 4, rounds emit tokens 0-4, 5-9, ...: token 6 is
    # the second draft of the second round. Take the first position where a token appears.
    i = next(i for i in range(6, 30) if full[i] not in full[:i])
    eos = full[i]
    ar = autoregressive_generate(TARGET, prompt, max_new_tokens=30, eos_token_id=eos, **GREEDY)
    sd = speculative_generate(
        TARGET, TARGET, prompt, gamma=4, max_new_tokens=30, eos_token_id=eos, **GREEDY
    )
    assert ar.tokens == sd.tokens == full[: i + 1]
    assert ar.stop_reason == sd.stop_reason == "eos"
    check_stats(sd, 30)
    last = sd.stats.rounds[-1]
    if i % 5 != 4:  # EOS was a draft: the rest of the round is dropped
        assert len(last.emitted) < len(last.drafted) + 1 and last.emitted[-1] == eos


def test_eos_accepts_several_ids():
    prompt = PROMPTS[2]
    full = autoregressive_generate(TARGET, prompt, max_new_tokens=30, **GREEDY).tokens
    i = next(i for i in range(3, 30) if full[i] not in full[:i])
    r = speculative_generate(
        TARGET, CLOSE, prompt, max_new_tokens=30, eos_token_id=[V - 1, full[i]], **GREEDY
    )
    assert r.tokens[-1] in (V - 1, full[i]) and r.stop_reason == "eos"
    assert r.tokens == full[: len(r.tokens)]


def test_max_new_tokens_one_is_one_target_step():
    for prompt in PROMPTS[:4]:
        ar = autoregressive_generate(TARGET, prompt, max_new_tokens=1, **GREEDY)
        sd = speculative_generate(TARGET, CLOSE, prompt, gamma=4, max_new_tokens=1, **GREEDY)
        assert sd.tokens == ar.tokens and len(sd.tokens) == 1
        assert (sd.stats.target_calls, sd.stats.drafted, sd.stats.draft_calls) == (1, 0, 0)


@pytest.mark.parametrize("max_new_tokens", [2, 3, 5, 9])
def test_gamma_shrinks_to_what_is_left(max_new_tokens):
    prompt = PROMPTS[4]
    ar = autoregressive_generate(TARGET, prompt, max_new_tokens=max_new_tokens, **GREEDY)
    for draft in (TARGET, CLOSE):
        sd = speculative_generate(
            TARGET, draft, prompt, gamma=8, max_new_tokens=max_new_tokens, **GREEDY
        )
        assert sd.tokens == ar.tokens
        done = 0
        for r in sd.stats.rounds:
            assert len(r.drafted) == min(8, max_new_tokens - done - 1)
            done += len(r.emitted)


def test_same_seed_same_output_different_seeds_differ():
    def run(seed, fn=speculative_generate, **kw):
        return fn(TARGET, CLOSE, PROMPTS[7], max_new_tokens=40, temperature=1.0, seed=seed, **kw)

    a, b, c = run(5), run(5), run(6)
    assert a.tokens == b.tokens and a.stats.rounds == b.stats.rounds
    assert a.tokens != c.tokens
    ar = [
        autoregressive_generate(TARGET, PROMPTS[7], max_new_tokens=40, temperature=1.0, seed=s)
        for s in (5, 5, 6)
    ]
    assert ar[0].tokens == ar[1].tokens != ar[2].tokens


def test_context_length_bounds_new_tokens():
    prompt = [i % V for i in range(60)]
    ar = autoregressive_generate(TARGET, prompt, max_new_tokens=100, **GREEDY)
    sd = speculative_generate(TARGET, CLOSE, prompt, gamma=4, max_new_tokens=100, **GREEDY)
    assert len(ar.tokens) == 4 and ar.stop_reason == "length"
    assert sd.tokens == ar.tokens


def test_draft_with_a_shorter_context_drafts_less_near_its_end():
    draft = noisy_copy(seed=2, noise=0.1, max_position_embeddings=20)
    prompt = PROMPTS[9]
    ar = autoregressive_generate(TARGET, prompt, max_new_tokens=40, **GREEDY)
    sd = speculative_generate(TARGET, draft, prompt, gamma=4, max_new_tokens=40, **GREEDY)
    assert sd.tokens == ar.tokens
    assert sd.stats.rounds[-1].drafted == []


class RepeatDrafter(Drafter):
    """A model-free Drafter: proposes the last context token again, with a one-hot q."""

    name = "repeat"

    def propose(self, context, gamma, warp, rng):
        q = np.zeros((gamma, V))
        q[:, context[-1]] = 1.0
        return Draft(np.full(gamma, context[-1], dtype=np.int64), q)


def test_any_drafter_works():
    for prompt in PROMPTS[:5]:
        ar = autoregressive_generate(TARGET, prompt, max_new_tokens=20, **GREEDY)
        sd = speculative_generate(TARGET, RepeatDrafter(TARGET), prompt, max_new_tokens=20,
                                  **GREEDY)
        assert sd.tokens == ar.tokens
        assert sd.stats.drafter == "repeat" and sd.stats.draft_calls == 0


# ---- vocabularies ---------------------------------------------------------------------------


def word_tokenizer(words):
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers.models import WordLevel

    return Tokenizer(
        HFTokenizer(WordLevel({w: i for i, w in enumerate(words)}, unk_token=words[0]))
    )


WORDS = [f"w{i}" for i in range(32)]


def test_padded_target_vocabulary_works():
    # Qwen2.5-like: the target's embedding has 48 rows, the draft's 32, one tokenizer of 32
    target = tiny(seed=0)
    draft = tiny(seed=1, vocab_size=32)
    target.tokenizer, draft.tokenizer = word_tokenizer(WORDS), word_tokenizer(WORDS)
    for prompt in PROMPTS[:4]:
        prompt = [t % 32 for t in prompt]
        ar = autoregressive_generate(target, prompt, max_new_tokens=20, **GREEDY)
        sd = speculative_generate(target, draft, prompt, gamma=3, max_new_tokens=20, **GREEDY)
        assert sd.tokens == ar.tokens
        assert max(ar.tokens) < 32  # ids past the tokenizer are never sampled
        r = speculative_generate(target, draft, prompt, max_new_tokens=20, temperature=1, seed=1)
        assert max(r.tokens) < 32


def test_smaller_draft_vocabulary_without_tokenizers_works():
    draft = tiny(seed=1, vocab_size=32)
    for prompt in PROMPTS[:4]:
        prompt = [t % 32 for t in prompt]
        ar = autoregressive_generate(TARGET, prompt, max_new_tokens=20, **GREEDY)
        sd = speculative_generate(TARGET, draft, prompt, gamma=3, max_new_tokens=20, **GREEDY)
        assert sd.tokens == ar.tokens


def test_different_tokenizers_are_refused():
    target, draft = tiny(seed=0, vocab_size=32), tiny(seed=1, vocab_size=32)
    target.tokenizer, draft.tokenizer = word_tokenizer(WORDS), word_tokenizer(WORDS[::-1])
    with pytest.raises(MinispecError, match="different tokenizers"):
        speculative_generate(target, draft, [1, 2], max_new_tokens=5, **GREEDY)


def test_a_token_added_after_a_first_check_is_seen_by_the_next():
    # the token -> id maps are read once per tokenizer (check_vocabularies): one that grows is
    # read again, so a draft whose tokenizer gained a token the target lacks is refused
    target, draft = tiny(seed=0, vocab_size=33), tiny(seed=1, vocab_size=33)
    target.tokenizer, draft.tokenizer = word_tokenizer(WORDS), word_tokenizer(WORDS)
    sd = speculative_generate(target, draft, [1, 2], gamma=3, max_new_tokens=5, **GREEDY)
    assert sd.tokens == autoregressive_generate(target, [1, 2], max_new_tokens=5, **GREEDY).tokens
    draft.tokenizer.tok.add_tokens(["extra"])
    with pytest.raises(MinispecError, match="different tokenizers"):
        speculative_generate(target, draft, [1, 2], max_new_tokens=5, **GREEDY)
    target.tokenizer.tok.add_tokens(["extra"])  # the same token, the same id 32: one vocabulary
    sd = speculative_generate(target, draft, [1, 2], gamma=3, max_new_tokens=5, **GREEDY)
    assert sd.tokens == autoregressive_generate(target, [1, 2], max_new_tokens=5, **GREEDY).tokens


def test_larger_draft_vocabulary_is_refused():
    with pytest.raises(MinispecError, match="vocab_size"):
        speculative_generate(tiny(vocab_size=32), TARGET, [1, 2], max_new_tokens=5, **GREEDY)


# ---- the sampled output follows the target --------------------------------------------------

SMALL = dict(CONFIG, vocab_size=8, hidden_size=16, n_layers=1, n_heads=2, n_kv_heads=1)


@pytest.mark.parametrize(
    "warping", [{"temperature": 1.0}, {"temperature": 0.7, "top_k": 5, "top_p": 0.9}]
)
def test_sampled_output_has_the_target_distribution(warping):
    target = random_model(ModelConfig(**SMALL), seed=3, scale=0.3)
    draft = random_model(ModelConfig(**SMALL), seed=3, scale=0.3)
    lm_head = draft.weights["lm_head"]
    noise = np.random.default_rng(4).normal(scale=0.3, size=lm_head.shape)
    draft.weights["lm_head"] = lm_head + noise.astype(lm_head.dtype)
    prompt = [1, 5, 2]
    # the exact distribution of the next two tokens, by enumeration with the target alone
    p1 = warp(target.logits(prompt)[-1], **warping)
    joint = np.stack([p1[a] * warp(target.logits(prompt + [a])[-1], **warping) for a in range(8)])
    n = 1000
    counts = np.zeros((8, 8))
    accepted = drafted = 0
    for seed in range(n):  # gamma 2 drafts, then a round of 1 draft if the first emitted 1 token
        r = speculative_generate(
            target, draft, prompt, gamma=2, max_new_tokens=3, seed=seed, **warping
        )
        counts[r.tokens[0], r.tokens[1]] += 1
        accepted, drafted = accepted + r.stats.accepted, drafted + r.stats.drafted
    assert 0.2 < accepted / drafted < 0.9  # the draft is neither perfect nor useless
    assert pooled_chisquare(counts.ravel(), n * joint.ravel()) > 1e-3


# ---- bad parameters -------------------------------------------------------------------------

BAD = [
    ({"temperature": -1.0}, "temperature"),
    ({"top_k": -1}, "top_k"),
    ({"top_p": 0.0}, "top_p"),
    ({"top_p": 1.01}, "top_p"),
    ({"max_new_tokens": 0}, "max_new_tokens"),
    ({"max_new_tokens": 2.5}, "max_new_tokens"),
    ({"prompt_ids": []}, "prompt_ids"),
    ({"prompt_ids": [1, V]}, "prompt_ids"),
    ({"prompt_ids": [-1, 2]}, "prompt_ids"),
    ({"prompt_ids": [[1, 2]]}, "prompt_ids"),
    ({"prompt_ids": [0.5]}, "prompt_ids"),
    ({"prompt_ids": list(range(64))}, "prompt_ids"),  # no room left in the context
    ({"eos_token_id": V}, "eos_token_id"),
    ({"eos_token_id": "x"}, "eos_token_id"),
    ({"eos_token_id": iter([3])}, "eos_token_id"),  # an iterator: refused, never half-consumed
    ({"eos_token_id": [3, -2]}, "eos_token_id"),
    ({"seed": -1}, "seed"),
    ({"seed": 1.5}, "seed"),
    ({"temperature": float("inf")}, "temperature"),
    ({"temperature": 10**400}, "temperature"),  # an int beyond float range
    ({"prompt_ids": [[1], [1, 2]]}, "prompt_ids"),  # ragged
]


def test_extreme_but_valid_parameters_work():
    from fractions import Fraction

    prompt = PROMPTS[4]
    greedy = autoregressive_generate(TARGET, prompt, max_new_tokens=8, **GREEDY).tokens
    for t in (1e-308, 5e-324, Fraction(1, 10**9)):  # tiny temperatures: greedy in the limit
        for fn in (autoregressive_generate, speculative_generate):
            args = (TARGET, CLOSE) if fn is speculative_generate else (TARGET,)
            r = fn(*args, prompt, max_new_tokens=8, temperature=t, seed=0)
            assert r.tokens == greedy
    r = speculative_generate(TARGET, CLOSE, prompt, max_new_tokens=8, temperature=1e300,
                             seed=0, eos_token_id=np.array(5))
    assert len(r.tokens) >= 1 and (r.tokens[-1] == 5) == (r.stop_reason == "eos")


@pytest.mark.parametrize("kwargs, name", BAD)
@pytest.mark.parametrize("speculative", [False, True])
def test_bad_parameters_are_named(kwargs, name, speculative):
    args = {"prompt_ids": [1, 2, 3], "max_new_tokens": 5, "temperature": 1.0, **kwargs}
    with pytest.raises(MinispecError, match=name):
        if speculative:
            speculative_generate(TARGET, CLOSE, **args)
        else:
            autoregressive_generate(TARGET, **args)


@pytest.mark.parametrize("gamma", [0, -2, 1.5, True, "4", "fast", np.array([4, 5]), None])
def test_bad_gamma_is_named(gamma):
    with pytest.raises(MinispecError, match="gamma"):
        speculative_generate(TARGET, CLOSE, [1, 2], gamma=gamma, max_new_tokens=5, **GREEDY)


def test_bad_drafter_is_named():
    with pytest.raises(MinispecError, match="drafter"):
        speculative_generate(TARGET, "draft", [1, 2], max_new_tokens=5, **GREEDY)


# ---- the shipped pair -----------------------------------------------------------------------


@pytest.mark.skipif(
    not (REPO / "weights/target/config.json").exists()
    or not (REPO / "weights/draft/config.json").exists(),
    reason="the shipped pair (weights/target, weights/draft) is not in this checkout yet",
)
def test_shipped_pair_greedy_speculative_equals_autoregressive():
    target = load(REPO / "weights/target", device="cpu")
    draft = load(REPO / "weights/draft", device="cpu")
    texts = ["import os\n", "def main(", "class Foo:\n    def __init__(self"]
    for text in texts:
        prompt = target.tokenizer.encode(text)
        ar = autoregressive_generate(target, prompt, max_new_tokens=24, **GREEDY)
        for gamma in (1, 4):
            sd = speculative_generate(
                target, draft, prompt, gamma=gamma, max_new_tokens=24, **GREEDY
            )
            assert sd.tokens == ar.tokens
            assert sd.stats.acceptance_rate > 0


@pytest.mark.gpu
def test_greedy_speculative_equals_autoregressive_on_the_gpu():
    try:
        get_backend("gpu")
    except MinispecError:
        pytest.skip("CuPy/NVIDIA GPU not available")
    target = random_model(ModelConfig(**CONFIG), seed=0, scale=0.5, device="gpu")
    draft = random_model(ModelConfig(**CONFIG), seed=1, scale=0.5, device="gpu")
    for prompt in PROMPTS[:4]:
        ar = autoregressive_generate(target, prompt, max_new_tokens=20, **GREEDY)
        for drafter in (target, draft):
            sd = speculative_generate(target, drafter, prompt, gamma=3, max_new_tokens=20, **GREEDY)
            assert sd.tokens == ar.tokens
    a, b = (
        speculative_generate(target, draft, PROMPTS[0], max_new_tokens=20, temperature=1, seed=0)
        for _ in range(2)
    )
    assert a.tokens == b.tokens


def test_vocabularies_are_checked_when_a_drafter_is_made():
    with pytest.raises(MinispecError, match="vocab_size"):
        ModelDrafter(tiny(vocab_size=32), TARGET)


def test_a_drafter_made_for_another_target_is_refused():
    with pytest.raises(MinispecError, match="made for model"):
        speculative_generate(UNRELATED, ModelDrafter(TARGET, CLOSE), [1, 2], max_new_tokens=5,
                             **GREEDY)
