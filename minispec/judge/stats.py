"""The judge's statistics: G-tests with small cells merged, Holm's correction, exact laws.

Each test compares counts of what a sampler emitted with the probabilities an exact sampler
would give them (a G-test, i.e. a likelihood-ratio chi-square, with cells of expected count
below MIN_EXPECTED merged). The true tests are one family, Holm-corrected at FAMILY_ALPHA; a
control (a deliberately broken sampler) must be rejected below CONTROL_ALPHA.
"""

from __future__ import annotations

import math
import sys
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from scipy import stats

from ..core.sampling import warp
from ..core.speculative import sampled_vocab_size

FAMILY_ALPHA = 0.01  # Holm over all true tests
CONTROL_ALPHA = 1e-6  # each broken sampler must be rejected below this (Bonferroni over its tests)
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


@dataclass
class Fit:
    """A goodness-of-fit result: G statistic, degrees of freedom, p-value, and why if it is 0."""

    stat: float
    dof: int
    pvalue: float
    note: str = ""


def g_parts(observed: np.ndarray, probs: np.ndarray) -> tuple[float, int, int]:
    """G statistic and dof of counts `observed` against probabilities `probs`, plus the number of
    observations that fell on a cell of probability < IMPOSSIBLE.

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
        return 0.0, 0, impossible
    order = np.argsort(e, kind="stable")
    o, e = o[order], e[order]
    k = int(np.searchsorted(e, MIN_EXPECTED))  # cells 0..k-1 are too small on their own
    if k > 0:
        other_o, other_e = o[:k].sum(), e[:k].sum()
        o, e = o[k:], e[k:]
        while other_e < MIN_EXPECTED and len(e) > 0:  # absorb the next smallest cell
            other_o, other_e = other_o + o[0], other_e + e[0]
            o, e = o[1:], e[1:]
        o, e = np.append(o, other_o), np.append(e, other_e)
    if len(e) < 2:
        return 0.0, 0, impossible
    nz = o > 0
    g = 2.0 * float(np.sum(o[nz] * np.log(o[nz] / e[nz])))
    return g, len(e) - 1, impossible


def combine(parts: list[tuple[float, int, int]], note: str = "") -> Fit:
    """Sum independent G statistics (and dofs) into one test."""
    g = sum(x[0] for x in parts)
    dof = sum(x[1] for x in parts)
    impossible = sum(x[2] for x in parts)
    if note:
        return Fit(g, dof, 0.0, note)
    if impossible:
        return Fit(g, dof, 0.0, f"{impossible} draws of impossible outcomes")
    if dof == 0:
        return Fit(0.0, 0, 1.0, "one cell: only impossible outcomes checked")
    return Fit(g, dof, float(stats.chi2.sf(g, dof)))


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
