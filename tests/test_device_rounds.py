"""Whole rounds on the device (minispec/device_rounds.py): greedy output identical to
autoregressive decoding for every family, drafter and device; sampled output distributed as the
target's exact law (with a control showing the test can fail); the device's random numbers,
top-k and top-p against Sampling.warp; the CUDA graph against the same rounds launched op by op;
bad arguments named."""

import numpy as np
import pytest
from conftest import FAMILIES, GPU, tiny_config

import minispec
from minispec import device_rounds as dr
from minispec.backend import to_host
from minispec.core.sampling import Sampling, warp
from minispec.core.speculative import Request
from minispec.device_rounds import DeviceRounds
from minispec.drafters.eagle import random_eagle
from minispec.errors import MinispecError
from minispec.judge.selftest import tiny_models
from minispec.judge.stats import E2E, exact_joint, joint_row
from minispec.loader import random_model


def _pair(family, device, kind):
    """A tiny target of `family` and its drafter of `kind` ("model": the target's weights drawn
    at a smaller scale, which agrees with it often but not always; "eagle": a random head; or
    None)."""
    target = random_model(tiny_config(family), seed=0, scale=0.5, device=device)
    if kind == "model":
        return target, random_model(tiny_config(family), seed=0, scale=0.4, device=device)
    return target, (random_eagle(target, seed=1) if kind == "eagle" else None)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("kind", ["model", "eagle", None])
def test_greedy_device_rounds_are_autoregressive_decoding(family, kind, device):
    target, drafter = _pair(family, device, kind)
    if device == "gpu":  # the baseline on the same fused kernels as the rounds' graphs
        from minispec import cuda_graphs

        cuda_graphs.enable(target)
    rounds = DeviceRounds(target, drafter, gamma=4, max_len=64)
    kept = []
    for prompt in ([3, 17, 5], [9] * 11, [7]):
        base = minispec.autoregressive_generate(target, prompt, max_new_tokens=30,
                                                temperature=0.0)
        out = rounds.generate(prompt, Sampling(0.0), Request(30))
        assert out.tokens == base.tokens, (prompt, out.tokens, base.tokens)
        st = out.stats
        assert st.new_tokens == 30 and st.target_calls == len(st.rounds)
        kept += [r.accepted for r in st.rounds]
    if kind == "model":  # rounds that kept some drafts, all, and none: every path was taken
        assert 0 in kept and 4 in kept and any(0 < a < 4 for a in kept), kept
    eos = base.tokens[5]  # stops after an EOS, kept, as the loop does
    out = rounds.generate([7], Sampling(0.0), Request(30, eos_token_ids=(eos,)))
    assert out.tokens == base.tokens[:base.tokens.index(eos) + 1] and out.stop_reason == "eos"


@pytest.mark.parametrize("kind, cfg", [
    ("model", E2E(1.5, top_k=2, L=3)), ("model", E2E(1.0, top_p=0.8, L=2)),
    # a random EAGLE head: over the whole vocabulary its q overlaps p (with a top-k its few
    # tokens are mostly not the target's, every draft rejected and the control blind)
    ("eagle", E2E(1.0, L=2)), ("eagle", E2E(0.7, L=3))])
def test_sampled_device_rounds_emits_the_targets_law(kind, cfg):
    models = tiny_models()
    target = models["target"]
    drafter = models["near"] if kind == "model" else random_eagle(target, seed=3)
    rounds = DeviceRounds(target, drafter, gamma=3, max_len=32)
    prompt = [4, 2, 11, 7, 4, 2, 11]
    law = exact_joint(target, prompt, cfg)
    sampling = Sampling(cfg.temperature, cfg.top_k, cfg.top_p)

    def samples(n=600):
        return [tuple(rounds.generate(prompt, sampling, Request(cfg.L, seed=s)).tokens)
                for s in range(n)]

    fit = joint_row("G", kind, law, samples()).fit
    assert fit.pvalue > 1e-3, fit
    # the control: a verify step that keeps every draft must fail the same test
    keep_all = dr.verify_rows
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(dr, "verify_rows", lambda xp, p, q, d, ua, ut: keep_all(
            xp, p, q, d, ua * 0.0, ut))
        bad = joint_row("G", kind, law, samples(300)).fit
    assert bad.pvalue < 1e-6, bad


def test_the_device_verify_step_leaves_each_token_distributed_as_the_target():
    rng = np.random.default_rng(0)
    V, g, n = 5, 2, 20000
    p = rng.dirichlet(np.ones(V), size=g + 1)
    q = rng.dirichlet(np.ones(V) * 0.5, size=g)
    first = np.zeros(V)
    second = np.zeros(V)  # the second token, where the first draft was kept
    for i in range(n):
        drafts = np.array([rng.choice(V, p=q[j]) for j in range(g)])
        with np.errstate(divide="ignore"):  # log(0): a token the residual excludes
            k, emitted = dr.verify_rows(np, p, q, drafts, rng.random(g), rng.random(V))
        first[emitted[0]] += 1
        if k >= 1:
            second[emitted[1]] += 1
    assert np.abs(first / n - p[0]).max() < 0.015
    # P(second = x, first draft kept) = P(d1 kept) * p_1(x): kept with prob sum min(q0, p0)
    kept = np.minimum(p[0], q[0]).sum()
    assert np.abs(second / n - kept * p[1]).max() < 0.015


