"""`minispec drafters` (minispec/measure/drafters.py): the side-by-side table's counts are the
generations' own, greedy rows are checked against autoregressive decoding, the tree cost runs."""

import pytest
from conftest import tiny_config

from minispec.drafters import TreeModelDrafter, make_drafter, random_medusa
from minispec.errors import MinispecError
from minispec.loader import random_model
from minispec.measure.drafters import format_report, side_by_side, tree_costs

TARGET = random_model(tiny_config(), seed=0, scale=0.5)
DRAFT = random_model(tiny_config(n_layers=1), seed=0, scale=0.4)
ROWS = [("model", lambda t, d: make_drafter("model", t, draft_model=d)),
        ("model-tree 2,1", lambda t, d: TreeModelDrafter(t, d, (2, 1))),
        ("medusa", lambda t, d: random_medusa(t, 2, seed=1, scale=0.3))]


def test_side_by_side_reports_each_drafter_against_autoregressive_decoding():
    prompts = [[3, 17, 5], [9, 9, 9, 9]]
    rows = side_by_side(TARGET, DRAFT, prompts, temperature=0.0, gamma=2, max_new_tokens=12,
                        rows=ROWS)
    assert [r["method"] for r in rows] == ["autoregressive", "model", "model-tree 2,1", "medusa"]
    auto = rows[0]
    assert auto["tokens_per_target_call"] == 1.0 and auto["speedup"] == 1.0
    for r in rows[1:]:
        assert r["identical"] is True  # greedy: every drafter gives autoregressive output
        assert 1.0 <= r["tokens_per_target_call"] <= 3.0  # at most gamma + 1 per call
    sampled = side_by_side(TARGET, DRAFT, prompts, temperature=1.0, gamma=2, max_new_tokens=8,
                           rows=ROWS[:1])
    assert sampled[1]["identical"] is None
    costs = tree_costs(TARGET, shapes=[(1, 1), (2, 1)], context=8, repeats=2)
    assert [c["nodes"] for c in costs] == [2, 4]
    text = format_report({"settings": {"prompts": 2, "max_new_tokens": 12, "gamma": 2,
                                       "repeats": 1},
                          "by_temperature": {"0": rows}, "tree_costs": costs})
    assert "model-tree 2,1" in text and "tree/chain" in text


def test_rows_are_chosen_by_drafter_and_those_needing_a_draft_model_left_out_with_a_note():
    from minispec.measure.drafters import DRAFTER_ROWS, select_rows

    rows, notes = select_rows("ngram,early-exit", draft_model=False)
    assert [label for label, _ in rows] == ["ngram", "early-exit"] and notes == []
    rows, notes = select_rows(None, draft_model=False)
    assert [label for label, _ in rows] == [label for label, _ in DRAFTER_ROWS[5:]]
    assert notes == ["model (chain): left out (--draft none: no draft model)",
                     "model (whole head): left out (--draft none: no draft model)",
                     "model stop 0.2: left out (--draft none: no draft model)",
                     "model-tree 2,2,1,1: left out (--draft none: no draft model)",
                     "model-tree 3,2,1,1: left out (--draft none: no draft model)"]
    assert [label for label, _ in select_rows("eagle-2", True)[0]] == ["eagle-2 4,3,2,2 b3 n12"]
    with pytest.raises(MinispecError, match="--drafters: 'lookup' is none of"):
        select_rows("ngram,lookup", draft_model=True)
    with pytest.raises(MinispecError, match="no drafter left to run"):
        select_rows("model", draft_model=False)


def test_the_drafters_command_refuses_a_count_below_one_naming_it(capsys):
    from minispec.measure import drafters

    for argv, message in ((["--repeats", "0"], "--repeats: expected a positive integer, got 0"),
                          (["--num-prompts", "-1"], "--num-prompts: expected an integer >= 0")):
        assert drafters.main(argv) == 2
        out, err = capsys.readouterr()
        assert out == "" and message in err and "Traceback" not in err, err
