"""The workloads (minispec/workloads.py, weights/workloads/) and the drafter tuned on them, auto
(minispec/drafters/auto.py). Each prompt set has its benchmark prompts and its held-out ones,
chat turns wrapped in ChatML, none from the heads' training text; the table and plot of
`--workload all` read the reports they are given. Auto drafts by lookup exactly where the
context's suffix recurs (checked against a plain search) and with its head elsewhere, its copy
length adapts to what was kept, greedy output is autoregressive decoding's (one sequence or a
batch), sampled output keeps the target's law and the same test rejects lookup drafts reported
with the wrong q."""

import ast
import json
from pathlib import Path

import numpy as np
import pytest
from conftest import lookup_by_search, lookups_by_search, tiny_config
from drafters_for_tests import Wrapping
from stats_helpers import sample_joint

import minispec
from minispec.backend import blas_threads
from minispec.drafters import (
    AUTO_GAMMA,
    PRESET_GAMMA,
    PRESETS,
    AutoDrafter,
    EagleDrafter,
    find_ngrams,
    make_drafter,
    random_eagle,
)
from minispec.errors import MinispecError
from minispec.loader import random_model
from minispec.measure.harness import load_prompts
from minispec.workloads import (
    CHAT,
    WORKLOADS,
    by_workload,
    format_by_workload,
    load_workload,
    plot_by_workload,
    workload_names,
    write_prompts,
)

ROOT = Path(__file__).resolve().parents[1]
TARGET = random_model(tiny_config(), seed=0, scale=0.5)
# text that repeats: the target's own greedy continuation of a short prompt (a tiny random model
# soon loops), so lookups find something to copy and the target often agrees with the copy
LOOP = [3, 17, 5] + minispec.autoregressive_generate(TARGET, [3, 17, 5], max_new_tokens=12,
                                                     temperature=0.0).tokens


def _training_prompts() -> set[str]:
    """The chat requests weights/train_heads.py trains the heads on (templates x topics), read
    from its source (it imports torch)."""
    tree = ast.parse((ROOT / "weights" / "train_heads.py").read_text())
    lists = {t.id: ast.literal_eval(node.value) for node in tree.body
             if isinstance(node, ast.Assign) for t in node.targets
             if isinstance(t, ast.Name) and t.id in ("TEMPLATES", "TOPICS", "HELD_TEMPLATES",
                                                     "HELD_TOPICS")}
    return {t.format(x) for ts, xs in (("TEMPLATES", "TOPICS"), ("HELD_TEMPLATES", "HELD_TOPICS"))
            for t in lists[ts] for x in lists[xs]}


def test_each_workload_has_its_prompts_and_held_out_ones():
    trained = _training_prompts()
    for name in WORKLOADS:
        data = json.loads((ROOT / "weights" / "workloads" / f"{name}.json").read_text())
        bench, tune = load_workload(name), load_workload(name, "tune")
        assert len(bench) >= 8 and len(tune) >= 4 and not set(bench) & set(tune), name
        assert len(set(bench)) == len(bench)
        raw = [p["text"] for p in data["prompts"]]
        assert bench == ([CHAT.format(t) for t in raw] if data["chat"] else raw)
        assert not set(raw) & trained  # written for minispec, not the heads' training text
    with pytest.raises(MinispecError, match="split: expected one of prompts, tune"):
        load_workload("chat", "train")


def test_workload_names_and_the_prompt_file_they_write(tmp_path):
    assert workload_names("all") == list(WORKLOADS)
    assert workload_names("code,chat") == ["code", "chat"]
    for bad in ("nope", "code,", "grounded,x"):
        with pytest.raises(MinispecError, match="--workload: expected one of grounded, code, "
                                                "chat, edit or all"):
            workload_names(bad)
    path = write_prompts("grounded", tmp_path)
    assert load_prompts(path) == load_workload("grounded")  # the format --prompts reads


def _bench_report(tpc: float, identical: bool) -> dict:
    rows = {"minispec autoregressive": (1.0, 1.0, 1.0),
            "minispec auto": (tpc, tpc / 1.5, tpc / 1.2), "hf prompt lookup": (None, 1.2, None)}
    agree = {"minispec auto vs minispec autoregressive":
             {"identical": 8 if identical else 7, "total": 8}}
    return {"generation": {k: {"tokens_per_target_call": t, "speedup": s, "decode_speedup": d}
                           for k, (t, s, d) in rows.items()},
            "greedy_agreement": agree}


