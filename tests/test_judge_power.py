"""The judge states its power: for each true test, the smallest share eps of uniform noise it
catches with probability 0.9 at its sample size and Holm threshold (minispec.judge.stats.reach).
Checked on samplers with a planted deviation above and below that figure."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest

from minispec.core.sampling import sample
from minispec.judge import verify_step
from minispec.judge.main import report
from minispec.judge.stats import FAMILY_ALPHA, Row, combine, g_parts, reach

ALPHA = FAMILY_ALPHA / 35  # a quick run's Holm threshold for one deviating test (35 true tests)
V = 8
P = np.random.default_rng(3).dirichlet(np.ones(V))  # a fixed target row


def noisy(eps: float):
    """A verify step for gamma 0 (plain sampling from p[0]) with a planted deviation: a share eps
    of its tokens drawn uniformly from the V tokens instead."""
    def verify(p, q, draft_tokens, rng):
        if rng.random() < eps:
            return np.array([rng.integers(V)])
        return np.array([sample(p[0], rng)])

    return verify


def tokens_row(sampler, n: int, seed: int) -> Row:
    """Part 1's "tokens by index" row for the gamma-0 configuration on P."""
    case = verify_step.Case(f"gamma 0 V={V}", P[None], np.zeros((0, V)))
    counts = verify_step.drive(sampler, case, n, np.random.default_rng(seed))
    return verify_step.verify_rows(case, counts)[0]


def test_a_planted_deviation_above_the_stated_figure_is_caught_below_it_mostly_passes():
    n = 600
    eps = reach(tokens_row(noisy(0.0), n, 0).fit, ALPHA)
    assert 0.05 < eps < 0.5, eps
    caught_above = sum(tokens_row(noisy(1.3 * eps), n, s).fit.pvalue < ALPHA for s in range(30))
    caught_below = sum(tokens_row(noisy(0.6 * eps), n, s).fit.pvalue < ALPHA for s in range(30))
    assert caught_above >= 26, caught_above  # 1.3 eps: rejected in most seeds (computed: ~97%)
    assert caught_below <= 12, caught_below  # 0.6 eps: mostly passes (computed: ~30%)


def mixture_fit(rng, n: int, eps: float, parts: int):
    """A row of `parts` G-tests, each of n draws from (1 - eps) p + eps u."""
    mix = (1 - eps) * P + eps / V
    return combine([g_parts(rng.multinomial(n, mix), P) for _ in range(parts)])


@pytest.mark.parametrize("n, parts", [(2000, 1), (300, 5)])
def test_at_the_stated_figure_the_power_is_about_90_percent(n, parts):
    # a row summing several G-tests (as "tokens by index" sums one per index), 300 seeds
    eps = reach(mixture_fit(np.random.default_rng(0), n, 0.0, parts), ALPHA)
    rng = np.random.default_rng(1)
    power = np.mean([mixture_fit(rng, n, eps, parts).pvalue < ALPHA for _ in range(300)])
    assert 0.78 <= power <= 0.97, (eps, power)


def test_the_figure_halves_with_4x_the_samples_and_has_edge_cases():
    fit = combine([g_parts(np.round(1000 * P), P)])
    fit4 = combine([g_parts(np.round(4000 * P), P)])
    assert reach(fit4, ALPHA) == pytest.approx(reach(fit, ALPHA) / 2, rel=0.05)
    assert reach(fit, ALPHA / 10) > reach(fit, ALPHA)  # a stricter threshold needs more noise
    one_cell = combine([g_parts([40, 0], [1.0, 0.0])])  # greedy: one possible outcome
    assert math.isnan(reach(one_cell, ALPHA))
    flat = combine([g_parts([50] * 4, [0.25] * 4)])  # uniform noise changes nothing
    assert math.isinf(reach(flat, ALPHA))


def test_the_report_prints_each_figure_and_the_range(capsys):
    rows = [Row("1", "row a", "tokens by index", 2000, combine([g_parts(np.round(2000 * P), P)])),
            Row("1", "row b", "tokens by index", 500, combine([g_parts(np.round(500 * P), P)])),
            Row("2", "greedy", "joint of 1 outcome", 40, combine([g_parts([40, 0], [1, 0])]))]
    assert report(rows, [], [], None, time.perf_counter()) == 0
    out = capsys.readouterr().out.splitlines()
    a, b = (reach(r.fit, FAMILY_ALPHA / 3) for r in rows[:2])
    assert next(x for x in out if x.startswith("1    row a")).split()[-2] == f"{a:.3f}"
    assert next(x for x in out if x.startswith("1    row b")).split()[-2] == f"{b:.3f}"
    assert next(x for x in out if x.startswith("2    greedy")).split()[10] == "-"  # eps 90%
    power = next(x for x in out if x.startswith("Power:"))
    assert f"eps from {a:.3f} (part 1 row a" in power and f"to {b:.3f} (part 1 row b" in power
    assert "0.01/3" in power and "4x the samples halve eps" in power
