"""A greedy vocabulary (minispec/drafters/vocab.py, weights/greedy_vocab.json): at temperature 0
the model drafter computes only the rows of the ids its target's argmax takes. It holds the
shipped target's greedy tokens on held-out prompts, the drafts come from it and the output is
the target's; sampled, it is not used; a batch's drafts use it too; bad files and ids are named."""

import json

import numpy as np
import pytest

from minispec import cpu_steps, load
from minispec.batch import generate_batch
from minispec.core.sampling import Sampling
from minispec.core.speculative import Request, generate
from minispec.drafters import FusedModelDrafter, NoDrafter, make_drafter, read_greedy_vocab
from minispec.drafters.files import target_signature
from minispec.errors import MinispecError
from minispec.measure.harness import encode_prompts, load_prompts
from minispec.shipped import SHIPPED


@pytest.fixture(scope="module")
def pair():
    target, draft = load("shipped:target", device="cpu"), load("shipped:draft", device="cpu")
    cpu_steps.enable_where_supported(target, draft)
    return target, draft


@pytest.fixture(scope="module")
def prompts(pair):
    return encode_prompts(load_prompts(SHIPPED / "prompts.json", 6), pair[0].tokenizer)


def greedy_is_the_targets(target, drafter, prompt, request, ids):
    """Greedy: the output autoregressive decoding's, every draft inside `ids`."""
    ar = generate(target, NoDrafter(target), prompt, Sampling(0.0), request, gamma=0)
    spec = generate(target, drafter, prompt, Sampling(0.0), request, gamma=4)
    assert spec.tokens == ar.tokens
    drafted = [t for r in spec.stats.rounds for t in r.drafted]
    assert drafted and np.isin(drafted, ids).all()


def sampled_is_unchanged(target, ours, whole, prompt, request):
    """At T = 1 the same seeded rounds with the greedy vocabulary as without it."""
    a = generate(target, ours, prompt, Sampling(1.0), request, gamma=4)
    b = generate(target, whole, prompt, Sampling(1.0), request, gamma=4)
    assert a.tokens == b.tokens and a.stats.rounds == b.stats.rounds


def test_the_shipped_greedy_vocabulary_holds_the_targets_greedy_tokens(pair, prompts):
    """Ascending ids of the vocabulary with the EOS ids among them, a tenth of it or less, and
    every greedy token of the target on held-out prompts (weights/greedy_vocab.py counted them on
    its training files; all 4,608 greedy tokens of the 72 held-out prompts are in it)."""
    target, draft = pair
    ids = read_greedy_vocab(target)
    assert ids.dtype == np.int64 and (np.diff(ids) > 0).all()
    assert 0 <= ids[0] and ids[-1] < target.vocab_size and ids.size <= target.vocab_size // 10
    assert set(target.config.eos_token_ids) <= set(ids.tolist())
    said = [t for p in prompts for t in generate(target, NoDrafter(target), p, Sampling(0.0),
                                                 Request(32, None), gamma=0).tokens]
    assert np.isin(said, ids).all()
    assert read_greedy_vocab(draft) is None  # listed for the target's shape only


def test_greedy_drafts_come_from_it_and_the_output_is_the_targets(pair, prompts, monkeypatch):
    """make_drafter("model") takes the shipped greedy vocabulary: at T = 0 each chain is drafted
    over its rows (logits -inf elsewhere; the first round, which feeds the prompt, by the loop
    over the same rows), drafts inside it, the output autoregressive decoding's; sampled, the
    chain uses the whole head, with the same seeded rounds as a drafter without it."""
    target, draft = pair
    ids = read_greedy_vocab(target)
    ours = make_drafter("model", target, draft_model=draft)
    whole = make_drafter("model", target, draft_model=draft, greedy_vocab=None)
    assert type(ours) is FusedModelDrafter and np.array_equal(ours.greedy_head.ids, ids)
    assert whole.greedy_head is None
    outside = np.setdiff1d(np.arange(target.vocab_size), ids)
    heads, chain = [], draft.fast_steps.draft_chain

    def spy(*a):
        heads.append(a[-1])
        done = chain(*a)
        if done is not None and a[4] == 0:  # greedy: the logits outside the cut not computed
            assert np.isneginf(done[1][:, outside]).all()
        return done

    monkeypatch.setattr(draft.fast_steps, "draft_chain", spy)
    for p in prompts[:3]:
        request = Request(40, None, seed=1)
        greedy_is_the_targets(target, ours, p, request, ids)
        assert heads and all(h is ours.greedy_head for h in heads)
        heads.clear()
        sampled_is_unchanged(target, ours, whole, p, request)
        assert heads and all(h is None for h in heads)
        heads.clear()