def test_the_table_of_every_workload_and_its_plot(tmp_path):
    table = by_workload({"grounded": _bench_report(4.5, True), "chat": _bench_report(1.5, True)})
    assert table["minispec auto"]["grounded"] == {"tokens_per_target_call": 4.5, "speedup": 3.0,
                                                  "decode_speedup": 3.75, "identical": True}
    text = format_by_workload(table, ["header"])
    lines = text.splitlines()
    assert lines[0] == "header" and lines[3].split() == ["method", "grounded", "chat"]
    assert lines[5].split() == ["minispec", "auto", "4.50", "3.00x", "3.75x", "1.50", "1.00x",
                                "1.25x"]
    assert lines[6].split() == ["hf", "prompt", "lookup", "-", "1.20x", "-", "-", "1.20x", "-"]
    assert lines[-1].startswith("greedy outputs: every method's identical")
    table = by_workload({"grounded": _bench_report(4.5, False)})
    assert "3.75x!" in format_by_workload(table, [])
    # the drafters table: its rows at the temperature asked for
    rows = [{"method": "auto (gamma 16)", "tokens_per_target_call": 2.0, "speedup": 1.5,
             "identical": None}]
    report = {"by_temperature": {"0": [], "1": rows}}
    assert by_workload({"code": report}, "1")["auto (gamma 16)"]["code"]["speedup"] == 1.5
    pytest.importorskip("matplotlib", reason="the plot extra (pip install matplotlib)")
    out = tmp_path / "w.png"
    assert plot_by_workload(by_workload({"grounded": _bench_report(4.5, True)}), str(out),
                            "title") == f"wrote {out}"
    assert out.read_bytes()[:4] == b"\x89PNG"


# ---- the auto drafter --------------------------------------------------------------------------


def _started(drafter, context):
    cache = TARGET.new_cache(64)
    drafter.start(context, cache)
    drafter.accept(context, TARGET.hidden_states(context[:-1], cache))
    return drafter


@pytest.mark.parametrize("min_n, agree", [(1, True), (2, True), (1, False), (2, False)])
def test_each_round_is_a_lookup_where_the_suffix_recurs_else_the_heads_draft(min_n, agree):
    # agree: the lookup only where every earlier occurrence of the suffix goes on alike
    rng = np.random.default_rng(min_n)
    warp = minispec.Sampling(1.0).warp
    kinds = set()
    for trial in range(60):
        context = [int(x) for x in rng.choice(LOOP[:3], size=int(rng.integers(3, 12)))]
        auto = _started(AutoDrafter(TARGET, random_eagle(TARGET, seed=2), min_n, first=3,
                                    agree=agree), context)
        d = auto.propose(context, 4, warp, np.random.default_rng(trial))
        src = lookup_by_search(context, min_n)
        ends = lookups_by_search(context, min_n)
        assert (src is None) == (not ends) and (src is None or src == ends[-1])
        if agree and len({context[e] for e in ends}) > 1:
            src = None
            kinds.add("disagreed")
        if src is None:  # the head's draft, drawn with the same numbers
            head = _started(random_eagle(TARGET, seed=2), context)
            plain = head.propose(context, 4, warp, np.random.default_rng(trial))
            assert d.tokens.tolist() == plain.tokens.tolist()
            np.testing.assert_array_equal(d.q, plain.q)
            kinds.add("head")
        else:  # the copy, running on into itself, at most `first` = 3 tokens
            full = list(context)
            for j in range(src, src + 3):
                full.append(full[j])
            assert d.tokens.tolist() == full[len(context):]
            np.testing.assert_array_equal(d.q, np.eye(d.q.shape[1])[d.tokens])
            kinds.add("lookup")
    assert kinds == ({"head", "lookup", "disagreed"} if agree else {"head", "lookup"})


def test_find_ngrams_finds_every_place_the_search_does():
    rng = np.random.default_rng(5)
    for _ in range(300):
        text = [int(x) for x in rng.integers(0, 4, size=int(rng.integers(1, 14)))]
        for min_n, max_n in ((1, 3), (2, 3), (2, 5)):
            got = find_ngrams(np.array(text, dtype=np.int64), max_n, min_n)
            assert got.tolist() == lookups_by_search(text, min_n, max_n)


