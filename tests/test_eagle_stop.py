"""EAGLE's dynamic chain length (`stop`, minispec/drafters/eagle.py): the chain ends where the
head's own confidence, or the acceptance measured for it, falls below a threshold. Greedy output
stays the target's; sampled output keeps the target's law because the rule is decided before
each draw, and the same test rejects the tempting variant that decides after it; bad values are
named."""

import json
import shutil

import numpy as np
import pytest
from conftest import tiny_config
from drafters_for_tests import Wrapping
from stats_helpers import sample_joint

import minispec
from minispec.drafters import EagleDrafter, make_drafter, random_eagle
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


class DecidedAfterTheDraw(Wrapping):
    """A planted bug, the control: draft the whole chain, then cut it at the first token the
    head gave less than `stop` of its probability. The cut reads the token drawn, so a kept draft
    is no longer a plain draw from its q."""

    name = "stop-after-draw"

    def __init__(self, stop):
        super().__init__(random_eagle(TARGET, seed=2, scale=0.1))
        self.stop = stop

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
    # the exact law of the next 4 tokens against 800 generations (its control, below, is
    # rejected at p ~1e-10 with half as many); at stop 0.3 the second
    # draft of 1 in 7 of them is not made (the first one drawn left the chain below it)
    row = _sample_joint(random_eagle(TARGET, seed=2, scale=0.1, stop=0.3), 800)
    assert row.fit.pvalue > 1e-4, row.fit


def test_the_same_test_rejects_a_chain_cut_after_the_draw():
    row = _sample_joint(DecidedAfterTheDraw(0.3), 400)  # half the budget suffices
    assert row.fit.pvalue < 1e-6, row.fit


def _measured(greedy, sampled, steps=4):
    """An `acceptance` as read_acceptance returns it: the same rates at every confidence."""
    edges = np.linspace(0.1, 1.0, 10)
    rows = [np.full((steps, 10), v) if np.isscalar(v) else np.array(v) for v in (greedy, sampled)]
    return {"edges": edges, "greedy": rows[0], "sampled": rows[1]}


def _lengths(acceptance, stop, temperature):
    drafter = random_eagle(TARGET, seed=2, scale=0.1, stop=stop)
    drafter.acceptance = acceptance
    out = minispec.speculative_generate(TARGET, drafter, [3, 17, 5], gamma=4, max_new_tokens=32,
                                        temperature=temperature, seed=0)
    return [len(r.drafted) for r in out.stats.rounds[1:]]  # round 1 has no features


def test_the_measured_acceptance_decides_where_the_chain_ends():
    # no stop: chains of 4 (shorter only in the last rounds of the 32 tokens)
    plain = _lengths(None, None, 0.0)
    assert plain.count(4) > len(plain) // 2
    # the random head's own probabilities end many chains early at 0.3 ...
    assert _lengths(None, 0.3, 0.0).count(4) < len(plain) // 2
    # ... a head measured to be always right drafts every token, one never right none
    assert _lengths(_measured(1.0, 1.0), 0.3, 0.0) == plain
    assert set(_lengths(_measured(0.2, 0.2), 0.3, 0.0)) == {0}
    # greedy rates at T = 0, sampled ones when sampling
    assert _lengths(_measured(1.0, 0.2), 0.3, 0.0) == plain
    assert set(_lengths(_measured(1.0, 0.2), 0.3, 1.0)) == {0}
    # per chain step: 1 x 0.9 x 0.5 = 0.45 >= 0.4 > 0.45 x 0.8: chains of 3
    steps = np.array([[1.0] * 10, [0.9] * 10, [0.5] * 10, [0.8] * 10])
    assert set(_lengths(_measured(steps, steps), 0.4, 1.0)[:-2]) == {3}
    # by confidence: rate 0 in the bins below 0.2, 1 above: only drafts the head gives at least
    # 0.2 are made, and a chain ends at the first it does not
    drafter = random_eagle(TARGET, seed=2, scale=0.1, stop=0.5)
    drafter.acceptance = _measured(*[np.tile([0.0] + [1.0] * 9, (4, 1))] * 2)
    drafts, propose = [], drafter.propose
    drafter.propose = lambda *a: drafts.append(propose(*a)) or drafts[-1]
    minispec.speculative_generate(TARGET, drafter, [3, 17, 5], gamma=4, max_new_tokens=32,
                                  temperature=1.0, seed=0)
    tops = [q.max() for d in drafts for q in d.q]
    assert tops and min(tops) > 0.1
    assert {len(d.tokens) for d in drafts[1:]} - {4}  # some chains ended early


