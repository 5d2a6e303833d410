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
from minispec.loader import random_model, save_checkpoint

torch = pytest.importorskip("torch", reason="the training recipe needs torch (pip install "
                                            "'.[train]')")
RECIPE = Path(__file__).resolve().parents[1] / "weights" / "train_heads.py"


def _recipe():
    spec = importlib.util.spec_from_file_location("train_heads", RECIPE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _tiny_target():
    """A random tiny target and the shape of an EAGLE layer for it (the recipe's `shape`)."""
    target = random_model(tiny_config(), seed=0, scale=0.5)
    c = target.config
    shape = {"hidden_size": c.hidden_size, "num_attention_heads": c.n_heads,
             "num_key_value_heads": c.n_kv_heads, "head_dim": c.head_dim,
             "intermediate_size": c.intermediate_size, "rms_norm_eps": c.norm_eps,
             "rope_theta": c.rope_theta}
    return target, shape


@pytest.mark.parametrize("gains", [(1.0, 1.0), (1.0, 30.0)])
def test_a_trained_head_drafts_in_minispec_what_it_drafted_in_training(tmp_path, gains):
    th, target, shape = _recipe(), *_tiny_target()
    D = shape["hidden_size"]
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
    hidden = target.hidden_states(np.array(context[:-1]), cache)  # f_0..f_{n-2}
    drafter.start(context, cache)
    drafter.accept(context, hidden)
    draft = drafter.propose(context, 2, minispec.Sampling(1.0).warp, np.random.default_rng(1))
    d1 = int(draft.tokens[0])

    # torch, as training computes it (weights rounded to F16 as saved)
    with torch.no_grad():
        for p in list(layer.parameters()) + list(fc.parameters()):
            p.copy_(p.half().float())
        embed = torch.nn.Embedding.from_pretrained(
            torch.from_numpy(np.array(to_host(target.weights["embed"]), dtype=np.float32)))
        f = torch.zeros(1, n + 1, D)
        f[0, : n - 1] = torch.from_numpy(np.asarray(to_host(hidden), dtype=np.float32))
        x = torch.tensor([context + [d1]])
        g0, g1 = th.eagle_unroll(layer, fc, embed, f, x, 2)

        def q(g):  # the target's final norm and LM head, as both sides use them
            return softmax(np.asarray(to_host(target.lm_head(g.numpy()[None])))[0])

        # row i of step s guesses f_{i+1}: step 0's row n-2 drafts x_n, step 1's row n-1 x_{n+1}
        q_torch = [q(g0[0, n - 2]), q(g1[0, n - 1])]
    for got, want in zip(draft.q, q_torch):
        np.testing.assert_allclose(got, want, atol=2e-3)
        assert 0.5 * np.abs(got - want).sum() < 5e-3  # the same distribution
        assert want.max() < 0.99  # spread out: the comparison is of whole distributions


def test_acceptance_counts_what_minispecs_drafter_drafts(tmp_path):
    """The "acceptance" table the recipe writes (what eagle's stop rule reads) counts, for chain
    step 1, exactly the drafts minispec's drafter makes from the same context: their confidence
    bins, how many equal the target's greedy token and their 1 - TV; step 2 counts only the
    chain starts whose first draft matched."""
    th, target, shape = _recipe(), *_tiny_target()
    c, D = target.config, shape["hidden_size"]
    torch.manual_seed(1)
    layer, fc = th.build_layer(shape), th.gained_linear(2 * D, D, (1.0, 1.0))
    with torch.no_grad():  # a head that guesses the next feature is the current one, plus
        for prm in layer.parameters():  # a little noise: right where the greedy text repeats
            if prm.ndim == 2:
                prm.normal_(0, 0.1 / prm.shape[1] ** 0.5)
        fc.weight.copy_(torch.cat([torch.eye(D), torch.zeros(D, D)], dim=1))
        fc.bias.zero_()
    th.save_eagle(tmp_path, layer, fc, shape, {"target": {"model_type": "llama"}})
    layer, fc, _ = th.load_eagle_torch(tmp_path, shape)  # as saved (F16), as minispec reads it
    drafter = load_eagle(tmp_path, target)

    seqs, feats, starts = [], [], []
    for prompt in ([12] * 3, [15] * 3, [24] * 3, [33] * 3):  # greedy text that repeats itself
        out = minispec.autoregressive_generate(target, prompt, max_new_tokens=14,
                                               temperature=0.0)
        seq = np.array(prompt + out.tokens)
        hidden = np.asarray(to_host(target.hidden_states(seq, target.new_cache(64))),
                            dtype=np.float32)
        seqs.append(seq)
        feats.append(torch.from_numpy(hidden))
        starts.append(len(prompt))
    w = target.weights
    embed = torch.nn.Embedding.from_pretrained(torch.from_numpy(np.array(to_host(w["embed"]))))
    norm_w = torch.from_numpy(np.asarray(to_host(w["norm_w"]), dtype=np.float32))

    def norm(h):
        return h * torch.rsqrt((h * h).mean(-1, keepdim=True) + c.norm_eps) * norm_w

    lm_head = torch.from_numpy(np.array(to_host(w["lm_head"]).T))  # a copy: the weights
    # are read-only once the CPU kernel has multiplied them
    table = th.acceptance(layer, fc, embed, norm, lm_head, torch.arange(c.vocab_size), seqs,
                          feats, starts, steps=2)

    # minispec: every chain start c of the generated text, one draft from x_0..x_{c+1}; where the
    # target's token is among the head's top 4 (a tree would hold it), the next step's draft too,
    # after that token (a warp that makes the first draft it)
    edges, R = np.array(th.CONFIDENCE_EDGES), th.RANKS

    def bin_of(q):
        return min(np.searchsorted(edges, q.max()), len(edges) - 1)

    count, hit, kept = np.zeros(len(edges)), 0, 0.0
    tried, rank_hit, rank_p = np.zeros(len(edges)), np.zeros(R), np.zeros(R)
    for seq, f, L in zip(seqs, feats, starts):
        for start in range(max(L - 2, 0), len(seq) - 3):  # x_{c+2} generated, steps fit
            context = [int(t) for t in seq[: start + 2]]
            for step in (0, 1):
                forced = []

                def warp(logits):  # step 1: the first draft is the target's token
                    forced.append(1)
                    if step == 1 and len(forced) == 1:
                        return np.eye(logits.shape[1])[[seq[start + 2]]]
                    return minispec.Sampling(1.0).warp(logits)

                drafter.start(context, target.new_cache(64))
                drafter.accept(context, f[: start + 1].numpy())
                q = drafter.propose(context, step + 1, warp, np.random.default_rng(0)).q[step]
                h = f[start + 1 + step:start + 2 + step].numpy()
                p = softmax(np.asarray(to_host(target.lm_head(h)))[0])
                y = seq[start + 2 + step]
                top = np.argsort(-q, kind="stable")[:R]
                if step == 0:
                    count[bin_of(q)] += 1
                    hit += int(top[0] == y)
                    kept += np.minimum(p, q).sum()
                tried[bin_of(q)] += 1
                rank_hit += top == y
                rank_p += p[top]
                if y not in top:
                    break
    assert table["counts"][0] == count.tolist()
    assert 10 <= hit <= count.sum() - 10  # many drafts match, many do not
    # the rates are smoothed (made monotone), which keeps their count-weighted sum
    np.testing.assert_allclose(np.dot(table["counts"][0], table["greedy"][0]), hit, atol=0.01)
    np.testing.assert_allclose(np.dot(table["counts"][0], table["sampled"][0]), kept,
                               rtol=2e-3)
    assert sum(table["counts"][1]) == hit  # step 2: only where step 1 matched
    # on sampled text a start counts at step 2 with the chance a sampled chain got there
    soft = th.acceptance(layer, fc, embed, norm, lm_head, torch.arange(c.vocab_size), seqs,
                         feats, starts, steps=2, sampled_text=True)
    assert soft["counts"][0] == table["counts"][0]
    np.testing.assert_allclose(sum(soft["counts"][1]), kept, atol=0.5)  # rounded to 0.1 a bin
    assert table["counts_by_rank"] == tried.tolist() and tried.sum() > count.sum()
    for r in range(R):
        np.testing.assert_allclose(np.dot(tried, table["greedy_by_rank"][r]), rank_hit[r],
                                   atol=0.01)
        np.testing.assert_allclose(np.dot(tried, table["sampled_by_rank"][r]), rank_p[r],
                                   rtol=2e-3)
    assert rank_hit[1:].sum() > 0  # the target's token is sometimes a lower-ranked candidate
    for kind in ("greedy", "sampled"):
        assert all(np.diff(row).min() >= 0 for row in table[kind])
        assert np.diff(table[f"{kind}_by_rank"][0]).min() >= 0
        assert all(np.diff(row).max() <= 0 for row in table[f"{kind}_by_rank"][1:])


FILES = [(f"pkg/mod{i}.py", f'''"""{"A module about parsing things. " * 6}"""


def parse_{i}(text, strict=False):
    """Split the text into fields.

    {"They come back as a list of strings, stripped when strict is true. " * 3}"""
    fields = text.split(",")
    if strict:
        fields = [f.strip() for f in fields]
    return fields


class Reader{i}:
    def read_{i}(self, path):
        with open(path) as f:
            return f.read()
''') for i in range(30)]


def test_mix_prompts_give_each_kind_its_share_and_repeat_only_sampled():
    th = _recipe()
    n = 400
    prompts, sampled, held = th.mix_prompts(FILES[:25], FILES[25:], n, 12,
                                            np.random.default_rng(0))
    assert len(prompts) == len(sampled) == sum(round(v * n) for v in th.MIX.values())

    def kind(p):
        if "Write a Python function:" in p:
            return "docs"
        if any(a in p for a in th.EDIT_ASKS):
            return "edit"
        if any(a in p for a in th.TEXT_ASKS):
            return "grounded"
        if any(a in p for a in th.CODE_ASKS) or not p.startswith("<|im_start|>"):
            return "code"
        return "chat"

    counts = {}
    for p in prompts:
        counts[kind(p)] = counts.get(kind(p), 0) + 1
    assert counts == {k: round(v * n) for k, v in th.MIX.items()}
    greedy = {}
    for p, s in zip(prompts, sampled):
        greedy[p] = greedy.get(p, 0) + (not s)
    assert max(greedy.values()) <= 1  # no greedy continuation is made twice
    assert 0.3 < sum(greedy.values()) / len(greedy) < 0.7  # the distinct prompts: half greedy
    assert all(th.bench_free(p) for p in prompts)
    assert not set(held) & set(prompts) and len(held) == 12


def test_generate_makes_greedy_and_sampled_batches_and_stops_at_its_deadline():
    transformers = pytest.importorskip(
        "transformers", reason="the recipe generates with transformers (pip install '.[train]')")
    th = _recipe()
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                                      num_hidden_layers=1, num_attention_heads=2,
                                      num_key_value_heads=1, max_position_embeddings=64)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    prompts = [[1, 2, 3], [4, 5], [6, 7, 8, 9], [1, 5], [2, 2, 2], [3, 9]]
    flags = [False, True, False, True, True, True]
    out = th.generate(model, prompts, batch=2, new_tokens=5, eos=(), pad=0, seed=0,
                      sampled=flags)
    assert sorted(list(s[:L]) for s, L in out) == sorted(prompts)
    assert all(len(s) == L + 5 for s, L in out)
    greedy = {tuple(s[:L]): list(s) for s, L in th.generate(model, prompts, batch=6,
                                                           new_tokens=5, eos=(), pad=0, seed=0,
                                                           greedy_only=True)}
    made = {tuple(s[:L]): list(s) for s, L in out}
    for p, f in zip(prompts, flags):
        if not f:  # a greedy batch's continuation is the model's argmax path
            assert made[tuple(p)] == greedy[tuple(p)]
    assert not all(made[tuple(p)] == greedy[tuple(p)] for p, f in zip(prompts, flags) if f)
    once = th.generate(model, prompts, batch=2, new_tokens=5, eos=(), pad=0, seed=0,
                       sampled=flags, seconds=0.0)
    assert len(once) == 2  # no batch starts after the deadline; the first always runs


