"""EAGLE (minispec/drafters/eagle.py): greedy decoding identical to the target's for chains,
static and dynamic trees and every family; the cached drafting equal to a recompute from
scratch; files read back; bad files named; the shipped head."""

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import FAMILIES, tiny_config

import minispec
from minispec.backend import kernel_available, to_host
from minispec.drafters.eagle import close_under_ancestors, load_eagle, random_eagle
from minispec.errors import MinispecError
from minispec.loader import random_model
from minispec.safetensors import save_file

WEIGHTS = Path(__file__).resolve().parents[1] / "weights"
TARGET = random_model(tiny_config(), seed=0, scale=0.5)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("tree", [{}, {"shape": (2, 2, 1)}, {"shape": (3, 2, 2),
                                                             "dynamic": (2, 6)}])
def test_greedy_eagle_is_autoregressive_decoding(family, tree):
    target = random_model(tiny_config(family), seed=0, scale=0.5)
    drafter = random_eagle(target, seed=1, **tree)
    for prompt, out, base in _greedy_both_ways(target, drafter, ([3, 17, 5], [9] * 11), 30):
        assert out.tokens == base.tokens
        assert out.stats.rounds[0].drafted == []  # no features before the first target call


def _greedy_both_ways(target, drafter, prompts, max_new_tokens):
    """(prompt, speculative result, autoregressive result) for each prompt, greedy, gamma 4."""
    for prompt in prompts:
        base = minispec.autoregressive_generate(target, prompt, max_new_tokens=max_new_tokens,
                                                temperature=0.0)
        out = minispec.speculative_generate(target, drafter, prompt, gamma=4,
                                            max_new_tokens=max_new_tokens, temperature=0.0)
        yield prompt, out, base


def _reference_drafts(target, drafter, context, gamma):
    """EAGLE's greedy chain recomputed from scratch: the target's true features of the
    context, then the layer over every pair with no cache, once per draft."""
    feats = to_host(target.run_layers(target.embed(context, 0), None, 0))  # [n, D]
    pairs_f = [feats[j] for j in range(len(context) - 1)]
    pairs_x = list(context[1:])
    drafts = []
    for _ in range(gamma):
        x = to_host(drafter.fuse(np.array(pairs_f), pairs_x))
        g = to_host(drafter.layer.run_layers(x, None, 0))[-1]
        d = int(np.argmax(to_host(target.lm_head(g[None]))[0][: drafter.vocab_size]))
        drafts.append(d)
        pairs_f.append(g)
        pairs_x.append(d)
    return drafts


def test_cached_drafting_equals_a_recompute_from_scratch():
    drafter = random_eagle(TARGET, seed=2)
    prompt = [3, 17, 5, 8]
    result = minispec.speculative_generate(TARGET, drafter, prompt, gamma=3, max_new_tokens=12,
                                           temperature=0.0)
    # replay: after the generation the drafter's state is that of its last accepted round
    context = prompt + result.tokens
    cache = TARGET.new_cache(64)
    drafter.start(context, cache)
    h = TARGET.hidden_states(context, cache)  # as a verify call would have computed them
    drafter.accept(context + [0], h)  # features of positions 0..len(context)-1
    context = context + [int(np.argmax(to_host(TARGET.lm_head(h[-1:]))[0]))]
    warp = minispec.Sampling(0.0).warp
    got = drafter.propose(context, 4, warp, np.random.default_rng(0)).tokens.tolist()
    assert got == _reference_drafts(TARGET, drafter, context, 4)


def test_dynamic_trees_keep_ancestors():
    assert close_under_ancestors([3, 4], [-1, 0, 1, 2, 0]) == [0, 1, 2, 3, 4]
    assert close_under_ancestors([0, 1], [-1, -1, 0]) == [0, 1]