def test_chain_caps_the_heads_round_and_not_the_lookups():
    warp = minispec.Sampling(1.0).warp
    context = [3, 17, 5, 40, 41]  # no suffix recurs: the head drafts
    auto = _started(AutoDrafter(TARGET, random_eagle(TARGET, seed=2), 2, chain=2), context)
    d = auto.propose(context, 8, warp, np.random.default_rng(0))
    head = _started(random_eagle(TARGET, seed=2), context)
    plain = head.propose(context, 2, warp, np.random.default_rng(0))
    assert len(d.tokens) == 2 and d.tokens.tolist() == plain.tokens.tolist()
    np.testing.assert_array_equal(d.q, plain.q)
    copying = _started(AutoDrafter(TARGET, None, 1, first=6, chain=2), [5, 6, 5])
    assert len(copying.propose([5, 6, 5, 6, 5, 6, 5], 8, None, None).tokens) == 6
    with pytest.raises(MinispecError, match="chain"):
        AutoDrafter(TARGET, None, chain=0)


def test_the_copy_grows_while_it_is_kept_and_shrinks_after_a_rejection():
    auto = _started(AutoDrafter(TARGET, None, 1, first=2, shortest=3), [5, 6, 5])
    lengths = []
    for kept in (2, 4, 1, 3, 0):  # rounds: what the target kept of each copy
        context = [5, 6, 5, 6, 5, 6, 5]
        d = auto.propose(context, 16, None, None)
        lengths.append(len(d.tokens))
        emitted = d.tokens[:kept].tolist() + ([] if kept == len(d.tokens) else [47])
        auto.accept(context + emitted, None)
    assert lengths == [2, 4, 8, 3, 6]  # doubled after a whole copy; else kept + 1, at least 3
    assert auto.lookup_rounds == 5 and auto.head_rounds == 0


def test_greedy_decoding_with_auto_is_the_targets_one_sequence_or_a_batch():
    prompts = (LOOP[:6], [9] * 9, [3, 17, 5], [40, 2, 33, 7])
    rounds = {"lookup": 0, "head": 0}
    for prompt in prompts:
        base = minispec.autoregressive_generate(TARGET, prompt, max_new_tokens=32,
                                                temperature=0.0)
        for head, gamma in ((random_eagle(TARGET, seed=2, scale=0.1, stop=0.1, copy=2), 16),
                            (random_eagle(TARGET, seed=3), 4), (None, 8)):
            auto = AutoDrafter(TARGET, head)
            out = minispec.speculative_generate(TARGET, auto, prompt, gamma=gamma,
                                                max_new_tokens=32, temperature=0.0)
            assert out.tokens == base.tokens
            rounds["lookup"] += auto.lookup_rounds
            rounds["head"] += auto.head_rounds
    assert rounds["lookup"] and rounds["head"]  # both drafters drafted
    batch = minispec.generate_batch(TARGET, AutoDrafter(TARGET, random_eagle(TARGET, seed=2)),
                                    list(prompts), gamma=8, max_new_tokens=32, temperature=0.0)
    assert [r.tokens for r in batch] == [
        minispec.autoregressive_generate(TARGET, p, max_new_tokens=32, temperature=0.0).tokens
        for p in prompts]


# for the law test: a prompt of three tokens the target often ranks in its top 2 (as in
# tests/test_eagle_copy.py), so lookups of one token are found and often kept
PROMPT = [1, 1, 16, 41, 41, 41, 1, 41]


class LookupWithUniformQ(Wrapping):
    """A planted bug, the control: the same drafts, but each lookup draft reported with a
    uniform q instead of one-hot (so verify keeps it with min(1, p V): almost always)."""

    name = "lookup-uniform-q"

    def propose(self, context, gamma, warp, rng):
        d = self.inner.propose(context, gamma, warp, rng)
        q = np.array([np.full(len(row), 1.0 / len(row)) if row.max() == 1.0 else row
                      for row in d.q]).reshape(d.q.shape)
        return minispec.Draft(d.tokens, q)

    def accept(self, context, hidden):
        self.inner.accept(context, hidden)


@pytest.mark.slow
def test_sampling_with_auto_follows_the_target_and_the_test_rejects_a_wrong_q():
    # the exact law of the next 5 tokens (top-k 2) against 750 generations each (the control
    # came out at p < 1e-300, the true test at 0.07; a third of the rounds are the head's)
    def auto():
        return AutoDrafter(TARGET, random_eagle(TARGET, seed=2, stop=0.1, copy=1), 1, first=2)

    row = sample_joint(TARGET, auto(), 750, top_k=2, L=5, prompt=PROMPT, gamma=4)[0]
    assert row.fit.pvalue > 1e-4, row.fit
    control = sample_joint(TARGET, LookupWithUniformQ(auto()), 750, top_k=2, L=5,
                           prompt=PROMPT, gamma=4)[0]
    assert control.fit.pvalue < 1e-6, control.fit