def _cached_target(tmp_path):
    """A tiny random Llama written to disk (a word-level tokenizer beside it) and a data cache of
    its sampled continuations: what train_heads.py reads instead of making data."""
    from tokenizers import Tokenizer, models
    from transformers import LlamaForCausalLM

    target = random_model(tiny_config(vocab_size=24, max_position_embeddings=64), seed=3,
                          scale=1.0)
    save_checkpoint(target, tmp_path / "target")
    Tokenizer(models.WordLevel({"<|endoftext|>": 0, "a": 1}, unk_token="a")).save(
        str(tmp_path / "target" / "tokenizer.json"))
    rng = np.random.default_rng(0)
    seqs = []
    for i in range(24):
        prompt = [int(t) for t in rng.integers(3, 24, 4)]
        out = minispec.autoregressive_generate(target, prompt, max_new_tokens=16,
                                               temperature=1.0, seed=i)
        seqs.append((np.array(prompt + list(out.tokens), dtype=np.int64), 4))
    hf = LlamaForCausalLM.from_pretrained(str(tmp_path / "target"), dtype=torch.float32).eval()
    feats = _recipe().features(hf, [s for s, _ in seqs])
    torch.save({"train": seqs[:16], "feats": feats[:16], "eval": seqs[16:],
                "eval_feats": feats[16:]}, tmp_path / "data.pt")
    return ["--target", str(tmp_path / "target"), "--data-cache", str(tmp_path / "data.pt"),
            "--batch", "4", "--ttt", "2", "--seed", "0"]


