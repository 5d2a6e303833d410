"""Medusa heads (minispec/drafters/medusa.py): greedy decoding identical to the target's for
every tree shape, the heads computed as the formula says, files read back, bad files named; the
shipped heads."""

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import tiny_config
from scipy.special import expit

import minispec
from minispec.backend import kernel_available
from minispec.drafters import MedusaDrafter, load_medusa, random_medusa
from minispec.errors import MinispecError
from minispec.loader import random_model
from minispec.safetensors import save_file

WEIGHTS = Path(__file__).resolve().parents[1] / "weights"
TARGET = random_model(tiny_config(), seed=0, scale=0.5)


@pytest.mark.parametrize("shape", [(1,), (1, 1, 1, 1), (2, 1), (3, 2, 1), (2, 2, 2, 1)])
def test_greedy_medusa_is_autoregressive_decoding(shape):
    drafter = random_medusa(TARGET, 4, seed=1, scale=0.3, shape=shape)
    for prompt in ([3, 17, 5], [9, 9, 9, 9, 9, 9, 9]):
        base = minispec.autoregressive_generate(TARGET, prompt, max_new_tokens=25,
                                                temperature=0.0)
        out = minispec.speculative_generate(TARGET, drafter, prompt, gamma=4,
                                            max_new_tokens=25, temperature=0.0)
        assert out.tokens == base.tokens
        assert out.stats.rounds[0].drafted == []  # no hidden state before the first call


def test_heads_read_the_last_hidden_state_as_medusa_1_writes_them():
    drafter = random_medusa(TARGET, 2, seed=2, scale=0.3)
    cache = TARGET.new_cache(16)
    h = TARGET.hidden_states([3, 4, 5], cache)
    drafter.accept([3, 4, 5, 6], h)
    w, b = drafter.heads[1]  # stored transposed: h @ w
    a = h[-1] @ w + b
    z = h[-1] + a * expit(a)  # SiLU(a) = a sigmoid(a)
    np.testing.assert_allclose(drafter.guesses()[1], TARGET.lm_head(z[None])[0], rtol=1e-5,
                               atol=1e-5)


def _write(path, heads, config=None):
    path.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for k, (w, b) in enumerate(heads):
        tensors[f"medusa_head.{k}.weight"] = np.asarray(w, dtype=np.float16)
        tensors[f"medusa_head.{k}.bias"] = np.asarray(b, dtype=np.float16)
    save_file(tensors, path / "model.safetensors")
    D = TARGET.config.hidden_size
    cfg = {"medusa_num_heads": len(heads), "hidden_size": D} if config is None else config
    (path / "config.json").write_text(json.dumps(cfg))


def test_heads_written_to_files_load_back(tmp_path):
    rng = np.random.default_rng(3)
    D = TARGET.config.hidden_size
    heads = [(rng.normal(0, 0.2, (D, D)), rng.normal(0, 0.2, D)) for _ in range(3)]
    _write(tmp_path / "m", heads)
    drafter = load_medusa(tmp_path / "m", TARGET, (2, 1))
    for (w, b), (w2, b2) in zip(heads, drafter.heads):
        np.testing.assert_allclose(w2.T, np.float16(w), atol=1e-6)
        np.testing.assert_allclose(b2, np.float16(b), atol=1e-6)
        # kept as stored on the CPU (the kernel widens them in registers), else float32
        assert w2.dtype == (np.float16 if kernel_available() else np.float32)
    # the same guesses, bit for bit, as the same values held in float32
    wide = load_medusa(tmp_path / "m", TARGET, (2, 1))
    wide.heads = [(np.ascontiguousarray(w.T, dtype=np.float32).T, b) for w, b in wide.heads]
    prompt = [3, 17, 5, 8]
    h = TARGET.hidden_states(prompt, TARGET.new_cache(8))
    for d in (drafter, wide):
        d.accept(prompt, h)
    np.testing.assert_array_equal(drafter.guesses(), wide.guesses())


def test_bad_heads_are_named(tmp_path):
    D = TARGET.config.hidden_size
    good = [(np.zeros((D, D)), np.zeros(D))]
    with pytest.raises(MinispecError, match="not a Medusa heads directory"):
        load_medusa(tmp_path / "nothing", TARGET)
    _write(tmp_path / "a", good, {"medusa_num_heads": "4", "hidden_size": D})
    with pytest.raises(MinispecError, match="medusa_num_heads"):
        load_medusa(tmp_path / "a", TARGET)
    _write(tmp_path / "b", good, {"medusa_num_heads": 1, "hidden_size": D + 1})
    with pytest.raises(MinispecError, match="width"):
        load_medusa(tmp_path / "b", TARGET)
    _write(tmp_path / "c", good, {"medusa_num_heads": 2, "hidden_size": D})
    with pytest.raises(MinispecError, match="missing"):
        load_medusa(tmp_path / "c", TARGET)
    _write(tmp_path / "d", [(np.full((D, D), np.inf), np.zeros(D))])
    with pytest.raises(MinispecError, match="infinite"):
        load_medusa(tmp_path / "d", TARGET)
    with pytest.raises(MinispecError, match="only 1 heads"):
        MedusaDrafter(TARGET, good, (1, 1))
    with pytest.raises(MinispecError, match="weight"):
        MedusaDrafter(TARGET, [(np.zeros((D, 3)), np.zeros(D))])


@pytest.mark.skipif(not (WEIGHTS / "medusa" / "model.safetensors").exists(),
                    reason="weights/medusa is not there (python weights/train_heads.py)")
def test_the_shipped_heads_draft_for_the_shipped_target_exactly():
    target = minispec.load(WEIGHTS / "target", device="cpu")
    ids = target.tokenizer.encode("def fibonacci(n):\n    ")
    base = minispec.autoregressive_generate(target, ids, max_new_tokens=32, temperature=0.0)
    for tree in ((1, 1, 1, 1), (3, 2, 1, 1)):
        drafter = minispec.make_drafter("medusa", target, tree=tree)
        out = minispec.speculative_generate(target, drafter, ids, gamma=4, max_new_tokens=32,
                                            temperature=0.0)
        assert out.tokens == base.tokens