def test_make_drafter_auto_and_bad_values():
    from minispec.shipped import SHIPPED

    assert PRESETS["auto"] == ("auto", {}) and PRESET_GAMMA["auto"] == AUTO_GAMMA
    alone = make_drafter("auto", TARGET)  # no shipped head fits a tiny random model
    assert isinstance(alone, AutoDrafter) and alone.head is None
    shipped = minispec.load(SHIPPED / "target", device="cpu")
    auto = make_drafter("auto", shipped, lookup=3)
    assert isinstance(auto.head, EagleDrafter) and auto.min_n == 3
    assert (auto.head.stop, auto.head.copy) == (0.15, 2)  # eagle-copy's chain
    for kw, msg in (({"min_n": 0}, "min_n must be an integer >= 1"),
                    ({"min_n": 3, "max_n": 2}, r"max_n \(2\) must be >= min_n \(3\)"),
                    ({"first": 1.5}, "first must be an integer >= 1"),
                    ({"shortest": True}, "shortest must be an integer >= 1")):
        with pytest.raises(MinispecError, match=msg):
            AutoDrafter(TARGET, None, **kw)
    with pytest.raises(MinispecError, match="the head must be made for the same target"):
        AutoDrafter(TARGET, random_eagle(random_model(tiny_config(), seed=1)))


def test_tune_counts_every_candidate_and_checks_its_greedy_output():
    from minispec.shipped import SHIPPED
    from minispec.workloads import make_candidate, tune

    shipped = minispec.load(SHIPPED / "target", device="cpu")  # a tokenizer, a shipped head
    with blas_threads(1):
        out = tune(shipped, ["chat"], "tune", ["ngram:gamma=4", "auto:lookup=2,first=2,gamma=8"],
                   max_new_tokens=8, repeats=1)
    rows = out["workloads"]["chat"]
    assert list(rows) == ["ngram:gamma=4", "auto:lookup=2,first=2,gamma=8"]
    for r in rows.values():
        assert r["identical"] is True and 1.0 <= r["tokens_per_target_call"] <= 9.0
        assert r["predicted_speedup"] > 0
    assert set(out["costs"]) >= {1, 2} and out["overhead_s"] >= 0
    assert out["overhead_s"] == max(out["overhead_measured_s"], 0.0)  # the clamp, and its input
    drafter, gamma = make_candidate("auto:lookup=3,shortest=2,gamma=16", shipped)
    assert (drafter.min_n, drafter.shortest, gamma) == (3, 2, 16)
    for bad, msg in (("auto:lookup=x", "is no key=number"), ("ngram:nope=1", "unexpected"),
                     ("ngram:first=2", "drafter ngram has no first"),
                     # keys set after the drafter is made are checked as its constructor would
                     ("auto:first=-1", "first must be an integer >= 1, got -1"),
                     ("auto:chain=0", "chain must be an integer >= 1, got 0"),
                     ("ngram:max_n=0", "max_n must be an integer >= 1, got 0"),
                     ("auto:agree=5", "agree must be 0 or 1, got 5"),
                     ("auto:lookup=3,max_n=2", "max_n must be >= the lookup's 3 tokens")):
        with pytest.raises(MinispecError, match=msg):
            make_candidate(bad, shipped)


def test_tune_command_times_the_path_the_benchmarks_run(monkeypatch, capsys):
    # its costs are a verify call's as `real bench` pays them: the model on the speed path
    # (on the plain path SmolLM2's one-row call took 31 ms against the benchmarks' 18-20)
    import minispec.cpu_steps
    from minispec.shipped import SHIPPED
    from minispec.workloads import main

    enabled = []
    real = minispec.cpu_steps.enable_where_supported
    monkeypatch.setattr(minispec.cpu_steps, "enable_where_supported",
                        lambda *models: (enabled.extend(models), real(*models)))
    assert main(["tune", "--model", str(SHIPPED / "target"), "--workloads", "chat",
                 "--candidates", "ngram:gamma=4", "--max-new-tokens", "4"]) == 0
    assert [m.config.hidden_size for m in enabled] == [512]  # the shipped target, once
    out = capsys.readouterr().out
    assert "target call of k rows / one row" in out and "ngram:gamma=4" in out