def test_a_batch_drafts_greedily_from_it_too(pair, prompts, monkeypatch):
    """Three sequences at once (one batched draft call per step, not one chain each): greedy,
    the batched heads computed over the greedy vocabulary alone, drafts inside it and each
    prompt's autoregressive output."""
    from minispec.drafters import draft_model

    target, draft = pair
    ids = read_greedy_vocab(target)
    outside, heads, seen = np.setdiff1d(np.arange(target.vocab_size), ids), draft_model.heads, []

    def spy(*a):
        logits = heads(*a)
        seen.append(bool(np.isneginf(logits[:, outside]).all()))
        return logits

    monkeypatch.setattr(draft_model, "heads", spy)
    out = generate_batch(target, draft, prompts[:3], gamma=4, max_new_tokens=24, temperature=0.0)
    for p, res in zip(prompts[:3], out):
        ar = generate(target, NoDrafter(target), p, Sampling(0.0), Request(24, None), gamma=0)
        assert res.tokens == ar.tokens
        assert np.isin([t for r in res.stats.rounds for t in r.drafted], ids).all()
    assert seen and all(seen)


def test_without_it_or_with_a_draft_vocabulary_there_is_none(pair):
    target, draft = pair
    assert make_drafter("model", target, draft_model=draft, greedy_vocab=None).greedy_head is None
    cut = make_drafter("model", target, draft_model=draft, draft_vocab=np.arange(0, 4096, 2))
    assert cut.greedy_head is None and cut.draft_head.size == 2048
    mine = make_drafter("model", target, draft_model=draft, greedy_vocab=np.array([0, 5, 9]))
    assert mine.greedy_head.ids.tolist() == [0, 5, 9]
    with pytest.raises(MinispecError, match="greedy_vocab"):
        make_drafter("model", target, draft_model=draft, greedy_vocab=np.array([9, 5]))
    with pytest.raises(MinispecError, match="greedy_vocab"):
        make_drafter("model", target, draft_model=draft, greedy_vocab=np.array([0, 4096]))


@pytest.mark.parametrize("text, what", [
    ("{not json", "expected JSON"),
    ('{"vocabularies": 3}', "expected JSON"),
    ('{"other": []}', "expected JSON"),
    ('{"vocabularies": [{"target": SIG, "ids": []}]}', "non-empty list"),
    ('{"vocabularies": [{"target": SIG, "ids": [1, "2"]}]}', "integer token ids"),
    ('{"vocabularies": [{"target": SIG, "ids": [1, true]}]}', "integer token ids"),
    ('{"vocabularies": [{"target": SIG, "ids": [1, 1e400]}]}', "integer token ids"),
    ('{"vocabularies": [{"target": SIG, "ids": [-1, 99999999999999999999999]}]}',
     "integer token ids"),
])
def test_a_bad_greedy_vocabulary_file_is_named(pair, tmp_path, text, what):
    target, _ = pair
    path = tmp_path / "greedy_vocab.json"
    path.write_text(text.replace("SIG", json.dumps(target_signature(target.config))))
    with pytest.raises(MinispecError, match=what) as e:
        read_greedy_vocab(target, path)
    assert str(path) in str(e.value)