def _write(path, drafter, config=None, drop=None, poison=False, dtype=np.float32):
    path.mkdir(parents=True, exist_ok=True)
    layer = drafter.layer.weights["layers"][0]
    c = drafter.layer.config
    H, K, E = c.n_heads, c.n_kv_heads, c.head_dim
    wqkv = to_host(layer["wqkv"])
    t = {"fc.weight": to_host(drafter.fc_w).T, "fc.bias": to_host(drafter.fc_b),
         "model.layers.0.input_layernorm.weight": to_host(layer["attn_norm_w"]),
         "model.layers.0.self_attn.q_proj.weight": wqkv[:, : H * E].T,
         "model.layers.0.self_attn.k_proj.weight": wqkv[:, H * E:(H + K) * E].T,
         "model.layers.0.self_attn.v_proj.weight": wqkv[:, (H + K) * E:].T,
         "model.layers.0.self_attn.o_proj.weight": to_host(layer["wo"]).T,
         "model.layers.0.post_attention_layernorm.weight": to_host(layer["mlp_norm_w"]),
         "model.layers.0.mlp.gate_proj.weight": to_host(layer["w_gate"]).T,
         "model.layers.0.mlp.up_proj.weight": to_host(layer["w_up"]).T,
         "model.layers.0.mlp.down_proj.weight": to_host(layer["w_down"]).T}
    if drop:
        del t[drop]
    if poison:
        t["fc.bias"] = np.full_like(t["fc.bias"], np.nan)
    save_file({k: np.ascontiguousarray(v, dtype=dtype) for k, v in t.items()},
              path / "model.safetensors")
    cfg = {"hidden_size": c.hidden_size, "num_attention_heads": H, "num_key_value_heads": K,
           "head_dim": E, "intermediate_size": c.intermediate_size, "rms_norm_eps": c.norm_eps}
    (path / "config.json").write_text(json.dumps({**cfg, **(config or {})}))


def test_a_head_written_to_files_drafts_the_same_and_bad_files_are_named(tmp_path):
    drafter = random_eagle(TARGET, seed=3)
    _write(tmp_path / "ok", drafter)
    loaded = load_eagle(tmp_path / "ok", TARGET)
    prompt = [3, 17, 5, 8, 8, 1]
    a = minispec.speculative_generate(TARGET, drafter, prompt, gamma=3, max_new_tokens=16,
                                      temperature=0.0)
    b = minispec.speculative_generate(TARGET, loaded, prompt, gamma=3, max_new_tokens=16,
                                      temperature=0.0)
    assert [r.drafted for r in a.stats.rounds] == [r.drafted for r in b.stats.rounds]

    with pytest.raises(MinispecError, match="not an EAGLE head directory"):
        load_eagle(tmp_path / "nothing", TARGET)
    _write(tmp_path / "a", drafter, config={"hidden_size": "32"})
    with pytest.raises(MinispecError, match="hidden_size"):
        load_eagle(tmp_path / "a", TARGET)
    _write(tmp_path / "b", drafter, drop="fc.bias")
    with pytest.raises(MinispecError, match="missing"):
        load_eagle(tmp_path / "b", TARGET)
    _write(tmp_path / "c", drafter, poison=True)
    with pytest.raises(MinispecError, match="infinite"):
        load_eagle(tmp_path / "c", TARGET)
    for field in ("rms_norm_eps", "rope_theta"):  # JSON integers too big for any float
        _write(tmp_path / field, drafter, config={field: 10**400})
        with pytest.raises(MinispecError, match=f"'{field}': an integer of 401 digits"):
            load_eagle(tmp_path / field, TARGET)
    with pytest.raises(MinispecError, match="dynamic"):
        random_eagle(TARGET, dynamic=(2, 6))


