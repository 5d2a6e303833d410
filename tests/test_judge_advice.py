"""What the judge tells a user after a FAIL: chance and a bug read differently."""

from minispec.judge.main import advice
from minispec.judge.stats import Fit, Row


def row(p: float, note: str = "", passed: bool = False) -> Row:
    return Row("D", "eagle-stop T=1", "joint law of 4 tokens", 800, Fit(40.0, 44, p, note),
               passed=passed)


def test_pass_gives_no_advice():
    assert advice([row(0.4, passed=True)], ok_controls=True) == []


def test_low_p_value_asks_for_another_seed_and_more_samples():
    (line,) = advice([row(0.4, passed=True), row(0.0004)], ok_controls=True)
    assert "--seed" in line and "--samples" in line and "100 runs" in line


def test_impossible_draw_is_called_a_bug():
    (line,) = advice([row(0.0, "3 draws of impossible outcomes")], ok_controls=True)
    assert "3 draws of impossible outcomes" in line and "bug, not chance" in line
    assert "--seed" not in line


def test_control_not_rejected_asks_for_power():
    lines = advice([row(0.4, passed=True)], ok_controls=False)
    assert len(lines) == 1 and "power" in lines[0]
