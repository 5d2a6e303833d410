"""weights/train_heads.py against minispec: an EAGLE head as the recipe trains it (torch, with its
fc gains) and as it saves it drafts the same distributions in minispec's drafter, step 0 (true
features) and step 1 (the head's own guess), which is what the training-time test unrolls."""

import importlib.util
from pathlib import Path

import numpy as np
import pytest
from conftest import tiny_config

import minispec
from minispec.backend import to_host
from minispec.drafters.eagle import load_eagle
from minispec.judge.stats import softmax
from minispec.loader import random_model

torch = pytest.importorskip("torch", reason="the training recipe needs torch (pip install "
                                            "'.[train]')")
RECIPE = Path(__file__).resolve().parents[1] / "weights" / "train_heads.py"


def _recipe():
    spec = importlib.util.spec_from_file_location("train_heads", RECIPE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("gains", [(1.0, 1.0), (1.0, 30.0)])
def test_a_trained_head_drafts_in_minispec_what_it_drafted_in_training(tmp_path, gains):
    th = _recipe()
    target = random_model(tiny_config(), seed=0, scale=0.5)
    c = target.config
    D = c.hidden_size
    shape = {"hidden_size": D, "num_attention_heads": c.n_heads,
             "num_key_value_heads": c.n_kv_heads, "head_dim": c.head_dim,
             "intermediate_size": c.intermediate_size, "rms_norm_eps": c.norm_eps,
             "rope_theta": c.rope_theta}
    torch.manual_seed(0)
    layer = th.build_layer(shape)
    fc = th.gained_linear(2 * D, D, gains)
    with torch.no_grad():  # larger than the init, so that the layer's output is not ~f
        for p in list(layer.parameters()) + list(fc.parameters()):
            if p.ndim == 2:
                p.normal_(0, 0.3 / p.shape[1] ** 0.5)
    th.save_eagle(tmp_path, layer, fc, shape, {"target": {"model_type": "llama"}})
    drafter = load_eagle(tmp_path, target)

    # minispec: features of the context from the target, then a chain of two drafts at T = 1
    context = [3, 17, 5, 8, 8, 1, 9]
    n = len(context)
    cache = target.new_cache(32)
    hidden = target.hidden(np.array(context[:-1]), cache)  # f_0..f_{n-2}
    drafter.start(context, cache)
    drafter.accept(context, hidden)
    draft = drafter.propose(context, 2, minispec.Sampling(1.0).warp, np.random.default_rng(1))
    d1 = int(draft.tokens[0])

    # torch, as training computes it (weights rounded to F16 as saved)
    with torch.no_grad():
        for p in list(layer.parameters()) + list(fc.parameters()):
            p.copy_(p.half().float())
        embed = torch.nn.Embedding.from_pretrained(
            torch.from_numpy(np.asarray(to_host(target.weights["embed"]), dtype=np.float32)))
        f = torch.zeros(1, n + 1, D)
        f[0, : n - 1] = torch.from_numpy(np.asarray(to_host(hidden), dtype=np.float32))
        x = torch.tensor([context + [d1]])
        g0, g1 = th.eagle_unroll(layer, fc, embed, f, x, 2)

        def q(g):  # the target's final norm and LM head, as both sides use them
            return softmax(np.asarray(to_host(target.head(g.numpy()[None])))[0])

        # row i of step s guesses f_{i+1}: step 0's row n-2 drafts x_n, step 1's row n-1 x_{n+1}
        q_torch = [q(g0[0, n - 2]), q(g1[0, n - 1])]
    for got, want in zip(draft.q, q_torch):
        np.testing.assert_allclose(got, want, atol=2e-3)
        assert 0.5 * np.abs(got - want).sum() < 5e-3  # the same distribution
        assert want.max() < 0.99  # spread out: the comparison is of whole distributions
