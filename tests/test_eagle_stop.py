"""EAGLE's dynamic chain length (`stop`, minispec/drafters/eagle.py): the chain ends where the
head's own confidence falls below a threshold. Greedy output stays the target's; sampled output
keeps the target's law because the rule is decided before each draw, and the same test rejects
the tempting variant that decides after it; bad values are named."""

import pytest
from conftest import tiny_config
from stats_helpers import sample_joint

import minispec
from minispec.drafters import make_drafter, random_eagle
from minispec.errors import MinispecError
from minispec.loader import random_model

TARGET = random_model(tiny_config(), seed=0, scale=0.5)
PROMPTS = ([3, 17, 5], [9] * 9)


@pytest.mark.parametrize("stop", [0.1, 0.3])
def test_greedy_decoding_with_a_dynamic_chain_is_the_targets(stop):
    lengths = []
    for prompt in PROMPTS:
        base = minispec.autoregressive_generate(TARGET, prompt, max_new_tokens=32,
                                                temperature=0.0)
        out = minispec.speculative_generate(TARGET, random_eagle(TARGET, seed=2, scale=0.1,
                                                                 stop=stop),
                                            prompt, gamma=4, max_new_tokens=32, temperature=0.0)
        assert out.tokens == base.tokens
        lengths += [len(r.drafted) for r in out.stats.rounds[1:]]  # round 1 has no features
    assert 4 in lengths and any(n < 4 for n in lengths)  # some chains end early, some do not
    batch = minispec.generate_batch(TARGET, random_eagle(TARGET, seed=2, scale=0.1, stop=stop),
                                    list(PROMPTS), gamma=4, max_new_tokens=32, temperature=0.0)
    assert [r.tokens for r in batch] == [
        minispec.autoregressive_generate(TARGET, p, max_new_tokens=32, temperature=0.0).tokens
        for p in PROMPTS]


def test_a_higher_threshold_drafts_fewer_tokens_and_zero_drafts_as_without_it():
    def drafted(stop, seed=0):
        out = minispec.speculative_generate(TARGET, random_eagle(TARGET, seed=2, scale=0.1,
                                                                 stop=stop),
                                            [3, 17, 5], gamma=4, max_new_tokens=32,
                                            temperature=1.0, seed=seed)
        return out.tokens, sum(len(r.drafted) for r in out.stats.rounds)

    counts = [drafted(s)[1] for s in (0.05, 0.2, 0.5)]
    assert counts[0] > counts[1] > counts[2]
    # stop=0 never ends a chain and draws no extra random numbers: the same tokens as no stop
    assert drafted(0.0) == drafted(None)


class DecidedAfterTheDraw(minispec.Drafter):
    """A planted bug, the control: draft the whole chain, then cut it at the first token the
    head gave less than `stop` of its probability. The cut reads the token drawn, so a kept draft
    is no longer a plain draw from its q."""

    name = "stop-after-draw"

    def __init__(self, stop):
        self.inner, self.stop = random_eagle(TARGET, seed=2, scale=0.1), stop
        super().__init__(TARGET)

    def start(self, prompt_ids, cache):
        self.inner.start(prompt_ids, cache)

    def accept(self, context, hidden):
        self.inner.accept(context, hidden)

    def propose(self, context, gamma, warp, rng):
        d = self.inner.propose(context, gamma, warp, rng)
        keep = 0
        while keep < len(d.tokens) and d.q[keep, d.tokens[keep]] >= self.stop:
            keep += 1
        return minispec.Draft(d.tokens[:keep], d.q[:keep])


def _sample_joint(drafter, n):
    # 4 tokens: round 1 has no features to draft from, round 2 drafts a chain of up to 2
    return sample_joint(TARGET, drafter, n, top_k=2, L=4)[0]


def test_sampling_with_a_dynamic_chain_follows_the_target():
    # the exact law of the next 4 tokens against 4,000 generations; at stop 0.3 the second
    # draft of 1 in 7 of them is not made (the first one drawn left the chain below it)
    row = _sample_joint(random_eagle(TARGET, seed=2, scale=0.1, stop=0.3), 4000)
    assert row.fit.pvalue > 1e-4, row.fit


def test_the_same_test_rejects_a_chain_cut_after_the_draw():
    row = _sample_joint(DecidedAfterTheDraw(0.3), 4000)  # the same budget
    assert row.fit.pvalue < 1e-6, row.fit


def test_bad_stop_values_are_named():
    for bad in (1.0, -0.1, "0.2", float("nan"), True):
        with pytest.raises(MinispecError, match="stop must be a probability"):
            random_eagle(TARGET, stop=bad)
    with pytest.raises(MinispecError, match="for a chain"):
        random_eagle(TARGET, shape=(2, 1), stop=0.2)


def test_the_command_line_takes_stop_for_an_eagle_chain_only(capsys):
    from minispec.cli import main

    for argv in (["--drafter", "ngram", "--stop", "0.2"],
                 ["--drafter", "eagle", "--tree", "2,1", "--stop", "0.2"],
                 ["--drafter", "eagle", "--stop", "1.5"]):
        assert main([*argv, "--prompt", "x", "--max-new-tokens", "2"]) != 0
        assert "--stop: a probability in [0, 1)" in capsys.readouterr().err


def test_make_drafter_passes_stop_to_the_shipped_head():
    from minispec.loader import load
    from minispec.shipped import SHIPPED

    target = load(SHIPPED / "target", device="cpu")
    assert make_drafter("eagle", target, stop=0.25).stop == 0.25
    assert make_drafter("eagle", target).stop is None
