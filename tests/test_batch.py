"""Batches (minispec/batch_forward.py, minispec/batch.py): the batched forward pass against each
sequence's Model.logits, generate_batch against each sequence's own autoregressive decoding
(greedy: token for token; sampled: the target's distribution), the random streams, continuous
batching, and the load-aware policy's arithmetic. Speed is measured by `minispec crossover`,
never here."""

import numpy as np
import pytest
from conftest import FAMILIES, tiny_config
from stats_helpers import pooled_chisquare

from minispec import MinispecError, Request, Sampling, autoregressive_generate, make_drafter
from minispec.backend import to_host
from minispec.batch import (
    BatchCosts,
    BatchDecoder,
    LoadAwareGamma,
    batch_sizes_up_to,
    calibrate,
    generate_batch,
    time_rounds,
)
from minispec.batch_forward import batch_embed, batch_head, batch_hidden
from minispec.core.sampling import warp
from minispec.drafters import ModelDrafter
from minispec.loader import random_model
from minispec.measure.harness import expected_tokens_per_call

TOL = 2e-5
TARGET = random_model(tiny_config(max_position_embeddings=96, n_layers=4), seed=0, scale=0.5)
CLOSE = random_model(tiny_config(max_position_embeddings=96, n_layers=4), seed=0, scale=0.5)
CLOSE.weights["lm_head"] = CLOSE.weights["lm_head"] + np.random.default_rng(2).normal(
    scale=0.1, size=CLOSE.weights["lm_head"].shape).astype(np.float32)  # a draft that agrees often
RNG = np.random.default_rng(1)
PROMPTS = [RNG.integers(0, 48, n).tolist() for n in (1, 3, 7, 12, 5, 2, 9, 4, 6, 1, 3, 8, 10,
                                                      2, 11, 5)]
PROMPTS[3] = [3, 9, 4] * 4  # a repeat, for the n-gram drafter
GREEDY = {"temperature": 0.0}


def drafters():
    return {"model": CLOSE, "ngram": make_drafter("ngram", TARGET),
            "early-exit": make_drafter("early-exit", TARGET, exit_layer=2)}


# ---- the batched forward pass -------------------------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
def test_batched_forward_equals_each_sequences_recompute(family, device):
    m = random_model(tiny_config(family), seed=7, device=device, scale=0.3)
    seqs = [[3, 17, 5], [42, 8, 8, 0, 31, 22, 9, 14, 47, 2], [6], [11, 30, 1, 2, 3, 4, 5]]
    caches = [m.new_cache(32) for _ in seqs]
    first = batch_head(m, batch_hidden(m, seqs, caches), [len(s) for s in seqs])
    # a second, ragged step: sequences at different positions feed different numbers of tokens
    more = [[1, 2], [3], [4, 5, 6, 7], [8]]
    second = batch_head(m, batch_hidden(m, more, caches), [len(t) for t in more])
    for s, t, a, b, c in zip(seqs, more, first, second, caches):
        ref = m.logits(s + t)
        np.testing.assert_allclose(to_host(a), ref[:len(s)], atol=TOL, rtol=0)
        np.testing.assert_allclose(to_host(b), ref[len(s):], atol=TOL, rtol=0)
        assert c.length == len(s) + len(t)
    assert np.abs(ref).max() > 0.5  # not a comparison of near-zero logits


def test_batched_forward_respects_the_sliding_window():
    m = random_model(tiny_config("mistral", sliding_window=4), seed=3, scale=0.3)
    seqs = [list(range(1, 12)), [5, 6]]  # the first is longer than the window
    caches = [m.new_cache(32) for _ in seqs]
    batch_hidden(m, [s[:-1] for s in seqs], caches)
    last = batch_head(m, batch_hidden(m, [s[-1:] for s in seqs], caches), [1, 1])
    for s, row in zip(seqs, last):
        np.testing.assert_allclose(to_host(row)[0], m.logits(s)[-1], atol=TOL, rtol=0)


# ---- generate_batch: exact, sequence by sequence ------------------------------------------


