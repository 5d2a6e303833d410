"""The judge's statistics: G-tests with small cells merged, Holm's correction, exact laws, power.

Each test compares counts of what a sampler emitted with the probabilities an exact sampler
would give them (a G-test, i.e. a likelihood-ratio chi-square, with cells of expected count
below MIN_EXPECTED merged). The true tests are one family, Holm-corrected at FAMILY_ALPHA; a
control (a deliberately broken sampler) must be rejected below CONTROL_ALPHA. `reach` states
what a pass rules out: the smallest share of noise a test catches with probability POWER.
"""

from __future__ import annotations

import math
import sys
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
from scipy import optimize, stats

from ..core.sampling import warp
from ..core.speculative import sampled_vocab_size

FAMILY_ALPHA = 0.01  # Holm over all true tests
CONTROL_ALPHA = 1e-6  # each broken sampler must be rejected below this (Bonferroni over its tests)
POWER = 0.9  # reach: the deviation a test catches this often
MIN_EXPECTED = 5.0  # cells with a smaller expected count are merged into an "other" cell
# Outcomes of probability below this count as impossible: one draw of them fails the test. For an
# exact sampler that happens with probability < samples * their total mass < 1e-4 in every test.
IMPOSSIBLE = 1e-12
# The configurations (part 1's p and q, part 2's random models) are fixed; --seed changes only
# the draws, so a run under another seed tests the same distributions.
CASES_SEED = 0
MODELS_SEED = 0


def rng_for(seed: int, *names: str) -> np.random.Generator:
    """A generator keyed by the run seed and a name, so a row's draws do not depend on row order."""
    return np.random.default_rng([seed, *(zlib.crc32(n.encode()) for n in names)])


@dataclass(frozen=True)
class Cells:
    """The cells one or more G-tests compared, merged as they merged them, flat: for each cell the
    draws n of its test, its exact probability p, and its probability u under uniform noise (u
    uniform over the outcomes p allows). What `reach` computes a test's power from."""

    n: np.ndarray
    p: np.ndarray
    u: np.ndarray

    @staticmethod
    def join(parts: list[Cells]) -> Cells:
        return Cells(*(np.concatenate([getattr(c, f) for c in parts] or [np.zeros(0)])
                       for f in ("n", "p", "u")))


NO_CELLS = Cells(np.zeros(0), np.zeros(0), np.zeros(0))


@dataclass
class Fit:
    """A goodness-of-fit result: G statistic, degrees of freedom, p-value, and why if it is 0."""

    stat: float
    dof: int
    pvalue: float
    note: str = ""
    cells: Cells = field(default=NO_CELLS, repr=False)  # for reach()


class Part(NamedTuple):
    """One G-test, a share of a row (a row sums several: one per index, or per previous token)."""

    g: float
    dof: int
    impossible: int  # observations on a cell of probability < IMPOSSIBLE
    cells: Cells


def g_parts(observed: np.ndarray, probs: np.ndarray) -> Part:
    """G statistic and dof of counts `observed` against probabilities `probs`, the number of
    observations that fell on a cell of probability < IMPOSSIBLE, and the cells compared.

    Cells whose expected count is below MIN_EXPECTED are merged, smallest first, into one "other"
    cell (itself merged with the next smallest until it too reaches MIN_EXPECTED).
    """
    observed = np.asarray(observed, dtype=np.float64).ravel()
    probs = np.asarray(probs, dtype=np.float64).ravel()
    n = observed.sum()
    impossible = int(observed[probs < IMPOSSIBLE].sum())
    keep = probs >= IMPOSSIBLE
    o, e = observed[keep], n * probs[keep] / probs[keep].sum()
    if n == 0 or len(e) < 2:
        return Part(0.0, 0, impossible, NO_CELLS)
    u = np.full(len(e), n / len(e))  # expected counts under uniform noise
    order = np.argsort(e, kind="stable")
    o, e, u = o[order], e[order], u[order]
    k = int(np.searchsorted(e, MIN_EXPECTED))  # cells 0..k-1 are too small on their own
    if k > 0:
        other_o, other_e, other_u = o[:k].sum(), e[:k].sum(), u[:k].sum()
        o, e, u = o[k:], e[k:], u[k:]
        while other_e < MIN_EXPECTED and len(e) > 0:  # absorb the next smallest cell
            other_o, other_e, other_u = other_o + o[0], other_e + e[0], other_u + u[0]
            o, e, u = o[1:], e[1:], u[1:]
        o, e, u = np.append(o, other_o), np.append(e, other_e), np.append(u, other_u)
    if len(e) < 2:
        return Part(0.0, 0, impossible, NO_CELLS)
    nz = o > 0
    g = 2.0 * float(np.sum(o[nz] * np.log(o[nz] / e[nz])))
    return Part(g, len(e) - 1, impossible, Cells(np.full(len(e), n), e / n, u / n))


