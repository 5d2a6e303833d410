"""The draft model's two options (minispec/drafters/draft_model.py): `stop`, a chain ended where the
draft's own confidence falls below a threshold, and `draft_vocab`, only some rows of its LM head
computed. Each draft equals what the draft model says recomputed from scratch; greedy output
stays the target's, one sequence or a batch; sampled output keeps the target's law, and the same
test rejects a chain cut after the draw; bad values are named."""

import numpy as np
import pytest
from conftest import tiny_config
from stats_helpers import sample_joint

import minispec
from minispec.drafters import ModelDrafter, make_drafter
from minispec.errors import MinispecError
from minispec.loader import random_model

TARGET = random_model(tiny_config(), seed=0, scale=0.5)
DRAFT = random_model(tiny_config(), seed=0, scale=0.8)  # the target scaled up: near, surer
PROMPTS = ([3, 17, 5], [9] * 9)
CUT = np.arange(0, 48, 2)  # the even token ids


def _recorded(drafter, prompt, temperature, seed=0, max_new_tokens=32):
    """Generate, recording each round's context, gamma and draft."""
    rounds, propose = [], drafter.propose

    def spy(context, gamma, warp, rng):
        draft = propose(context, gamma, warp, rng)
        rounds.append((list(context), gamma, [int(x) for x in draft.tokens]))
        return draft

    drafter.propose = spy
    out = minispec.speculative_generate(TARGET, drafter, prompt, gamma=4,
                                        max_new_tokens=max_new_tokens,
                                        temperature=temperature, seed=seed)
    return out, rounds


def _expected_chain(context, gamma, stop, ids=None):
    """The greedy chain the rule allows, from the draft model's logits recomputed without a
    cache (the reference for the cached, early-ending path)."""
    chain, sure = [], 1.0
    for _ in range(gamma):
        logits = DRAFT.logits(context + chain)[-1].astype(np.float64)
        if ids is not None:
            logits = np.where(np.isin(np.arange(logits.size), ids), logits, -np.inf)
        own = np.exp(logits - logits.max())
        own /= own.sum()
        if stop is not None and sure * own.max() < stop:
            break
        chain.append(int(own.argmax()))
        sure *= own.max()
        if stop is not None and sure < stop:
            break
    return chain


@pytest.mark.parametrize("stop, ids", [(0.3, None), (None, CUT), (0.6, CUT)])
def test_each_draft_is_the_draft_models_recomputed_and_greedy_output_the_targets(stop, ids):
    lengths = []
    for prompt in PROMPTS:
        base = minispec.autoregressive_generate(TARGET, prompt, max_new_tokens=32,
                                                temperature=0.0)
        drafter = make_drafter("model", TARGET, draft_model=DRAFT, stop=stop, draft_vocab=ids)
        out, rounds = _recorded(drafter, prompt, 0.0)
        assert out.tokens == base.tokens
        for context, gamma, draft in rounds:
            assert draft == _expected_chain(context, gamma, stop, ids)
            assert ids is None or set(draft) <= set(CUT.tolist())
        lengths += [len(d) for _, g, d in rounds if g == 4]
    if stop is not None:  # some chains end early, at every length, and some do not
        assert set(lengths) == {0, 1, 2, 3, 4}
    batch = minispec.generate_batch(
        TARGET, make_drafter("model", TARGET, draft_model=DRAFT, stop=stop, draft_vocab=ids),
        list(PROMPTS), gamma=4, max_new_tokens=32, temperature=0.0)
    assert [r.tokens for r in batch] == [
        minispec.autoregressive_generate(TARGET, p, max_new_tokens=32, temperature=0.0).tokens
        for p in PROMPTS]


def test_the_cut_gives_q_zero_outside_it_and_the_whole_vocabulary_changes_nothing():
    drafter = make_drafter("model", TARGET, draft_model=DRAFT, draft_vocab=CUT)
    drafts, propose = [], drafter.propose
    drafter.propose = lambda *a: drafts.append(propose(*a)) or drafts[-1]
    minispec.speculative_generate(TARGET, drafter, [3, 17, 5], gamma=4, max_new_tokens=16,
                                  temperature=1.0, seed=0)
    q = np.concatenate([d.q for d in drafts])
    assert q[:, 1::2].max() == 0 and np.allclose(q.sum(axis=1), 1.0)

    def tokens(ids):
        return minispec.speculative_generate(
            TARGET, make_drafter("model", TARGET, draft_model=DRAFT, draft_vocab=ids),
            [3, 17, 5], gamma=4, max_new_tokens=16, temperature=1.0, seed=0).tokens

    assert tokens(np.arange(48)) == tokens(None)