def reference(prompts, n=20):
    return [autoregressive_generate(TARGET, p, max_new_tokens=n, **GREEDY).tokens for p in prompts]


REFERENCE = reference(PROMPTS)


@pytest.mark.parametrize("name", ["model", "ngram", "early-exit"])
@pytest.mark.parametrize("gamma", [3, "auto"])
def test_greedy_batch_equals_each_sequences_autoregressive_output(name, gamma):
    for B in (1, 2, 5, 16):
        results = generate_batch(TARGET, drafters()[name], PROMPTS[:B], gamma=gamma,
                                 max_new_tokens=20, **GREEDY)
        assert [r.tokens for r in results] == REFERENCE[:B], (name, gamma, B)
        assert all(r.stop_reason == "length" for r in results)
        for r in results:
            st = r.stats
            assert [t for rd in st.rounds for t in rd.emitted] == r.tokens
            assert st.drafter == name and st.target_calls == len(st.rounds)


def test_plain_batch_and_gamma_zero_decode_autoregressively():
    for drafter in (None, CLOSE):
        results = generate_batch(TARGET, drafter, PROMPTS[:6], gamma=0, max_new_tokens=20,
                                 **GREEDY)
        assert [r.tokens for r in results] == REFERENCE[:6]
        assert all(r.stats.drafted == 0 and r.stats.target_calls == 20 for r in results)


def test_ragged_budgets_and_eos_let_sequences_leave_the_batch():
    eos = REFERENCE[1][4]  # sequence 1 stops at its fifth token; others may stop on it too
    results = generate_batch(TARGET, CLOSE, PROMPTS[:4], gamma=4, max_new_tokens=20,
                             eos_token_id=eos, **GREEDY)
    for r, ref in zip(results, REFERENCE[:4]):
        cut = ref.index(eos) + 1 if eos in ref else len(ref)
        assert r.tokens == ref[:cut]
        assert r.stop_reason == ("eos" if eos in ref else "length")
    short = PROMPTS[:3]
    decoder = BatchDecoder(TARGET, CLOSE, Sampling(), gamma=3)
    for p, n in zip(short, (2, 9, 1)):
        decoder.add(p, Request(n))
    done = {}
    while decoder.live:
        done.update(decoder.step())
    assert [done[i].tokens for i in range(3)] == [REFERENCE[0][:2], REFERENCE[1][:9],
                                                  REFERENCE[2][:1]]


def test_continuous_batching_sequences_join_between_rounds():
    decoder = BatchDecoder(TARGET, CLOSE, Sampling(), gamma=3)
    decoder.add(PROMPTS[0], Request(20))
    done, waiting = {}, list(range(1, 6))
    while decoder.live or waiting:
        if waiting:  # one newcomer every round, while others are mid-way
            decoder.add(PROMPTS[waiting.pop(0)], Request(20))
        done.update(decoder.step())
    assert [done[i].tokens for i in range(6)] == REFERENCE[:6]


@pytest.mark.parametrize("name", ["model", "ngram", "early-exit"])
def test_a_sequences_sampled_output_does_not_depend_on_its_company(name):
    kw = {"gamma": 3, "max_new_tokens": 16, "temperature": 1.0, "seed": 11}
    alone = generate_batch(TARGET, drafters()[name], PROMPTS[:1], **kw)[0].tokens
    crowd = generate_batch(TARGET, drafters()[name], PROMPTS[:1] + PROMPTS[4:9], **kw)[0].tokens
    other = generate_batch(TARGET, drafters()[name], PROMPTS[:1] + PROMPTS[9:11], **kw)
    assert alone == crowd == other[0].tokens
    assert generate_batch(TARGET, drafters()[name], PROMPTS[:1], **{**kw, "seed": 12}
                          )[0].tokens != alone


SMALL = tiny_config(vocab_size=8, hidden_size=16, n_layers=2, n_heads=2, n_kv_heads=1)