def test_a_float16_head_is_kept_as_stored_and_drafts_as_its_float32_copy(tmp_path):
    # on the CPU with the kernel, the head's matrices (its layer's and fc) stay float16, as a
    # model's do, widened in registers: the same logits, bit for bit, as the same values held
    # in float32 (each product sums in the same order)
    _write(tmp_path / "h", random_eagle(TARGET, seed=5), dtype=np.float16)
    kept, wide = load_eagle(tmp_path / "h", TARGET), load_eagle(tmp_path / "h", TARGET)
    wide.fc_w = np.ascontiguousarray(wide.fc_w.T, dtype=np.float32).T
    for name, w in wide.layer.weights["layers"][0].items():
        if isinstance(w, np.ndarray) and w.ndim == 2:
            wide.layer.weights["layers"][0][name] = np.ascontiguousarray(w.T, np.float32).T
    if kernel_available():
        assert kept.fc_w.dtype == kept.layer.weights["layers"][0]["w_up"].dtype == np.float16
    prompt = [3, 17, 5, 8, 8, 1]
    cache = TARGET.new_cache(32)
    feats = TARGET.hidden_states(prompt, cache)
    for d in (kept, wide):
        d.start(prompt, cache)
        d.accept(prompt + [4], feats)
    g_kept, g_wide = kept.catch_up(prompt + [4]), wide.catch_up(prompt + [4])
    np.testing.assert_array_equal(g_kept, g_wide)
    np.testing.assert_array_equal(kept.draft_head(g_kept), wide.draft_head(g_wide))
    runs = [minispec.speculative_generate(TARGET, d, prompt, gamma=3, max_new_tokens=16,
                                          temperature=1.0, seed=2) for d in (kept, wide)]
    assert runs[0].tokens == runs[1].tokens
    assert [r.drafted for r in runs[0].stats.rounds] == [r.drafted for r in runs[1].stats.rounds]


@pytest.mark.skipif(not (WEIGHTS / "eagle" / "model.safetensors").exists(),
                    reason="weights/eagle is not there (python weights/train_heads.py)")
def test_the_shipped_head_drafts_for_the_shipped_target_exactly():
    target = minispec.load(WEIGHTS / "target", device="cpu")
    ids = target.tokenizer.encode("def fibonacci(n):\n    ")
    base = minispec.autoregressive_generate(target, ids, max_new_tokens=32, temperature=0.0)
    for kw in ({}, {"tree": (2, 2, 1, 1)}, {"tree": (3, 2, 2, 1), "dynamic": (3, 12)}):
        drafter = minispec.make_drafter("eagle", target, **kw)
        out = minispec.speculative_generate(target, drafter, ids, gamma=4, max_new_tokens=32,
                                            temperature=0.0)
        assert out.tokens == base.tokens
        # the head's tied LM head is the target's embedding, not a copy of it (113 MB on SmolLM2)
        assert np.shares_memory(drafter.layer.weights["lm_head"], target.weights["embed"])


def test_eagle_drafts_for_a_batch_with_a_state_per_sequence():
    drafter = random_eagle(TARGET, seed=4)
    prompts = [[3, 17, 5], [9] * 7, [1, 2]]
    out = minispec.generate_batch(TARGET, drafter, prompts, gamma=3, max_new_tokens=15,
                                  temperature=0.0)
    for prompt, r in zip(prompts, out):
        alone = minispec.speculative_generate(TARGET, drafter, prompt, gamma=3,
                                              max_new_tokens=15, temperature=0.0)
        assert r.tokens == alone.tokens
        assert [rd.drafted for rd in r.stats.rounds] == [rd.drafted for rd in alone.stats.rounds]


@pytest.mark.parametrize("tree", [{"shape": (2, 2, 1)}, {"shape": (3, 2, 2), "dynamic": (2, 6)},
                                  {"shape": (4, 3, 2, 2), "dynamic": (3, 12)}])
def test_a_tree_near_the_end_of_the_context_drafts_what_fits(tree):
    # a generation that runs to the context's last position (64 here): the head's tree is cut
    # where its cache ends, then to the target's room (check_draft), never refused
    drafter = random_eagle(TARGET, seed=1, **tree)
    for prompt, out, base in _greedy_both_ways(TARGET, drafter, ([3, 17, 5], [9] * 40), 100):
        assert len(prompt) + len(out.tokens) == 64 and out.tokens == base.tokens
