"""weights/train_draft.py: a draft distilled from train_heads.py's data cache learns the target's
next-token distributions (the teacher read from the cached features is aligned with the
positions the draft predicts), and the directory it writes drafts losslessly in minispec."""

import importlib.util
from pathlib import Path

import numpy as np
import pytest
from conftest import tiny_config

import minispec
from minispec.judge.stats import softmax
from minispec.loader import random_model, save_checkpoint

torch = pytest.importorskip("torch", reason="the training recipe needs torch (pip install "
                                            "'.[train]')")
pytest.importorskip("transformers", reason="the training recipe needs transformers (pip "
                                           "install '.[train]')")
WEIGHTS = Path(__file__).resolve().parents[1] / "weights"


def _module(name):
    spec = importlib.util.spec_from_file_location(name, WEIGHTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _mean_tv(target, draft, seqs):
    """Mean total variation between the target's and the draft's next-token distributions over
    every position of `seqs`."""
    tvs = []
    for s in seqs:
        p = softmax(np.asarray(target.logits(list(s)), dtype=np.float64))
        q = softmax(np.asarray(draft.logits(list(s)), dtype=np.float64))
        tvs.append(0.5 * np.abs(p - q).sum(-1))
    return float(np.concatenate(tvs).mean())


def test_a_distilled_draft_learns_the_target_and_drafts_losslessly(tmp_path):
    th = _module("train_heads")
    td = _module("train_draft")
    from transformers import LlamaForCausalLM

    config = tiny_config(vocab_size=24, max_position_embeddings=64)
    target = random_model(config, seed=3, scale=1.0)
    for layer in target.weights["layers"]:  # no attention: the next token's distribution is a
        layer["wo"][...] = 0.0              # function of the current token, which a small draft
    #                                         can learn exactly from a few hundred positions
    save_checkpoint(target, tmp_path / "target")
    rng = np.random.default_rng(0)
    seqs = []
    for i in range(48):  # the target's own sampled continuations of random 4-token prompts
        prompt = [int(t) for t in rng.integers(3, 24, 4)]
        out = minispec.autoregressive_generate(target, prompt, max_new_tokens=20,
                                               temperature=1.0, seed=i)
        seqs.append((np.array(prompt + list(out.tokens), dtype=np.int64), 4))
    hf = LlamaForCausalLM.from_pretrained(str(tmp_path / "target"), dtype=torch.float32).eval()
    feats = th.features(hf, [s for s, _ in seqs])
    torch.save({"train": seqs[:40], "feats": feats[:40], "eval": seqs[40:],
                "eval_feats": feats[40:]}, tmp_path / "data.pt")

    args = ["--target", str(tmp_path / "target"), "--data-cache", str(tmp_path / "data.pt"),
            "--hidden", "32", "--layers", "2", "--intermediate", "64", "--head-dim", "8",
            "--batch", "4", "--lr", "1e-2", "--seed", "0"]
    td.main(args + ["--epochs", "0.1", "--out", str(tmp_path / "untrained")])
    td.main(args + ["--epochs", "30", "--out", str(tmp_path / "draft")])
    untrained = minispec.load(tmp_path / "untrained")
    draft = minispec.load(tmp_path / "draft")

    held = [s for s, _ in seqs[40:]]
    tv_before, tv_after = _mean_tv(target, untrained, held), _mean_tv(target, draft, held)
    assert tv_before > 0.3 and tv_after < 0.1, (tv_before, tv_after)  # learned the target

    td.main(args + ["--epochs", "1", "--init", str(tmp_path / "draft"), "--lr", "1e-3",
                    "--out", str(tmp_path / "again")])  # continued: it starts where it stopped
    assert _mean_tv(target, minispec.load(tmp_path / "again"), held) < 0.1

    drafter = minispec.make_drafter("model", target, draft_model=draft)
    for prompt in ([5, 9, 3], [7, 7, 12, 4]):
        want = minispec.autoregressive_generate(target, prompt, max_new_tokens=16,
                                               temperature=0.0).tokens
        got = minispec.speculative_generate(target, drafter, prompt, max_new_tokens=16,
                                            temperature=0.0).tokens
        assert list(got) == list(want)


@pytest.mark.parametrize("flag,value,says", [("--hidden", "30", "multiple of --head-dim"),
                                             ("--layers", "0", "positive integer"),
                                             ("--epochs", "0", "positive number"),
                                             ("--init", "nowhere", "no config.json")])
def test_bad_flags_get_one_line(tmp_path, flag, value, says):
    td = _module("train_draft")
    data = tmp_path / "data.pt"
    data.write_bytes(b"")
    with pytest.raises(SystemExit, match=says):
        td.main(["--target", str(tmp_path), "--data-cache", str(data), "--out",
                 str(tmp_path / "o"), flag, value])


def test_a_missing_data_cache_is_named(tmp_path):
    td = _module("train_draft")
    with pytest.raises(SystemExit, match="nope.pt not found"):
        td.main(["--target", str(tmp_path), "--data-cache", str(tmp_path / "nope.pt"),
                 "--out", str(tmp_path / "o")])