def test_epochs_0_measures_a_saved_head_as_training_would_start_from_it(tmp_path, capsys):
    pytest.importorskip("transformers", reason="the training recipe needs transformers (pip "
                                               "install '.[train]')")
    th, args = _recipe(), _cached_target(tmp_path)
    th.main(args + ["--eagle-epochs", "3", "--out-eagle", str(tmp_path / "e"),
                    "--medusa-epochs", "3", "--out-medusa", str(tmp_path / "m")])
    capsys.readouterr()

    def line(out, start):
        return next(x for x in out.splitlines() if x.startswith(start))

    # measured only: the held-out figures, and nothing written
    th.main(args + ["--init-eagle", str(tmp_path / "e"), "--eagle-epochs", "0",
                    "--init-medusa", str(tmp_path / "m"), "--medusa-epochs", "0",
                    "--out-eagle", str(tmp_path / "e0"), "--out-medusa", str(tmp_path / "m0")])
    out = capsys.readouterr().out
    measured = line(out, "eagle: greedy chain of 4").split(" accepted")[0]
    medusa = line(out, "medusa: greedy chain of 4").split(" accepted")[0]
    assert not (tmp_path / "e0").exists() and not (tmp_path / "m0").exists()
    # a run continued from those heads starts from the same figures on the same held-out set
    th.main(args + ["--init-eagle", str(tmp_path / "e"), "--eagle-epochs", "1",
                    "--out-eagle", str(tmp_path / "e1")])
    before = line(capsys.readouterr().out, "eagle before training").split(" accepted")[0]
    assert before.endswith(measured.split(": ")[-1]), (before, measured)
    th.main(args + ["--init-medusa", str(tmp_path / "m"), "--medusa-lr", "1e-12",
                    "--medusa-epochs", "0.25", "--out-medusa", str(tmp_path / "m1")])
    again = line(capsys.readouterr().out, "medusa: greedy chain of 4").split(" accepted")[0]
    assert again == medusa  # a step of lr 1e-12 changes no argmax

    with pytest.raises(SystemExit, match="--eagle-epochs: expected .* 0 with --init-eagle"):
        th.main(args + ["--eagle-epochs", "0", "--out-eagle", str(tmp_path / "x")])