@pytest.mark.parametrize("gamma", [2, "load-aware"])
def test_sampled_batch_output_has_the_target_distribution(gamma):
    target = random_model(SMALL, seed=3, scale=0.3)
    draft = random_model(SMALL, seed=3, scale=0.25)  # close to the target: some accepted
    prompt, warping = [1, 5, 2], {"temperature": 0.8, "top_k": 6}
    p1 = warp(target.logits(prompt)[-1], **warping)
    joint = np.stack([p1[a] * warp(target.logits(prompt + [a])[-1], **warping)
                      for a in range(8)])
    costs = BatchCosts({b: {k: b * (1 + 0.1 * k) for k in range(1, 6)} for b in (1, 8)},
                       {1: 0.1, 8: 0.8})  # speculation pays at 1, not at 8: both paths taken
    counts = np.zeros((8, 8))
    n, batch = 1200, 6
    others = [[3, 3], [7], [2, 4, 6], [5], [0, 1]]
    accepted = drafted = 0
    for seed in range(n // batch):
        results = generate_batch(target, draft, [prompt] * batch, gamma=gamma, seed=seed,
                                 max_new_tokens=3, costs=costs, **warping)
        for r in results:  # the same prompt six times: six independent samples
            counts[r.tokens[0], r.tokens[1]] += 1
            accepted, drafted = accepted + r.stats.accepted, drafted + r.stats.drafted
        generate_batch(target, draft, others, gamma=gamma, seed=seed, max_new_tokens=2,
                       costs=costs, **warping)  # other prompts in between: no shared state
    assert 0.05 < accepted / drafted < 0.95
    assert pooled_chisquare(counts.ravel(), n * joint.ravel()) > 1e-3


# ---- the load-aware policy ------------------------------------------------------------------


def test_load_aware_rate_is_theorem_3_8_for_a_batch():
    costs = BatchCosts({1: {1: 1.0, 2: 1.1, 3: 1.2}, 4: {1: 2.0, 2: 4.0, 3: 6.0}},
                       {1: 0.1, 4: 0.2})
    policy = LoadAwareGamma(costs, alpha0=0.8, prior=10)
    assert policy.max_gamma == 2  # verify costs measured for up to 3 tokens
    assert policy.rate(0, 1) == pytest.approx(1.0)
    assert policy.rate(2, 1, alpha=0.8) == pytest.approx(
        expected_tokens_per_call(0.8, 2) / (2 * 0.1 + 1.2))
    assert policy.rate(1, 4, alpha=0.8) == pytest.approx(4 * 1.8 / (0.2 + 4.0))
    # by default the rate is taken at an optimistic alpha, one standard error above the estimate
    assert policy.alpha_optimistic == pytest.approx(0.8 + (0.8 * 0.2 / 10) ** 0.5)
    assert policy.rate(1, 1) == pytest.approx(
        expected_tokens_per_call(policy.alpha_optimistic, 1) / (0.1 + 1.1))
    assert costs.t_verify(2, 2) == pytest.approx(1.1 + 2.9 / 3)  # linear from B = 1 to 4
    assert policy.choose(1) == 2 and policy.choose(4) == 0  # on alone, off when full
    policy.update(4, 0)  # a rejection at the first draft: alpha falls
    assert policy.alpha == pytest.approx(8 / 11)
    for _ in range(100):
        policy.update(4, 0)
    assert policy.choose(1) == 0  # nothing is ever accepted: speculation does not pay


def test_load_aware_policy_tries_speculation_before_ruling_it_out():
    # a pessimistic prior (alpha 0.5) says speculation does not pay at batch 1, but the estimate
    # rests on 20 imagined drafts: the policy drafts, learns the true alpha (0.9), and keeps on
    costs = BatchCosts({1: {k: 0.8 + 0.2 * k for k in range(1, 6)}}, {1: 0.1})
    policy = LoadAwareGamma(costs, alpha0=0.25, prior=20)
    assert policy.rate(1, 1, alpha=0.25) < policy.rate(0, 1, alpha=0.25)
    assert policy.choose(1) > 0
    rng = np.random.default_rng(0)
    for _ in range(50):
        g = policy.choose(1)
        kept = rng.random(g) < 0.9  # each draft accepted with probability 0.9
        policy.update(g, int(np.argmin(kept)) if not kept.all() else g)
    assert policy.alpha > 0.7 and policy.choose(1) > 1  # the prior (0.25) fades


def test_load_aware_generation_follows_its_choices_and_stays_exact():
    costs = calibrate(TARGET, CLOSE, batch_sizes=(1, 4), max_k=5, context=16, repeats=1)
    # timed at k = 1, 2, 3 and 5 (CALIBRATED_K and max_k), k = 4 between them
    assert set(costs.verify) == {1, 4} and set(costs.verify[1]) == {1, 2, 3, 5}
    assert all(t > 0 for t in costs.draft.values())
    for B in (1, 4):  # monotone: more tokens, or a larger batch, never cost less
        ks = [costs.t_verify(B, k) for k in range(1, 6)]
        assert ks == sorted(ks) and costs.verify[4][3] >= costs.verify[1][3]
        assert costs.t_verify(B, 4) == pytest.approx((ks[2] + ks[4]) / 2)
    results = generate_batch(TARGET, CLOSE, PROMPTS[:5], gamma="load-aware", costs=costs,
                             max_new_tokens=20, **GREEDY)
    assert [r.tokens for r in results] == REFERENCE[:5]
    for r in results:
        assert all(rd.gamma <= 4 for rd in r.stats.rounds)


def test_load_aware_weighs_whole_rounds_where_they_were_timed():
    # the calls' sum says speculation pays at batch 4 (rate 1.88 > 1.0 at gamma 2); the rounds
    # as the decoder played them say it does not (0.89): where rounds were timed, they decide
    calls = ({1: {1: 1.0, 2: 1.1, 3: 1.2}, 4: {1: 4.0, 2: 4.4, 3: 4.8}}, {1: 0.1, 4: 0.2})
    rounds = {1: {0: 1.2, 1: 1.5, 2: 1.8}, 4: {0: 4.0, 1: 8.0, 2: 11.0}}
    theirs, ours = BatchCosts(*calls), BatchCosts(*calls, rounds=rounds)
    assert theirs.t_round(4, 2) == pytest.approx(2 * 0.2 + 4.8)  # Theorem 3.8's sum
    assert ours.t_round(4, 2) == 11.0 and ours.t_round(2, 1) == pytest.approx(1.5 + 6.5 / 3)
    for costs, off_at_4 in ((theirs, False), (ours, True)):
        policy = LoadAwareGamma(costs, alpha0=0.8, prior=10)
        policy.accepted, policy.tested = 0.8e9, 1e9  # alpha 0.8, known
        assert policy.rate(2, 4, alpha=0.8) == pytest.approx(4 * 2.44 / costs.t_round(4, 2))
        assert policy.choose(1) == 2 and (policy.choose(4) == 0) == off_at_4
    assert LoadAwareGamma(BatchCosts(rounds={1: {0: 1.0, 1: 1.1}}), max_gamma=8).max_gamma == 1


def test_load_aware_turns_speculation_on_or_off_only_for_a_clear_gain():
    # batch 4: drafting 2 a round (1.0 s, 2.44 tokens a sequence at alpha 0.8) against plain
    # rounds; a switch of mode needs a rate 5% (stay) above the current mode's best, while
    # within drafting the best gamma is taken at once
    def policy(plain_s):
        rounds = {4: {0: plain_s, 1: 0.8, 2: 1.0, 3: 1.4}}
        p = LoadAwareGamma(BatchCosts(rounds=rounds), alpha0=0.8, prior=10, stay=0.05)
        p.accepted, p.tested = 0.8e9, 1e9  # alpha 0.8, known
        return p

    assert policy(0.42).rate(0, 4) == pytest.approx(4 / 0.42)
    close = policy(0.42)  # plain 9.52 tokens/s against 9.76 drafting 2: within 5%
    assert close.gamma is None and close.choose(4) == 2  # the first round takes the best
    close.gamma = 0
    assert close.choose(4) == 0  # off stays off
    clear = policy(0.48)  # plain 8.33 against 9.76: 17% more drafting
    clear.gamma = 0
    assert clear.choose(4) == 2
    on = policy(0.40)  # plain 10.0 against 9.76 drafting 2: on stays on, at its best gamma
    on.gamma = 3
    assert on.choose(4) == 2
    assert policy(0.30).choose(4) == 0 and policy(0.30).rate(0, 4) > 1.05 * 9.76  # clearly off


def test_load_aware_drafts_the_gamma_of_the_measured_alpha():
    # the optimistic alpha (0.84, 10 drafts tested at 0.7) decides that speculation is tried;
    # the chain's length is the best at the measured alpha (4), not at the optimistic one (6)
    rounds = {1: {0: 0.8, **{g: 1.0 + 0.12 * g for g in range(1, 9)}}}
    policy = LoadAwareGamma(BatchCosts(rounds=rounds), alpha0=0.7, prior=10)
    optimistic = max(range(1, 9), key=lambda g: policy.rate(g, 1))
    measured = max(range(1, 9), key=lambda g: policy.rate(g, 1, alpha=0.7))
    assert (optimistic, measured) == (6, 4)
    assert policy.choose(1) == 4
    policy.update(4, 4)  # accepted: alpha rises
    assert policy.alpha == pytest.approx(11 / 14) and policy.choose(1) == max(
        range(1, 9), key=lambda g: policy.rate(g, 1, alpha=11 / 14))


@pytest.mark.parametrize("drafter", ["model", "ngram", "early-exit"])
def test_rounds_are_timed_for_every_gamma_and_batch_size(drafter):
    target = random_model(tiny_config(max_position_embeddings=256), seed=0, scale=0.5)
    ds = {"model": random_model(tiny_config(max_position_embeddings=256), seed=1),
          "ngram": make_drafter("ngram", target),
          "early-exit": make_drafter("early-exit", target, exit_layer=1)}
    rounds = time_rounds(target, ds[drafter], Sampling(), batch_sizes=(1, 3), max_gamma=2,
                         context=8, repeats=1)
    assert set(rounds) == {1, 3} and all(set(row) == {0, 1, 2} for row in rounds.values())
    for B, row in rounds.items():
        assert all(t > 0 for t in row.values())
        assert row[1] <= row[2]  # drafting: a line of slope >= 0
        assert all(rounds[3][g] >= rounds[1][g] for g in row)  # a larger batch: never cheaper
    # the sequences grow while timed: a short context times fewer gammas (96 positions)
    assert max(time_rounds(TARGET, CLOSE, Sampling(), batch_sizes=(1,), repeats=1)[1]) < 8


def test_rounds_are_timed_with_the_drafter_the_decoder_plays(monkeypatch):
    # a draft Model becomes make_drafter("model")'s drafter in the decoder (its chain in one
    # call where the CPU step serves); calibrate's rounds must time that one, not the core's
    # ModelDrafter (on the shipped pair that timed a batch-1 round drafting 4 at 2.0 plain
    # rounds where the decoder plays it at 1.6, and the policy drafted 2 where 4 won)
    import minispec.batch as batch

    made = []
    init = batch.BatchDecoder.__init__

    def spy(self, target, drafter, *args, **kwargs):
        init(self, target, drafter, *args, **kwargs)
        made.append(type(self.drafter))

    monkeypatch.setattr(batch.BatchDecoder, "__init__", spy)
    time_rounds(TARGET, CLOSE, Sampling(), batch_sizes=(1,), max_gamma=2, context=8, repeats=1)
    BatchDecoder(TARGET, CLOSE, Sampling(), gamma=2)
    assert made[0] is made[-1] is type(make_drafter("model", TARGET, draft_model=CLOSE))
    assert made[0] is not ModelDrafter


@pytest.mark.parametrize("drafter", ["model", "early-exit"])
def test_copies_of_a_prompt_decode_as_if_each_had_read_it(drafter):
    # time_rounds' batch: the prompt read once, its keys and values copied to the others; each
    # sequence then decodes (greedy) what it decodes having read the prompt itself
    from minispec.batch import copies_of

    d = {"model": CLOSE, "early-exit": make_drafter("early-exit", TARGET, exit_layer=2)}[drafter]
    prompt, request = PROMPTS[7], Request(12)
    decoder = copies_of(TARGET, d, Sampling(), prompt, 3, request)
    assert [s.cache.length for s in decoder.live] == [len(prompt)] + [len(prompt) - 1] * 2
    for s in decoder.live:
        s.policy.gamma = 2  # drafting: the drafter catches up on what it has not seen
    while decoder.live:
        for slot, result in decoder.step():
            assert result.tokens == REFERENCE[7][:12], slot


def test_load_aware_calibrates_only_the_batch_sizes_it_can_meet():
    """A batch never grows past its prompts: generate_batch times batch sizes 1..len(prompts),
    not 1..32."""
    assert batch_sizes_up_to(1) == (1,)
    assert batch_sizes_up_to(3) == (1, 2, 3)
    assert batch_sizes_up_to(8) == (1, 2, 4, 8)
    assert batch_sizes_up_to(32) == (1, 2, 4, 8, 16, 32)
    decoder = BatchDecoder(TARGET, CLOSE, Sampling(), gamma="load-aware", max_batch=3)
    assert set(decoder.load_aware.costs.rounds) == {1, 2, 3}
    for bad in (0, -1, 2.5, True, "3"):
        with pytest.raises(MinispecError, match="max_batch"):
            BatchDecoder(TARGET, CLOSE, Sampling(), gamma="load-aware", max_batch=bad)


def test_bad_batch_arguments_are_named():
    for prompts in ([], "abc", None):
        with pytest.raises(MinispecError, match="prompts"):
            generate_batch(TARGET, CLOSE, prompts, max_new_tokens=4, **GREEDY)
    with pytest.raises(MinispecError, match="prompt_ids"):
        generate_batch(TARGET, CLOSE, [[1, 2], [99]], max_new_tokens=4, **GREEDY)
    for gamma in (-1, "fast", 1.5):
        with pytest.raises(MinispecError, match="gamma"):
            generate_batch(TARGET, CLOSE, [[1, 2]], gamma=gamma, max_new_tokens=4, **GREEDY)


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_a_batchs_embeddings_are_each_sequences_own_and_bad_ids_are_named(family):
    """batch_embed gathers every sequence's rows in one call (GPT-2's learned positions too):
    the rows model.embed gives each alone; a bad id or an empty sequence is the MinispecError
    that model.embed raises, not another exception."""
    m = random_model(tiny_config(family), seed=3, scale=0.5)
    tokens, starts = [[5, 6, 7], [9], [1, 2]], [0, 4, 11]
    want = np.concatenate([to_host(m.embed(t, p)) for t, p in zip(tokens, starts)])
    assert np.array_equal(to_host(batch_embed(m, tokens, starts)), want)
    for bad, match in (([[1], [m.vocab_size]], "ids must be in"), ([[1], []], "non-empty"),
                       ([[1], [2.5]], "integer")):
        with pytest.raises(MinispecError, match=match):
            batch_embed(m, bad, [0, 3])


def test_each_sequence_of_a_batch_drafts_with_state_of_its_own():
    # a batch serves each sequence with a fork of the drafter, started on its prompt: no state
    # is shared between sequences, and the drafter handed in is left as it was
    started = []

    class Spy(ModelDrafter):
        def start(self, prompt_ids, cache):
            super().start(prompt_ids, cache)
            started.append(self)

    spy = Spy(TARGET, CLOSE)
    out = generate_batch(TARGET, spy, PROMPTS[:4], gamma=3, max_new_tokens=12, **GREEDY)
    assert spy.cache is None and len(started) == 4
    assert len({id(d.cache) for d in started}) == 4
    for prompt, r in zip(PROMPTS[:4], out):
        assert r.tokens == autoregressive_generate(TARGET, prompt, max_new_tokens=12,
                                                   **GREEDY).tokens