def test_sampling_with_a_measured_acceptance_follows_the_target():
    # rates that end some chains and not others, by confidence and step
    rates = np.tile(np.linspace(0.3, 1.0, 10), (4, 1)) ** np.arange(1, 5)[:, None]
    drafter = random_eagle(TARGET, seed=2, scale=0.1, stop=0.3)
    drafter.acceptance = _measured(rates, rates)
    row = _sample_joint(drafter, 800)
    assert row.fit.pvalue > 1e-4, row.fit


def _by_rank(rates, sampled=1.0, sampled_rates=(0.1, 0.05, 0.0)):
    """An `acceptance` with a tree's per-rank chances (the same at every confidence)."""
    table = _measured(1.0, sampled)
    for kind, r in (("greedy_by_rank", rates), ("sampled_by_rank", sampled_rates)):
        table[kind] = np.repeat(np.array(r, dtype=float)[:, None], 10, axis=1)
    return table


def test_a_measured_acceptance_ranks_a_dynamic_trees_nodes():
    context = [3, 17, 5, 8, 8, 1, 9]

    def draft(drafter, temperature=0.0):
        cache = TARGET.new_cache(64)
        drafter.start(context, cache)
        drafter.accept(context, TARGET.hidden_states(context[:-1], cache))
        return drafter.propose(context, 4, minispec.Sampling(temperature).warp,
                               np.random.default_rng(0))

    chain = draft(random_eagle(TARGET, seed=2, scale=0.1)).tokens.tolist()
    # the head's own probabilities (flat: a random head) keep shallow siblings ...
    tree = random_eagle(TARGET, seed=2, scale=0.1, shape=(3, 3, 3, 3), dynamic=(1, 4))
    assert draft(tree).parents.tolist() != [-1, 0, 1, 2]
    # ... a head measured to be right with its first choice only keeps that chain
    tree.acceptance = _by_rank([1.0, 0.0, 0.0])
    d = draft(tree)
    assert d.parents.tolist() == [-1, 0, 1, 2] and d.tokens.tolist() == chain
    # second choices measured likelier than first ones: the root's 3 children and one below
    tree.acceptance = _by_rank([0.2, 0.5, 0.4])
    assert draft(tree).parents.tolist() == [-1, -1, -1, 1]
    # sampling, where a drawn candidate is likelier kept (a) than one of the top 3 (0.15):
    # candidates drawn without replacement, the j-th kept with about a (1 - a)^j; a = 1
    # keeps the first drawn child at every depth ...
    d = draft(tree, 1.0)
    assert d.siblings == "without-replacement" and d.parents.tolist() == [-1, 0, 1, 2]
    # ... a = 0.5 the root's three (0.5, 0.25, 0.125) and the first one's first (0.25)
    tree.acceptance = _by_rank([1.0, 0.0, 0.0], sampled=0.5)
    assert draft(tree, 1.0).parents.tolist() == [-1, -1, -1, 0]
    # where the top 3 are likelier kept (0.4 + 0.3 + 0.1 > a = 0.5): top-k candidates, ranked
    # by the target's measured probability of each rank: 0.4, 0.3 and 0.4 x (0.4, 0.3)
    tree.acceptance = _by_rank([1.0, 0.0, 0.0], sampled=0.5, sampled_rates=(0.4, 0.3, 0.1))
    d = draft(tree, 1.0)
    assert d.siblings == "deterministic" and d.parents.tolist() == [-1, -1, 0, 0]
    # without a measured acceptance: the top-k candidates, also when sampling
    tree.acceptance = None
    assert draft(tree, 1.0).siblings == "deterministic"