def test_a_higher_threshold_drafts_fewer_tokens_and_zero_drafts_as_without_it():
    def drafted(stop):
        out = minispec.speculative_generate(
            TARGET, make_drafter("model", TARGET, draft_model=DRAFT, stop=stop), [3, 17, 5],
            gamma=4, max_new_tokens=32, temperature=1.0, seed=0)
        return out.tokens, sum(len(r.drafted) for r in out.stats.rounds)

    counts = [drafted(s)[1] for s in (0.1, 0.5, 0.9)]
    assert counts[0] > counts[1] > counts[2]
    assert drafted(0.0) == drafted(None)  # stop 0 ends no chain and draws nothing extra


class CutAfterTheDraw(ModelDrafter):
    """A planted bug, the control: draft the whole chain, then cut it at the first token the
    draft gave less than `cut` of its probability. The cut reads the token drawn, so a kept draft
    is no longer a plain draw from its q."""

    name = "cut-after-draw"

    def __init__(self, cut):
        super().__init__(TARGET, DRAFT)
        self.cut = cut

    def propose(self, context, gamma, warp, rng):
        d = super().propose(context, gamma, warp, rng)
        keep = 0
        while keep < len(d.tokens) and d.q[keep, d.tokens[keep]] >= self.cut:
            keep += 1
        return minispec.Draft(d.tokens[:keep], d.q[:keep])


def test_sampling_with_a_stop_and_a_cut_follows_the_target():
    # the exact law of the next 4 tokens (top-2 at T = 1) against 800 generations
    drafter = make_drafter("model", TARGET, draft_model=DRAFT, stop=0.5, draft_vocab=CUT)
    row = sample_joint(TARGET, drafter, 800, top_k=2, L=4)[0]
    assert row.fit.pvalue > 1e-4, row.fit


def test_the_same_test_rejects_a_chain_cut_after_the_draw():
    row = sample_joint(TARGET, CutAfterTheDraw(0.6), 800, top_k=2, L=4)[0]  # the same budget
    assert row.fit.pvalue < 1e-6, row.fit


@pytest.mark.parametrize("kw, needle", [
    ({"stop": 1.0}, "stop must be a probability in [0, 1)"),
    ({"stop": -0.1}, "stop must be a probability"),
    ({"stop": True}, "stop must be a probability"),
    ({"draft_vocab": [5, 3]}, "model draft_vocab: expected ascending distinct token ids"),
    ({"draft_vocab": [0, 48]}, "model draft_vocab: expected ascending"),
    ({"draft_vocab": []}, "model draft_vocab: expected a non-empty"),
])
def test_bad_values_are_named(kw, needle):
    with pytest.raises(MinispecError, match=needle.replace("[", r"\[").replace(")", r"\)")):
        make_drafter("model", TARGET, draft_model=DRAFT, **kw)


def test_the_command_line_drafts_with_a_stop_and_a_draft_vocabulary(tmp_path, capsys):
    from safetensors.numpy import save_file

    from minispec.cli import main

    ids = tmp_path / "cut.safetensors"  # the shipped pair's 4,096 tokens, every other one
    save_file({"draft_vocab": np.arange(0, 4096, 2, dtype=np.int64)}, str(ids))
    argv = ["--prompt", "def f(x):", "--max-new-tokens", "12", "--no-color"]
    assert main([*argv, "--stop", "0.2", "--draft-vocab", str(ids), "--compare"]) == 0
    assert "outputs identical" in capsys.readouterr().out
    for bad, needle in ((["--draft-vocab", str(tmp_path / "none")], "--draft-vocab: "),
                        (["--drafter", "ngram", "--draft-vocab", str(ids)],
                         "--draft-vocab: for the model drafter")):
        assert main([*argv, *bad]) != 0
        assert needle in capsys.readouterr().err