def test_the_device_random_numbers_are_uniform_and_keyed():
    iota = np.arange(200000, dtype=np.uint64)
    key = np.array([dr.stream_key(7)])
    u = dr.uniforms(key, np.array([3]), iota)
    assert 0 < u.min() and u.max() < 1
    counts = np.histogram(u, bins=20, range=(0, 1))[0]
    chi2 = ((counts - 10000) ** 2 / 10000).sum()
    assert chi2 < 45  # 19 degrees of freedom: p ~ 1e-3
    assert abs(np.corrcoef(u[:-1], u[1:])[0, 1]) < 0.01
    assert np.array_equal(u, dr.uniforms(key, np.array([3]), iota))  # the same draw again
    nxt = dr.uniforms(key, np.array([4]), iota)  # the next round
    other = dr.uniforms(np.array([dr.stream_key(8)]), np.array([3]), iota)  # another seed
    for v in (nxt, other):
        assert not (u == v).any() and abs(np.corrcoef(u, v)[0, 1]) < 0.01


def test_top_k_and_top_p_on_the_device_keep_the_tokens_sampling_warp_keeps():
    rng = np.random.default_rng(1)
    for trial in range(200):
        V = int(rng.integers(2, 40))
        x = rng.normal(size=(3, V)).astype(np.float32)
        if trial % 3 == 0:
            x = np.round(x * 2) / 2  # ties at the cut
        if trial % 5 == 0 and V > 3:
            x[:, : V // 2] = -np.inf
        t, k = float(rng.uniform(0.3, 2)), int(rng.integers(0, V))
        top_p = 1.0 if trial % 2 else float(rng.uniform(0.05, 1))
        with np.errstate(all="ignore"):
            got = dr.warp_rows(np, x, np.array([t]), k, top_p)
        want = warp(x, t, k, top_p)
        assert np.array_equal(got > 0, want > 0), trial
        np.testing.assert_allclose(got, want, atol=1e-12)


def test_bad_arguments_are_named():
    target, draft = _pair("llama", "cpu", "model")
    with pytest.raises(MinispecError, match="gamma"):
        DeviceRounds(target, draft, gamma=0)
    with pytest.raises(MinispecError, match="max_len"):
        DeviceRounds(target, draft, max_len=1000)  # past the models' 64 positions
    with pytest.raises(MinispecError, match="drafter must be"):
        DeviceRounds(target, "ngram")
    with pytest.raises(MinispecError, match="plain chain"):
        DeviceRounds(target, random_eagle(target, seed=1, shape=(2, 1)))
    rounds = DeviceRounds(target, draft, gamma=4, max_len=40)
    with pytest.raises(MinispecError, match="max_len >= 45"):
        rounds.generate([3] * 10, Sampling(0.0), Request(30))
    with pytest.raises(MinispecError, match="prompt_ids"):
        rounds.generate([], Sampling(0.0), Request(3))


@pytest.mark.gpu
def test_a_graphed_round_on_the_gpu_draws_what_the_same_round_launched_op_by_op_draws():
    if not GPU:
        pytest.skip("CuPy/NVIDIA GPU not available")
    for kind in ("model", "eagle"):
        target, drafter = _pair("llama", "gpu", kind)
        graphed = DeviceRounds(target, drafter, gamma=3, max_len=64)
        plain = DeviceRounds(target, drafter, gamma=3, max_len=64, graphs=False)
        for seed in range(3):
            request = Request(40, seed=seed)
            a = graphed.generate([3, 17, 5], Sampling(1.0, 10), request)
            b = plain.generate([3, 17, 5], Sampling(1.0, 10), request)
            assert a.tokens == b.tokens
            assert [r.accepted for r in a.stats.rounds] == [r.accepted for r in b.stats.rounds]
        assert to_host(graphed.length)[0] > 3


def test_the_drafters_table_runs_the_device_rows_beside_the_loop():
    from minispec.measure import drafters as table

    labels = [label for label, _ in table.device_rows(table.select_rows("eagle", True)[0])]
    assert labels == ["autoregressive (device)", "eagle (device)"]
    assert table.device_rows(table.select_rows("ngram", True)[0]) == []
    target, draft = _pair("llama", "cpu", "model")
    rows = table.side_by_side(target, draft, [[3, 17, 5], [9] * 11], temperature=0.0,
                              max_new_tokens=12, rows=[], device_rows=table.DEVICE_ROWS[:2])
    by = {r["method"]: r for r in rows}
    assert list(by) == ["autoregressive", "autoregressive (device)", "model (device)"]
    assert by["model (device)"]["identical"] and by["autoregressive (device)"]["identical"]
    assert by["model (device)"]["tokens_per_target_call"] > 1.0
    assert by["autoregressive (device)"]["tokens_per_target_call"] == 1.0