def test_greedy_decoding_with_a_tree_ranked_by_measured_chances_is_the_targets():
    tree = random_eagle(TARGET, seed=2, scale=0.1, shape=(3, 2, 2), dynamic=(2, 6))
    tree.acceptance = _by_rank([0.6, 0.3, 0.1])  # top-k candidates ranked by greedy_by_rank
    tree.acceptance["greedy_by_rank"][0] = np.linspace(0.1, 1.0, 10)
    for prompt in PROMPTS:
        base = minispec.autoregressive_generate(TARGET, prompt, max_new_tokens=32,
                                                temperature=0.0)
        out = minispec.speculative_generate(TARGET, tree, prompt, gamma=3, max_new_tokens=32,
                                            temperature=0.0)
        assert out.tokens == base.tokens


class RankedByTheirOwnQ(EagleDrafter):
    """A planted bug, the control: the dynamic tree samples its candidates and keeps those the
    head gives the most probability (EAGLE-2's score applied to sampled candidates)."""

    def rank_chances(self, confidence, depth, k, q_row, mode):
        return None  # the head's own log q of each drawn token


def _sampled_tree(cls, n):
    # 3 candidates drawn under the root, 2 under the likeliest, 2 nodes kept: a
    # (1 - a)^j keeps the first drawn and its first child; the bug, the two the head likes best
    inner = random_eagle(TARGET, seed=2, scale=0.5, shape=(3, 2), dynamic=(1, 2))
    tree = cls(TARGET, inner.layer, inner.fc_w, inner.fc_b, (3, 2), (1, 2))
    tree.acceptance = _by_rank([0.6, 0.3, 0.1], sampled=0.6)
    # the law of 4 tokens at top-k 3: round 2 drafts a tree of depth 2
    return sample_joint(TARGET, tree, n, top_k=3, L=4)[0]


def test_sampling_with_a_tree_ranked_by_measured_chances_follows_the_target():
    row = _sampled_tree(EagleDrafter, 1500)
    assert row.fit.pvalue > 1e-4, row.fit


def test_the_same_test_rejects_sampled_candidates_kept_by_their_own_q():
    row = _sampled_tree(RankedByTheirOwnQ, 750)  # half the budget suffices
    assert row.fit.pvalue < 1e-6, row.fit


def test_a_malformed_acceptance_field_is_named(tmp_path):
    from minispec.drafters.eagle import load_eagle
    from minispec.loader import load
    from minispec.shipped import SHIPPED

    target = load(SHIPPED / "target", device="cpu")
    head = tmp_path / "eagle"
    shutil.copytree(SHIPPED / "eagle", head)
    cfg = json.loads((head / "config.json").read_text())
    good = cfg["acceptance"]
    assert load_eagle(head, target).acceptance["greedy"].shape == (4, 10)
    bad = [("[]", "should be an object"),
           ({**good, "confidence_edges": [0.5, 0.2, 1.0]}, "confidence_edges should be"),
           ({**good, "confidence_edges": [0.5, 0.9]}, "confidence_edges should be"),
           ({**good, "greedy": [[0.5] * 9]}, "acceptance.greedy should be one list of 10"),
           ({**good, "sampled": [[1.5] * 10]}, "acceptance.sampled should be"),
           ({**good, "sampled": [[True] * 10]}, "acceptance.sampled should be"),
           ({**good, "greedy": None}, "acceptance.greedy should be"),
           ({**good, "greedy": [[0.5] * 10, [0.5] * 3]}, "acceptance.greedy should be"),
           ({**good, "greedy_by_rank": [[0.5] * 8]}, "greedy_by_rank should be one list of 10 "
                                                     "rates in .* per rank")]
    for value, message in bad:
        (head / "config.json").write_text(json.dumps({**cfg, "acceptance": json.loads(value)
                                                      if isinstance(value, str) else value}))
        with pytest.raises(MinispecError, match=message) as err:
            load_eagle(head, target)
        assert "config.json" in str(err.value)


def test_bad_stop_values_are_named():
    for bad in (1.0, -0.1, "0.2", float("nan"), True):
        with pytest.raises(MinispecError, match="stop must be a probability"):
            random_eagle(TARGET, stop=bad)
    with pytest.raises(MinispecError, match="for a chain"):
        random_eagle(TARGET, shape=(2, 1), stop=0.2)


def test_the_command_line_takes_stop_for_an_eagle_or_model_chain_only(capsys):
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