def combine(parts: list[Part], note: str = "") -> Fit:
    """Sum independent G statistics (and dofs) into one test."""
    g = sum(x.g for x in parts)
    dof = sum(x.dof for x in parts)
    impossible = sum(x.impossible for x in parts)
    cells = Cells.join([x.cells for x in parts])
    if note:
        return Fit(g, dof, 0.0, note, cells)
    if impossible:
        return Fit(g, dof, 0.0, f"{impossible} draws of impossible outcomes", cells)
    if dof == 0:
        return Fit(0.0, 0, 1.0, "one cell: only impossible outcomes checked")
    return Fit(g, dof, float(stats.chi2.sf(g, dof)), cells=cells)


def reach(fit: Fit, alpha: float, power: float = POWER) -> float:
    """The smallest share eps of uniform noise that this test rejects at level `alpha` with
    probability `power`: a sampler that draws from (1 - eps) p + eps u instead of p, u uniform
    over the outcomes p allows (total-variation distance eps * TV(p, u) <= eps from p), at the
    test's own sample sizes. Computed, not simulated: the G statistic taken as noncentral
    chi-square, noncentrality 2 n KL((1 - eps) p + eps u || p) summed over the cells. inf when
    even eps = 1 is caught less often; nan for a test of one cell (only an impossible draw fails
    it). eps shrinks as 1 / sqrt(n): 4x the samples halve it."""
    c = fit.cells
    if fit.dof == 0 or not len(c.n):
        return math.nan
    crit = stats.chi2.isf(alpha, fit.dof)
    hi = 1.0
    while stats.ncx2.sf(crit, fit.dof, hi) < power:
        hi *= 2.0
    lam = optimize.brentq(lambda nc: stats.ncx2.sf(crit, fit.dof, nc) - power, 0.0, hi)

    def noncentrality(eps: float) -> float:
        mix = (1.0 - eps) * c.p + eps * c.u
        return 2.0 * float(np.sum(c.n * mix * np.log(mix / c.p)))

    if noncentrality(1.0) < lam:
        return math.inf
    return float(optimize.brentq(lambda eps: noncentrality(eps) - lam, 0.0, 1.0, xtol=1e-6))


def holm(pvalues: list[float]) -> list[float]:
    """Holm step-down adjusted p-values (valid under any dependence between the tests)."""
    m = len(pvalues)
    adjusted = [0.0] * m
    running = 0.0
    for rank, i in enumerate(sorted(range(m), key=lambda j: pvalues[j])):
        running = max(running, min(1.0, (m - rank) * pvalues[i]))
        adjusted[i] = running
    return adjusted


def normalize(x: np.ndarray) -> np.ndarray:
    return x / x.sum(axis=-1, keepdims=True)


def softmax(z: np.ndarray) -> np.ndarray:
    return normalize(np.exp(z - z.max(axis=-1, keepdims=True)))