def test_a_file_without_the_target_gives_none_and_a_missing_one_is_named(pair, tmp_path):
    target, draft = pair
    path = tmp_path / "v.json"
    path.write_text(json.dumps({"vocabularies": [
        {"target": target_signature(draft.config), "ids": [1, 2]}]}))
    assert read_greedy_vocab(target, path) is None
    assert read_greedy_vocab(draft, path).tolist() == [1, 2]
    with pytest.raises(MinispecError, match="no such file"):
        read_greedy_vocab(target, tmp_path / "missing.json")


@pytest.mark.parametrize("name, options", [("medusa", {}), ("medusa", {"tree": (2, 2, 1, 1)}),
                                           ("eagle", {}), ("eagle", {"tree": (2, 2, 1, 1)})])
def test_the_heads_draft_greedily_from_it_and_give_the_targets_output(pair, prompts, name,
                                                                      options):
    """Medusa and EAGLE end in the target's LM head: at T = 0 they compute only the greedy
    vocabulary's rows of it (drafts inside it, the output autoregressive decoding's); sampled,
    the whole head, the same seeded rounds as without it."""
    target, _ = pair
    ids = read_greedy_vocab(target)
    ours = make_drafter(name, target, **options)
    whole = make_drafter(name, target, greedy_vocab=None, **options)
    assert np.array_equal(ours.greedy_head.ids, ids) and whole.greedy_head is None
    for p in prompts[:2]:
        request = Request(32, None, seed=2)
        greedy_is_the_targets(target, ours, p, request, ids)
        sampled_is_unchanged(target, ours, whole, p, request)


def test_an_eagle_chain_that_reads_its_own_probabilities_keeps_its_draft_vocabulary(pair):
    """With stop (or a dynamic tree) the head's probabilities choose the chain's length (the
    tree's nodes); renormalised over a cut they would choose otherwise, so it is not used."""
    target, _ = pair
    greedy = type("W", (), {"sampling": Sampling(0.0)})()
    for options in ({"stop": 0.2}, {"tree": (4, 3, 2, 2), "dynamic": (3, 12)}, {}):
        head = make_drafter("eagle", target, **options)
        assert head.greedy_head is not None
        used = head.head(greedy)
        assert used is (head.greedy_head if not options else head.draft_head)


def test_a_greedy_vocab_that_is_neither_shipped_nor_ids_is_named(pair):
    target, draft = pair
    for name, kw in (("model", {"draft_model": draft}), ("medusa", {}), ("eagle", {})):
        with pytest.raises(MinispecError, match="greedy_vocab"):
            make_drafter(name, target, greedy_vocab="all", **kw)


def test_without_the_speed_path_the_loop_drafts_from_it_too(prompts, monkeypatch):
    """Models from minispec.load alone (no CPU step, as on a GPU without graphs): the model
    drafter's loop computes only the greedy vocabulary's logits at T = 0, the output
    autoregressive."""
    from minispec.drafters import draft_model

    target, draft = load("shipped:target", device="cpu"), load("shipped:draft", device="cpu")
    assert getattr(draft, "fast_steps", None) is None
    ids = read_greedy_vocab(target)
    outside, heads, seen = np.setdiff1d(np.arange(target.vocab_size), ids), draft_model.heads, []
    monkeypatch.setattr(draft_model, "heads", lambda *a: seen.append(heads(*a)) or seen[-1])
    ours = make_drafter("model", target, draft_model=draft)
    for p in prompts[:2]:
        request = Request(24, None, seed=0)
        ar = generate(target, NoDrafter(target), p, Sampling(0.0), request, gamma=0)
        spec = generate(target, ours, p, Sampling(0.0), request, gamma=4)
        assert spec.tokens == ar.tokens
        assert np.isin([t for r in spec.stats.rounds for t in r.drafted], ids).all()
    assert seen and all(np.isneginf(logits[:, outside]).all() for logits in seen)
