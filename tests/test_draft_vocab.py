"""A draft vocabulary (minispec/drafters/vocab.py, FR-Spec): heads that propose only some tokens
compute those logits (from the kept rows, held in bfloat16 on the CPU), decode greedily as the
target does, stay exact when sampling, load from files with their ids, and bad ids are named;
make_drafter finds the heads made for a target and refuses the others by name."""

import json

import numpy as np
import pytest
from conftest import tiny_config
from stats_helpers import sample_joint

import minispec
from minispec.backend import BF16, kernel_available
from minispec.drafters import load_eagle, load_medusa, make_drafter, random_eagle, random_medusa
from minispec.drafters.files import find_head_dir, target_signature
from minispec.drafters.vocab import DraftVocab
from minispec.errors import MinispecError
from minispec.loader import random_model
from minispec.safetensors import SafetensorsFile, bf16_to_f32, f32_to_bf16, save_file
from minispec.tree import TreeDrafter

TARGET = random_model(tiny_config(), seed=0, scale=0.5)
V = TARGET.config.vocab_size
CUT = np.arange(0, V, 3)  # every third token: the target's greedy tokens are often outside


def with_vocab(drafter, ids):
    drafter.draft_head = DraftVocab(drafter.target, ids)
    return drafter


def test_the_cut_head_computes_the_kept_rows_and_nothing_else():
    h = TARGET.hidden_states([3, 17, 5, 8], TARGET.new_cache(8))
    full = np.asarray(TARGET.lm_head(h))
    head = DraftVocab(TARGET, CUT)
    cut = head(h)
    rows = TARGET.weights["lm_head"][:, CUT]  # [D, N] float32
    if kernel_available():  # the kept rows held rounded to bfloat16 (read by the kernel)
        assert head.w.dtype == BF16
        rows = bf16_to_f32(f32_to_bf16(rows))
    else:
        assert head.w.dtype == np.float32
    np.testing.assert_allclose(cut[:, CUT], TARGET.lm_head(h, rows), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(cut[:, CUT], full[:, CUT], rtol=0, atol=0.05)  # rounding only
    assert np.isneginf(np.delete(cut, CUT, axis=1)).all()
    np.testing.assert_array_equal(DraftVocab(TARGET)(h), full)
    assert DraftVocab(TARGET, CUT).size == CUT.size and DraftVocab(TARGET).size == V


@pytest.mark.parametrize("make", [
    lambda: random_eagle(TARGET, seed=1),
    lambda: random_eagle(TARGET, seed=1, shape=(2, 2, 1)),
    lambda: random_eagle(TARGET, seed=1, shape=(3, 2, 2), dynamic=(2, 6)),
    lambda: random_medusa(TARGET, 4, seed=1, scale=0.3, shape=(2, 2, 1, 1)),
], ids=["eagle chain", "eagle tree", "eagle-2", "medusa"])
def test_greedy_decoding_with_a_cut_vocabulary_is_the_targets(make):
    drafter = with_vocab(make(), CUT)
    for prompt in ([3, 17, 5], [9] * 9):
        base = minispec.autoregressive_generate(TARGET, prompt, max_new_tokens=24,
                                                temperature=0.0)
        out = minispec.speculative_generate(TARGET, drafter, prompt, gamma=4, max_new_tokens=24,
                                            temperature=0.0)
        assert out.tokens == base.tokens
        drafted = [x for r in out.stats.rounds for x in r.drafted]
        assert drafted and set(drafted) <= set(CUT.tolist())  # never a token outside the cut
    batch = minispec.generate_batch(TARGET, drafter, [[3, 17, 5], [9] * 9], gamma=4,
                                    max_new_tokens=24, temperature=0.0)
    assert [r.tokens for r in batch] == [
        minispec.autoregressive_generate(TARGET, p, max_new_tokens=24, temperature=0.0).tokens
        for p in ([3, 17, 5], [9] * 9)]


class CutReported(TreeDrafter):
    """A planted bug, the control: tokens drawn from the cut, but the q reported is the whole
    vocabulary's (the renormalization over the cut forgotten). Two copies of one head run in
    lockstep: `cut` draws, `full` gives the q of the first draft (all this test's rounds draft
    at most one token: 3 new tokens, the first from the first target call)."""

    name = "cut-reported"

    def __init__(self, make):
        self.cut, self.full = with_vocab(make(), CUT), make()
        super().__init__(self.cut.target)

    def start(self, prompt_ids, cache):
        self.cut.start(prompt_ids, cache)
        self.full.start(prompt_ids, cache)

    def accept(self, context, hidden):
        self.cut.accept(context, hidden)
        self.full.accept(context, hidden)

    def propose(self, context, gamma, warp, rng):
        d = self.cut.propose(context, gamma, warp, rng)
        q = self.full.propose(context, gamma, warp, np.random.default_rng(0)).q
        return minispec.Draft(d.tokens, q[: len(d.tokens)], d.parents, d.siblings)


def _sample_joint(drafter, n):
    return sample_joint(TARGET, drafter, n, top_k=4, L=3)


@pytest.mark.parametrize("make", [lambda: random_eagle(TARGET, seed=2, scale=0.1),
                                  lambda: random_eagle(TARGET, seed=2, scale=0.1,
                                                       shape=(2, 1))], ids=["chain", "tree"])
def test_sampling_with_a_cut_vocabulary_follows_the_target(make):
    # the exact law of the next 3 tokens against 500 generations: q = 0 outside the cut must
    # leave the output distributed as the target's (the residual takes that mass)
    row, samples = _sample_joint(with_vocab(make(), CUT), 500)
    assert row.fit.pvalue > 1e-4, row.fit
    assert any(x not in CUT for s in samples for x in s)  # the target says tokens q cannot


def test_the_same_test_rejects_a_draft_whose_q_is_not_what_drew_it():
    row, _ = _sample_joint(CutReported(lambda: random_eagle(TARGET, seed=2, scale=0.1)), 500)
    assert row.fit.pvalue < 1e-6, row.fit


def _write_medusa(path, drafter, ids, size=None):
    path.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for k, (w, b) in enumerate(drafter.heads):
        tensors[f"medusa_head.{k}.weight"] = np.asarray(w, np.float32).T.copy()
        tensors[f"medusa_head.{k}.bias"] = np.asarray(b, np.float32)
    if ids is not None:
        tensors["draft_vocab"] = np.asarray(ids)
    save_file(tensors, path / "model.safetensors")
    cfg = {"medusa_num_heads": len(drafter.heads), "hidden_size": TARGET.config.hidden_size,
           "target": target_signature(TARGET.config)}
    if size is not None:
        cfg["draft_vocab_size"] = size
    (path / "config.json").write_text(json.dumps(cfg))


def test_a_draft_vocabulary_is_read_from_the_heads_file_and_bad_ones_are_named(tmp_path):
    drafter = random_medusa(TARGET, 2, seed=3, scale=0.3)
    _write_medusa(tmp_path / "ok", drafter, CUT.astype(np.int64), size=CUT.size)
    assert SafetensorsFile(tmp_path / "ok" / "model.safetensors").get_ints(
        "draft_vocab").tolist() == CUT.tolist()
    loaded = load_medusa(tmp_path / "ok", TARGET)
    assert loaded.draft_head.ids.tolist() == CUT.tolist()
    cases = {"size": (CUT, 5, "draft_vocab_size is 5"),
             "order": (CUT[::-1].copy(), None, "ascending"),
             "range": (np.array([0, V]), None, f"0..{V - 1}"),
             "float": (CUT.astype(np.float32), None, "expected integers")}
    for name, (ids, size, message) in cases.items():
        _write_medusa(tmp_path / name, drafter, ids, size)
        with pytest.raises(MinispecError, match=message):
            load_medusa(tmp_path / name, TARGET)


def test_make_drafter_takes_the_heads_made_for_the_target(tmp_path):
    shipped = minispec.load("shipped:target")
    assert make_drafter("eagle", shipped).draft_head.size == shipped.config.vocab_size
    assert find_head_dir([tmp_path / "none", minispec.drafters.SHIPPED_MEDUSA], shipped,
                         "Medusa heads") == minispec.drafters.SHIPPED_MEDUSA
    with pytest.raises(MinispecError, match="no EAGLE head trained for this target"):
        make_drafter("eagle", TARGET)  # a tiny random model: no shipped head is for it
    with pytest.raises(MinispecError, match="hidden_size 512 is not the target's"):
        load_eagle(minispec.drafters.SHIPPED_EAGLE, TARGET)