@dataclass
class Row:
    """One line of the report: a test of the true sampler, or of a control."""

    part: str
    config: str
    test: str
    samples: int
    fit: Fit
    control: str | None = None  # the bug, for a control row
    adjusted: float = math.nan  # Holm-adjusted p-value, true rows
    reach: float = math.nan  # true rows: the noise share caught with probability POWER (reach())
    passed: bool = False
    hist: tuple | None = field(default=None, repr=False)  # (labels, exact, empirical) for --plot

    def __post_init__(self) -> None:
        who = f"control {self.control}" if self.control else "true"
        meant = " (a control: meant to be tiny)" if self.control else ""
        progress(f"part {self.part} {who}: {self.config}, {self.test}: "
                 f"p = {fmt_p(self.fit.pvalue)}{meant}")


_clock: list[float] = []  # when the first row was reported (set then, not at import)


def progress(line: str) -> None:
    """A line on stderr as each row completes, when stderr is a terminal (quiet otherwise)."""
    if sys.stderr.isatty():
        start = _clock[0] if _clock else _clock.append(time.perf_counter()) or _clock[0]
        print(f"  [{time.perf_counter() - start:6.1f} s] {line}", file=sys.stderr, flush=True)


@dataclass
class E2E:
    """One end-to-end configuration: sampling parameters, gamma and the number of new tokens L."""

    temperature: float
    top_k: int = 0
    top_p: float = 1.0
    gamma: int = 3
    L: int = 3
    draft: str = "near"  # part 2: which of tiny_models' drafts

    @property
    def name(self) -> str:
        s = f"T={self.temperature:g}"
        s += f" top_k={self.top_k}" if self.top_k else ""
        s += f" top_p={self.top_p:g}" if self.top_p < 1 else ""
        return f"{s} g={self.gamma} L={self.L}"


def exact_joint(target, prompt: list[int], cfg: E2E) -> dict[tuple[int, ...], float]:
    """P(next L tokens = x) for every x of nonzero probability, from the target alone: the warped
    distribution after every prefix (Model.logits, no cache), multiplied down the tree."""
    V = sampled_vocab_size(target)
    law: dict[tuple[int, ...], float] = {}

    def walk(prefix: tuple[int, ...], prob: float) -> None:
        if len(prefix) == cfg.L:
            law[prefix] = prob
            return
        z = target.logits(prompt + list(prefix))[-1, :V]  # the ids generation samples from
        row = warp(z, cfg.temperature, cfg.top_k, cfg.top_p)
        for x in np.flatnonzero(row > 0):
            walk(prefix + (int(x),), prob * float(row[x]))

    walk((), 1.0)
    return law


def joint_row(part: str, label: str, law: dict, samples: list[tuple[int, ...]],
              control: str | None = None, name: Callable = str) -> Row:
    """G-test of the sampled L-token continuations against the exact law; name(id) labels the
    plot's bars."""
    cells = sorted(law, key=law.get, reverse=True)
    index = {x: i for i, x in enumerate(cells)}
    observed = np.zeros(len(cells) + 1)  # last cell: continuations the target cannot produce
    for s in samples:
        observed[index.get(s, len(cells))] += 1
    probs = np.append([law[x] for x in cells], 0.0)
    fit = combine([g_parts(observed, probs)])
    top = min(len(cells), 12)
    labels = [" ".join(map(name, x)) for x in cells[:top]] + ["other"]
    exact = np.append(probs[:top], probs[top:].sum())
    empirical = np.append(observed[:top], observed[top:].sum()) / max(1, len(samples))
    test = f"joint of {len(law)} outcome{'s' if len(law) > 1 else ''}"
    return Row(part, label, test, len(samples), fit, control, hist=(labels, exact, empirical))


def fmt_p(p: float) -> str:
    if p == 0.0:
        return "<1e-300"
    return f"{p:.3f}" if p >= 0.001 else f"{p:.1e}"
