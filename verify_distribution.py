"""Is minispec's speculative sampling lossless? A statistical check you can run.

Speculative sampling (Leviathan et al. 2023, Algorithm 1 and Theorem 3.1; Chen et al. 2023) promises
that the emitted tokens are distributed exactly as if the target alone had sampled them. This script
tests that promise with goodness-of-fit tests (G-tests, scipy) and shows the tests have power by
running the same tests, with the same sample budget, on deliberately broken samplers.

    python verify_distribution.py              # the full run
    python verify_distribution.py --quick      # the CI subset (well under a minute on 2 cores)
    python verify_distribution.py --sampler mypkg.mymod:verify   # judge an outside verify step
    python verify_distribution.py --plot out.png

Part 1, the verify step alone. Fixed target rows p[0..g] and draft rows q[0..g-1]; each round draws
g draft tokens from q and calls verify(p, q, draft_tokens, rng), until N tokens are emitted. For an
exact sampler the token a round emits at index i, given everything emitted before it, is distributed
as p[i] (index i is reached only through the draft prefix, which p[i] is conditioned on). So:
  tokens   the counts at each index i against n_i * p[i] (n_i = tokens emitted at index i),
  pairs    the token at index i+1 given the one at index i, against p[i+1],
  lengths  the number of tokens per round against Algorithm 1's law: index i is passed with
           probability beta_i = sum(min(p_i, q_i)) (this row checks the acceptance rule, i.e. the
           speed claim; a different lossless rule, e.g. block verification, would fail only it).
Conditioning on n_i is valid because whether index i is reached depends only on earlier draws.
Part 2, end to end: tiny random draft and target models; the exact law of the next L tokens,
enumerated with the target alone (Model.logits over every prefix, then warp), against the
histogram of speculative_generate(..., max_new_tokens=L) over many seeds.
Part T, trees of drafts (minispec/tree.py): verify_tree alone, on trees of several shapes whose
siblings are drawn i.i.d., without replacement, or as top-k candidates, from near, far and
disjoint drafts of a synthetic target (a fixed random row for every prefix), rounds repeated
until L tokens are out; and the tree drafters (model-tree, Medusa heads) and EAGLE (chain, static
and dynamic trees) end to end as in part 2.
Its controls patch one line of minispec.tree each (the residual not updated after a rejected
sibling; siblings drawn without replacement verified as i.i.d.; top-k verified as sampled).
Part 3, the shipped pair in weights/ (target and draft), with top-k small enough to enumerate.
Part 4, controls: Algorithm 1 written out below with one line broken each (residual replaced by
p, bonus token dropped, acceptance min(1, q/p)), and a drafter that draws from the unwarped draft
logits but reports the warped q. Each must be rejected at p < 1e-6.
Multiple testing: the true tests are one family, Holm-corrected at family alpha 0.01; their
p-values are also tested for uniformity (Kolmogorov-Smirnov), a diagnostic printed with them.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import math
import os
import sys
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from scipy import stats

from minispec.sampling import sample, warp

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

Sampler = Callable[[np.ndarray, np.ndarray, np.ndarray, np.random.Generator], np.ndarray]


def rng_for(seed: int, *names: str) -> np.random.Generator:
    """A generator keyed by the run seed and a name, so a row's draws do not depend on row order."""
    return np.random.default_rng([seed, *(zlib.crc32(n.encode()) for n in names)])


# ----------------------------------------------------------------------------------- statistics


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


# ------------------------------------------------------- Algorithm 1, breakable for the controls

BUGS = {
    "residual=p": "on rejection, resample from p instead of norm(max(0, p - q))",
    "no bonus": "when every draft is accepted, the bonus token from p[g] is dropped",
    "accept q/p": "accept with probability min(1, q/p) instead of min(1, p/q)",
    "unwarped q": "drafts drawn from the unwarped draft logits, q reported warped",
}


def algorithm1(p, q, draft_tokens, rng: np.random.Generator, bug: str | None = None) -> np.ndarray:
    """Leviathan et al. Algorithm 1 written out once more, so that each control changes one line.

    With bug=None this is the correct verify step; the script tests minispec's own, not this one.
    """
    out = []
    for i, x in enumerate(int(t) for t in draft_tokens):
        if bug == "accept q/p":
            ratio = q[i, x] / p[i, x] if p[i, x] > 0 else math.inf
        else:
            ratio = p[i, x] / q[i, x]
        if rng.random() < min(1.0, ratio):
            out.append(x)
            continue
        residual = p[i] if bug == "residual=p" else np.maximum(p[i] - q[i], 0.0)
        out.append(sample(residual / residual.sum(), rng))
        return np.array(out, dtype=np.int64)
    if bug != "no bonus":
        out.append(sample(p[len(out)], rng))
    return np.array(out, dtype=np.int64)


def broken_sampler(bug: str) -> Sampler:
    def verify(p, q, draft_tokens, rng):
        return algorithm1(p, q, draft_tokens, rng, bug)

    verify.__name__ = f"algorithm1[{bug}]"
    return verify


def load_sampler(spec: str) -> Sampler:
    """'module:function' -> the function; the working directory is importable, like `python -m`."""
    module_name, sep, fn_name = spec.partition(":")
    if not sep or not module_name or not fn_name:
        raise SystemExit(f"--sampler: expected module:function, got {spec!r}")
    sys.path.insert(0, os.getcwd())
    module = importlib.import_module(module_name)
    missing = [m for m in getattr(module, "REQUIRES", ()) if importlib.util.find_spec(m) is None]
    if missing:  # a missing dependency is not a verdict on the sampler: status 3, not 1
        print(f"verify_distribution: --sampler {spec} needs {' and '.join(missing)}, not "
              f"installed here; nothing was tested (pip install {' '.join(missing)})",
              file=sys.stderr)
        raise SystemExit(3)
    fn = getattr(module, fn_name, None)
    if not callable(fn):
        raise SystemExit(f"--sampler: {module_name} has no function {fn_name!r}")
    return fn


# ----------------------------------------------------------------------------------- rows


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
        progress(f"part {self.part} {self.control or 'true'}: {self.config}, {self.test}: "
                 f"p = {fmt_p(self.fit.pvalue)}")


START = time.perf_counter()


def progress(line: str) -> None:
    """A line on stderr as each row completes, when stderr is a terminal (quiet otherwise)."""
    if sys.stderr.isatty():
        print(f"  [{time.perf_counter() - START:6.1f} s] {line}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------- part 1: the verify step


@dataclass
class Case:
    """Fixed target rows p [g+1, V] and draft rows q [g, V] for the verify step alone."""

    name: str
    p: np.ndarray
    q: np.ndarray


def normalize(x: np.ndarray) -> np.ndarray:
    return x / x.sum(axis=-1, keepdims=True)


def softmax(z: np.ndarray) -> np.ndarray:
    return normalize(np.exp(z - z.max(axis=-1, keepdims=True)))


def verify_cases(quick: bool) -> list[Case]:
    """The part-1 configurations: vocabulary 8 to 32, gamma 0 to 8, and the awkward shapes.
    Fixed (not drawn with --seed): the control's power was checked on these."""
    r = rng_for(CASES_SEED, "cases")
    cases = []

    def add(name, p, q):
        p, q = np.asarray(p, np.float64), np.asarray(q, np.float64).reshape(-1, p.shape[1])
        p.flags.writeable = q.flags.writeable = False  # a sampler that writes to them fails
        cases.append(Case(name, p, q))

    # independent random rows: low acceptance, exercises the residual
    for V, g, a in [(8, 1, 1.0), (16, 4, 1.0), (32, 8, 0.5)]:
        a = np.full(V, a)
        add(f"dirichlet V={V} g={g}", r.dirichlet(a, g + 1), r.dirichlet(a, g))
    V, g = 12, 3  # q == p: every draft accepted, every round ends with the bonus token
    p = r.dirichlet(np.ones(V), g + 1)
    add(f"q == p V={V} g={g}", p, p[:g].copy())
    V, g = 16, 3  # disjoint supports: every draft rejected, the residual is p itself
    p = np.zeros((g + 1, V))
    q = np.zeros((g, V))
    p[:, :8] = r.dirichlet(np.ones(8), g + 1)
    q[:, 8:] = r.dirichlet(np.ones(8), g)
    add(f"disjoint V={V} g={g}", p, q)
    V, g = 20, 4  # supports overlapping on 6 tokens
    p = np.zeros((g + 1, V))
    q = np.zeros((g, V))
    p[:, :12] = r.dirichlet(np.ones(12), g + 1)
    q[:, 6:] = r.dirichlet(np.ones(14), g)
    add(f"overlap V={V} g={g}", p, q)
    V, g = 16, 5  # one-hot q, as n-gram drafting gives: the draft token is certain under q
    p = r.dirichlet(np.full(V, 0.7), g + 1)
    drafts = [int(np.argmax(p[0])), 3, int(np.argmax(p[2])), 7, int(np.argmax(p[4]))]
    p[1, 3] = 0.0  # a draft the target can never accept
    p = normalize(p)
    add(f"one-hot q V={V} g={g}", p, np.eye(V)[drafts])
    V, g = 24, 4  # near-zero probabilities on both sides, ratios of 1e-12 and 1e+12
    p = r.dirichlet(np.ones(V), g + 1)
    q = r.dirichlet(np.ones(V), g)
    p[:g, :3] = [1e-12, 1e-300, 1e-15]
    q[:, :3] = 0.2
    q[:, 3:5] = [1e-12, 1e-300]
    p[:g, 3:5] = 0.2
    add(f"near-zero V={V} g={g}", normalize(p), normalize(q))
    V, g = 32, 2  # peaked target, flat draft
    add(f"peaked p V={V} g={g}", softmax(3.0 * r.normal(size=(g + 1, V))), np.full((g, V), 1 / V))
    V, g = 8, 6  # flat target, peaked draft
    add(f"peaked q V={V} g={g}", np.full((g + 1, V), 1 / V), softmax(3.0 * r.normal(size=(g, V))))
    V, g = 32, 6  # a good draft: high acceptance, long rounds, many bonus tokens
    z = 2.0 * r.normal(size=(g + 1, V))
    add(f"close draft V={V} g={g}", softmax(z), softmax(z[:g] + 0.3 * r.normal(size=(g, V))))
    V = 10  # gamma 0: verify is plain sampling from p[0]
    add(f"gamma 0 V={V}", r.dirichlet(np.ones(V), 1), np.zeros((0, V)))
    if quick:
        keep = ("dirichlet V=16", "q == p", "disjoint", "one-hot", "near-zero", "close draft")
        cases = [c for c in cases if c.name.startswith(keep)]
    return cases


def sharpen(q: np.ndarray, temperature: float = 0.6) -> np.ndarray:
    """q warped at `temperature`, as a drafter would report it (rows of zeros stay zero)."""
    with np.errstate(divide="ignore"):
        return np.vstack([warp(np.log(row), temperature) for row in q]) if len(q) else q


def draw_rows(cdf: np.ndarray, u: np.ndarray) -> np.ndarray:
    """Inverse-CDF draws: one token per row of `cdf` [g, V] for each row of uniforms u [B, g]."""
    g = cdf.shape[0]
    out = np.empty(u.shape, dtype=np.int64)
    for i in range(g):
        idx = np.searchsorted(cdf[i], u[:, i] * cdf[i, -1], side="right")
        out[:, i] = np.minimum(idx, np.flatnonzero(np.diff(cdf[i], prepend=0.0) > 0)[-1])
    return out


@dataclass
class Counts:
    """What the emitted tokens of many rounds look like, indexed by position within the round."""

    tokens: np.ndarray  # [g+1, V]: tokens[i, x] = rounds that emitted x at index i
    pairs: np.ndarray  # [g, V, V]: pairs[i, a, b] = rounds that emitted a at i and b at i+1
    lengths: np.ndarray  # [g+2]: lengths[n] = rounds that emitted n tokens
    rounds: int = 0
    error: str = ""  # the first protocol violation, if any (then the counts are incomplete)


def drive(sampler: Sampler, case: Case, n_tokens: int, rng: np.random.Generator,
          q_reported: np.ndarray | None = None) -> Counts:
    """Call the verify step on fresh draft tokens until n_tokens tokens are emitted."""
    p, q = case.p, case.q
    g, V = q.shape[0], p.shape[1]
    c = Counts(np.zeros((g + 1, V), np.int64), np.zeros((g, V, V), np.int64),
               np.zeros(g + 2, np.int64))
    draft_rng = np.random.default_rng(rng.integers(2**63))
    cdf = np.cumsum(q, axis=1)
    q_arg = q if q_reported is None else q_reported
    emitted, drafts = 0, np.empty((0, g), np.int64)
    while emitted < n_tokens:
        if not len(drafts):
            drafts = draw_rows(cdf, draft_rng.random((4096, g)))
        d, drafts = drafts[0], drafts[1:]
        try:
            out = np.asarray(sampler(p, q_arg, d.copy(), rng)).astype(np.int64).ravel()
        except Exception as e:  # noqa: BLE001 (a sampler that fails is a verdict, not a crash)
            c.error = f"round {c.rounds}: the sampler raised {type(e).__name__}: {e}"
            return c
        n = len(out)
        if not 1 <= n <= g + 1:
            c.error = f"round {c.rounds} emitted {n} tokens (expected 1..{g + 1})"
        elif out.min() < 0 or out.max() >= V:
            c.error = f"round {c.rounds} emitted a token outside 0..{V - 1}: {out.tolist()}"
        elif not np.array_equal(out[:-1], d[: n - 1]):
            c.error = (f"round {c.rounds} emitted {out.tolist()} for drafts {d.tolist()}: "
                       "all tokens but the last must be the accepted drafts")
        if c.error:
            return c
        c.tokens[np.arange(n), out] += 1
        c.pairs[np.arange(n - 1), out[:-1], out[1:]] += 1
        c.lengths[n] += 1
        c.rounds += 1
        emitted += n
    return c


def length_law(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """P(a round emits n tokens), n = 0..g+1, under Algorithm 1: index i is passed with
    probability beta_i = sum_x min(p_i(x), q_i(x)) whatever was emitted before."""
    g = q.shape[0]
    # 1 - beta_i = sum(max(0, p_i - q_i)), written so that it is exactly 0 when q_i == p_i
    beta = 1.0 - np.maximum(p[:g] - q, 0.0).sum(axis=1).clip(0.0, 1.0)
    law = np.zeros(g + 2)
    reach = 1.0
    for i in range(g):
        law[i + 1] = reach * (1.0 - beta[i])
        reach *= beta[i]
    law[g + 1] = reach
    return law


def verify_rows(case: Case, c: Counts, control: str | None = None) -> list[Row]:
    """The three part-1 tests of one configuration, from its counts."""
    p, q = case.p, case.q
    g = q.shape[0]
    n = int(c.tokens.sum())
    tokens = combine([g_parts(c.tokens[i], p[i]) for i in range(g + 1)], c.error)
    pairs = combine([g_parts(c.pairs[i, a], p[i + 1]) for i in range(g) for a in range(p.shape[1])],
                    c.error)
    lengths = combine([g_parts(c.lengths, length_law(p, q))], c.error)
    hist = ([str(x) for x in range(p.shape[1])], p[0], c.tokens[0] / max(1, c.tokens[0].sum()))
    rows = [Row("1", case.name, "tokens by index", n, tokens, control, hist=hist)]
    if c.pairs.sum() or c.error:  # no pairs: gamma 0, or every draft rejected (disjoint supports)
        rows.append(Row("1", case.name, "next token | token", int(c.pairs.sum()), pairs, control))
    rows.append(Row("1", case.name, f"tokens/round ({c.rounds} rounds)", c.rounds, lengths,
                    control))
    return rows


def part1(sampler: Sampler, label: str, cases: list[Case], n_tokens: int, seed: int,
          control: str | None = None) -> list[Row]:
    rows = []
    for case in cases:
        rng = rng_for(seed, "part1", label, case.name)
        q_reported = sharpen(case.q) if control == "unwarped q" else None
        counts = drive(sampler, case, n_tokens, rng, q_reported)
        rows += verify_rows(case, counts, control)
    return rows


# ----------------------------------------------------------------- part 2/3: end to end with models


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
    from minispec.speculative import sampled_vocab_size

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


def unwarped_drafter(target, model, top_k: int = 0):
    """A broken drafter (a control): draws each draft token from the draft model's logits at
    temperature 1 but reports q warped with the run's temperature, as a loop that warps the
    distribution it reports but not the one it samples would. Full recompute, no cache."""
    from minispec.drafters import Draft, Drafter

    class UnwarpedDrafter(Drafter):
        name = "model"

        def propose(self, context, gamma, warp_fn, rng):
            ctx = list(context)
            tokens, qs = [], []
            for _ in range(gamma):
                z = model.logits(ctx)[-1]
                x = sample(warp(z, 1.0, top_k), rng)  # the bug: the temperature is not applied
                tokens.append(x)
                qs.append(warp_fn(z))
                ctx.append(x)
            return Draft(np.array(tokens, dtype=np.int64),
                         np.array(qs, dtype=np.float64).reshape(gamma, self.vocab_size))

    return UnwarpedDrafter(target)


def sample_e2e(target, drafter, prompt: list[int], cfg: E2E, n: int, seed: int,
               label: str, verify: Sampler | None = None) -> list[tuple[int, ...]]:
    """n continuations of L tokens from speculative_generate, one seed each; `verify` replaces
    minispec's verify step (for the controls)."""
    from minispec import verify as minispec_verify
    from minispec.speculative import speculative_generate

    base = int(rng_for(seed, "e2e", label, cfg.name, cfg.draft).integers(2**31))
    out = []
    for i in range(n):
        res = speculative_generate(target, drafter, prompt, gamma=cfg.gamma, max_new_tokens=cfg.L,
                                   temperature=cfg.temperature, top_k=cfg.top_k, top_p=cfg.top_p,
                                   seed=base + i, verify=verify or minispec_verify)
        out.append(tuple(res.tokens))
    return out


def tiny_models(seed: int = MODELS_SEED) -> dict:
    """A random target over a 16-token vocabulary and two drafts: "far", a smaller random model
    (p and q far apart: most drafts rejected, the residual does the work), and "near", the
    target's weights drawn at 0.6x the scale (total variation 0.2 to 0.6 from the target: many
    drafts accepted, bonus tokens common, and every control shows)."""
    from minispec.config import ModelConfig
    from minispec.loader import random_model

    big = ModelConfig(vocab_size=16, hidden_size=32, n_layers=2, n_heads=2, intermediate_size=64,
                      max_position_embeddings=64)
    small = ModelConfig(vocab_size=16, hidden_size=16, n_layers=1, n_heads=2,
                        intermediate_size=32, max_position_embeddings=64)
    return {
        "target": random_model(big, seed=seed, scale=0.5),  # std 0.5: peaked distributions
        "far": random_model(small, seed=seed + 1, scale=0.5),
        "near": random_model(big, seed=seed, scale=0.3),
    }


TINY_PROMPT = [1, 5, 9]
E2E_FULL = [
    E2E(1.0, gamma=2, L=3, draft="far"),
    E2E(1.0, gamma=3, L=3),
    E2E(0.6, gamma=4, L=3),
    E2E(1.5, gamma=3, L=2, draft="far"),
    E2E(1.5, gamma=2, L=3),
    E2E(1.0, top_k=4, gamma=1, L=4),  # L > gamma + 1: several rounds, cache rollbacks between them
    E2E(0.8, top_p=0.8, gamma=2, L=3, draft="far"),
    E2E(0.6, top_k=5, top_p=0.9, gamma=3, L=3),
]
E2E_QUICK = [E2E(0.5, top_k=6, gamma=3, L=3)]  # the three controls' power: checked on this one
E2E_GREEDY = E2E(0.0, gamma=3, L=4)  # one possible outcome: every sample must be the argmax path


def e2e_controls(cfg: E2E) -> list[str]:
    """The controls that can show in this configuration's output. A dropped bonus token is not
    among them: the next round then drafts from the right context, so the output stays exact
    (only slower); part 1's tokens/round test catches it."""
    bugs = ["residual=p", "accept q/p"]
    # "unwarped q" needs a temperature to leave out, the same support for the draws and the
    # reported q (not so with top-p) and a near draft: with the far one nearly every draft is
    # rejected, and the output is the residual whatever the drafts were drawn from.
    if cfg.temperature not in (0.0, 1.0) and cfg.top_p == 1.0 and cfg.draft == "near":
        bugs.append("unwarped q")
    return bugs


def part2(seed: int, quick: bool, n: int, with_controls: bool) -> tuple[list[Row], list[Row]]:
    models = tiny_models()
    target = models["target"]
    rows, controls = [], []
    configs = E2E_QUICK if quick else E2E_FULL
    for cfg in configs + [E2E_GREEDY]:
        draft = models[cfg.draft]
        law = exact_joint(target, TINY_PROMPT, cfg)
        m = 40 if cfg.temperature == 0 else n
        label = f"{cfg.name}, {cfg.draft}"
        rows.append(joint_row("2", label, law, sample_e2e(target, draft, TINY_PROMPT, cfg, m,
                                                          seed, "true")))
        if not with_controls or cfg.temperature == 0:
            continue
        for bug in e2e_controls(cfg):
            if bug == "unwarped q":
                samples = sample_e2e(target, unwarped_drafter(target, draft, cfg.top_k),
                                     TINY_PROMPT, cfg, n, seed, bug)
            else:
                samples = sample_e2e(target, draft, TINY_PROMPT, cfg, n, seed, bug,
                                     verify=broken_sampler(bug))
            controls.append(joint_row("2", label, law, samples, bug))
    return rows, controls


NGRAM_PROMPT = [1, 15, 8, 1, 15]  # "1 15" recurs: the n-gram drafter first drafts "8 1 15"
E2E_DRAFTERS = [E2E(1.0, gamma=2, L=3), E2E(0.6, top_k=6, gamma=3, L=3)]


def part2_drafters(seed: int, quick: bool, n: int) -> list[Row]:
    """The model-free drafters of minispec/drafters/ end to end on the tiny target: n-gram
    lookup (one-hot q) on a prompt with a repeat, and early exit (the target's first layer and
    head, sharing its KV cache)."""
    from minispec.drafters import make_drafter

    target = tiny_models()["target"]
    rows = []
    for name in ("ngram", "early-exit"):
        for cfg in E2E_DRAFTERS[-1:] if quick else E2E_DRAFTERS:
            law = exact_joint(target, NGRAM_PROMPT, cfg)
            samples = sample_e2e(target, make_drafter(name, target), NGRAM_PROMPT, cfg, n, seed,
                                 name)
            rows.append(joint_row("2", f"{cfg.name}, {name}", law, samples))
    return rows


# Batches (minispec/batch.py): the tiny target and its near draft, the prompt several times in
# one batch beside prompts of other lengths; every copy is an independent sample.
E2E_BATCH = E2E(0.5, top_k=6, gamma=3, L=3)
BATCH_COMPANY = [[2, 7], [4, 4, 4, 4, 11], [13]]
BATCH_BUGS = {"batch rows": "each sequence of a batch verified against the next one's logits "
              "(rows of the batched target call misaligned)"}


def misaligned_drafter(target, model):
    """A broken batch (a control): the model drafter whose batched verify call hands sequence b
    the hidden states of sequence b+1 wherever their shapes agree, as an off-by-one split would."""
    from minispec.drafters import ModelDrafter

    class Misaligned(ModelDrafter):
        def verify_forward_batch(self, drafters, prefixes, drafts, caches):
            hs = super().verify_forward_batch(drafters, prefixes, drafts, caches)
            shifted = hs[1:] + hs[:1]
            return [s if s.shape == h.shape else h for s, h in zip(shifted, hs)]

    return Misaligned(target, model)


def part2_batch(seed: int, quick: bool, n: int) -> tuple[list[Row], list[Row]]:
    """generate_batch end to end: the law of the prompt's next L tokens, sampled in batches of
    four copies and three other prompts (a true row and its control)."""
    from minispec.batch import generate_batch

    models = tiny_models()
    target, draft, cfg = models["target"], models["near"], E2E_BATCH
    law = exact_joint(target, TINY_PROMPT, cfg)
    batch = [TINY_PROMPT] * 4 + BATCH_COMPANY

    def samples(drafter, label):
        base = int(rng_for(seed, "batch", label).integers(2**31))
        out = []
        for i in range(-(-n // 4)):
            res = generate_batch(target, drafter, batch, gamma=cfg.gamma, max_new_tokens=cfg.L,
                                 temperature=cfg.temperature, top_k=cfg.top_k, seed=base + i)
            out += [tuple(r.tokens) for r in res[:4]]
        return out[:n]

    label = f"{cfg.name}, near, batch of 7"
    true = joint_row("2", label, law, samples(draft, "true"))
    control = joint_row("2", label, law, samples(misaligned_drafter(target, draft), "rows"),
                        "batch rows")
    return [true], [control]


# ------------------------------------------------ part T: trees of drafts (minispec/tree.py)

# verify_tree alone: a synthetic target f(prefix) (a fixed random row for every prefix of up to
# L tokens over V = 5), trees drawn from a draft g(prefix) in each way minispec's drafters draw
# siblings, rounds repeated until L tokens are out; the law of those L tokens is exact.
TREE_V, TREE_L = 5, 3


@dataclass
class TreeCase:
    shape: tuple[int, ...]  # children per depth
    siblings: str  # "independent" | "without-replacement" | "deterministic"
    draft: str  # "near" (g close to f), "far" (random), "disjoint" (g's mass where f has none)

    @property
    def name(self) -> str:
        return f"tree {','.join(map(str, self.shape))} {self.siblings}, {self.draft} draft"


TREE_FULL = [TreeCase((3,), "independent", "far"), TreeCase((2, 2), "independent", "near"),
             TreeCase((3, 1, 1), "independent", "disjoint"),
             TreeCase((3,), "without-replacement", "far"),
             TreeCase((2, 2, 1), "without-replacement", "near"),
             TreeCase((3, 2), "deterministic", "near"), TreeCase((2, 1, 1), "deterministic", "far"),
             TreeCase((1, 1, 1), "independent", "near")]  # a chain
TREE_QUICK = [TreeCase((2, 2), "independent", "near"),
              TreeCase((3, 2), "without-replacement", "near"),
              TreeCase((3, 2), "deterministic", "near")]
TREE_BUGS = {  # each a one-line change to minispec.tree, patched in for the control's draws
    "tree residual": ("after a rejected sibling the next is tested against the same, un-updated "
                      "target row (residual not updated)", "residual", lambda r, s: r),
    "proposal not renormalized": ("siblings drawn without replacement, verified as if drawn "
                                  "i.i.d. from q", "proposal", "independent"),
    "top-k as sampled": ("deterministic top-k candidates verified as if sampled from q",
                         "proposal", "independent"),
}
TREE_CONTROL_CASES = {"tree residual": TreeCase((3,), "independent", "near"),
                      "proposal not renormalized": TreeCase((3,), "without-replacement", "near"),
                      "top-k as sampled": TreeCase((3,), "deterministic", "near")}


def tree_rows(prefix: tuple[int, ...], who: str, draft: str = "near") -> np.ndarray:
    """f(prefix) (who="target") or g(prefix) (who="draft"): a fixed row for every prefix."""
    rng = rng_for(CASES_SEED, "tree", who, draft, *map(str, prefix))
    f = normalize(np.exp(1.5 * rng_for(CASES_SEED, "tree", "target", *map(str, prefix))
                         .normal(size=TREE_V)))
    if who == "target":
        return f
    if draft == "near":
        return normalize(f * np.exp(0.6 * rng.normal(size=TREE_V)))
    if draft == "disjoint":  # most of g's mass on the token f likes least
        g = normalize(0.05 + f)
        g[np.argmin(f)] += 3.0
        return normalize(g)
    return normalize(np.exp(1.5 * rng.normal(size=TREE_V)))


def draw_tree(case: TreeCase, prefix: tuple[int, ...], rng: np.random.Generator):
    """One tree after `prefix`: tokens, parents, q, and p (the target's row after the prefix and
    after each node)."""
    tokens, parents, q = [], [], []
    frontier = [(-1, prefix)]
    for k in case.shape[: TREE_L - len(prefix)]:
        nxt = []
        for node, pre in frontier:
            g = tree_rows(pre, "draft", case.draft)
            if case.siblings == "deterministic":
                kids = np.argsort(-g, kind="stable")[:k]
            else:
                kids = rng.choice(TREE_V, size=min(k, int((g > 0).sum())), p=g,
                                  replace=case.siblings == "independent")
            for x in kids:
                tokens.append(int(x))
                parents.append(node)
                q.append(g)
                nxt.append((len(tokens) - 1, pre + (int(x),)))
        frontier = nxt
    paths = {-1: prefix}
    for i, (x, a) in enumerate(zip(tokens, parents)):
        paths[i] = paths[a] + (x,)
    p = np.array([tree_rows(paths[i][:TREE_L], "target") for i in range(-1, len(tokens))])
    return np.array(tokens, dtype=np.int64), np.array(parents, dtype=np.int64), \
        np.array(q).reshape(len(tokens), TREE_V), p


def tree_law() -> dict[tuple[int, ...], float]:
    law = {(): 1.0}
    for _ in range(TREE_L):
        law = {pre + (x,): pr * float(tree_rows(pre, "target")[x])
               for pre, pr in law.items() for x in range(TREE_V)}
    return law


def sample_trees(case: TreeCase, n: int, seed: int, label: str) -> list[tuple[int, ...]]:
    from minispec.tree import verify_tree

    rng = rng_for(seed, "tree", label, case.name)
    out = []
    for _ in range(n):
        seq: tuple[int, ...] = ()
        while len(seq) < TREE_L:
            tokens, parents, q, p = draw_tree(case, seq, rng)
            path, token = verify_tree(p, q, tokens, parents, case.siblings, rng)
            seq += tuple(int(tokens[i]) for i in path) + (int(token),)
        out.append(seq[:TREE_L])
    return out


def part_tree(seed: int, quick: bool, n: int, with_controls: bool) -> tuple[list[Row], list[Row]]:
    """verify_tree alone against the exact law, and its controls (minispec.tree patched)."""
    import minispec.tree as tree

    law = tree_law()
    rows = [joint_row("T", case.name, law, sample_trees(case, n, seed, "true"))
            for case in (TREE_QUICK if quick else TREE_FULL)]
    controls = []
    for bug, (_, attr, change) in TREE_BUGS.items() if with_controls else ():
        case = TREE_CONTROL_CASES[bug]
        original = getattr(tree, attr)
        if attr == "proposal":
            def change(q_row, x, tried, siblings, _orig=original, _as=change):
                return _orig(q_row, x, tried, _as)
        setattr(tree, attr, change)
        try:
            controls.append(joint_row("T", case.name, law, sample_trees(case, n, seed, bug), bug))
        finally:
            setattr(tree, attr, original)
    return rows, controls


# tree drafters and EAGLE end to end on the tiny target: the model-tree drafter over the near
# draft, Medusa heads and EAGLE heads (random: the tiny target has none trained; exactness does
# not depend on their quality), EAGLE as a chain, a static tree and EAGLE-2's dynamic tree
E2E_TREE = [E2E(1.0, gamma=3, L=3), E2E(0.6, top_k=6, gamma=3, L=3),
            E2E(1.2, top_p=0.9, gamma=2, L=3)]


def part2_trees(seed: int, quick: bool, n: int) -> list[Row]:
    from minispec.drafters import TreeModelDrafter, random_eagle, random_medusa

    models = tiny_models()
    target = models["target"]
    drafters = {"model-tree 2,2,1": TreeModelDrafter(target, models["near"], (2, 2, 1)),
                "medusa 3,2,1": random_medusa(target, 3, seed=1, scale=0.3, shape=(3, 2, 1)),
                "eagle chain": random_eagle(target, seed=1),
                "eagle 2,2,1": random_eagle(target, seed=1, shape=(2, 2, 1)),
                "eagle-2 3,2,2 beam 2, 6 nodes": random_eagle(target, seed=1, shape=(3, 2, 2),
                                                              dynamic=(2, 6))}
    rows = []
    for label, drafter in drafters.items():
        for cfg in E2E_TREE[1:2] if quick else E2E_TREE:
            law = exact_joint(target, TINY_PROMPT, cfg)
            samples = sample_e2e(target, drafter, TINY_PROMPT, cfg, n, seed, label)
            rows.append(joint_row("2", f"{cfg.name}, {label}", law, samples))
        greedy = E2E_GREEDY
        rows.append(joint_row("2", f"{greedy.name}, {label}", exact_joint(target, TINY_PROMPT,
                                                                          greedy),
                              sample_e2e(target, drafter, TINY_PROMPT, greedy, 40, seed, label)))
    return rows


SHIPPED = E2E(1.0, top_k=3, gamma=3, L=2)


def part3(seed: int, n: int, weights: str) -> tuple[list[Row], str]:
    """The shipped pair, if weights/target and weights/draft are there."""
    tdir, ddir = os.path.join(weights, "target"), os.path.join(weights, "draft")
    missing = [d for d in (tdir, ddir) if not os.path.exists(os.path.join(d, "config.json"))]
    if missing:
        return [], f"part 3 skipped: no model at {', '.join(missing)}"
    import minispec

    target = minispec.load(tdir, device="cpu")
    draft = minispec.load(ddir, device="cpu")
    prompt = target.tokenizer.encode("def main():\n    ", add_bos=True) if target.tokenizer else [0]
    law = exact_joint(target, prompt, SHIPPED)
    samples = sample_e2e(target, draft, prompt, SHIPPED, n, seed, "shipped")
    name = (lambda t: repr(target.tokenizer.decode([t]))) if target.tokenizer else str
    return [joint_row("3", f"shipped pair {SHIPPED.name}", law, samples, name=name)], ""


# ---------------------------------------- part G: whole pipelines (--generator module:factory)
#
# The bugs users of real systems hit are rarely in the ratio test; they are in the pipeline
# around it. So the judge also takes a whole generator: factory(target_dir, draft_dir) ->
# generate(prompt_ids, *, max_new_tokens, temperature, top_k, top_p, seed) -> new token ids.
# It writes a small random pair as Hugging Face directories, computes the exact law of the next
# L tokens from the target alone, and compares the generator's output over many seeds with it.

PIPELINE_FULL = [  # (sampling and L, the draft, the prompt)
    (E2E(1.0, L=2, draft="near"), [1, 5, 9]),
    (E2E(1.0, top_k=3, L=3, draft="near"), [4, 2, 11, 7, 4, 2, 11]),  # repeats: prompt lookup
    (E2E(1.3, top_p=0.8, L=2, draft="far"), [3]),
    (E2E(0.8, top_k=3, L=4, draft="near"), [6, 1, 6, 1, 6]),
    (E2E(1.0, top_k=6, top_p=0.9, L=3, draft="far"), [2, 14, 9, 2, 14]),
    (E2E(1.5, top_k=2, L=3, draft="near"), [4, 2, 11, 7, 4, 2, 11]),
]
# where every planted bug shows, also with few calls (a hot temperature and top-k, a near draft:
# drafts often accepted, few outcomes): each was rejected below 1e-9 there with 200 calls
PIPELINE_CONTROL = PIPELINE_FULL[-1]
PIPELINE_QUICK = [PIPELINE_CONTROL]
PIPELINE_BUGS = {
    "greedy draft": "the draft picks its argmax but reports the sampling q (transformers #32867)",
    "q without top-k": "drafts drawn after top-k, q reported without it (transformers #47932)",
    "cache one short": "the target's cache loses its last position before each verify call",
    "uniforms reused": "verify's acceptance uniforms replay the ones that drew the drafts",
}
# Bugs that cost speed, not exactness, and so cannot be caught from the output alone: a dropped
# bonus token (the next round drafts from the right context), a draft cache never rolled back
# (its q is wrong but is the q its tokens were drawn from). Part 1 catches the first.


def load_generator(spec: str):
    """'module:factory' -> the factory; a module may name in REQUIRES the packages it needs,
    and a missing one ends the run with status 3 (not a verdict)."""
    module_name, sep, name = spec.partition(":")
    if not sep or not module_name or not name:
        raise SystemExit(f"--generator: expected module:factory, got {spec!r}")
    sys.path.insert(0, os.getcwd())
    module = importlib.import_module(module_name)
    missing = [m for m in getattr(module, "REQUIRES", ()) if importlib.util.find_spec(m) is None]
    if missing:
        print(f"verify_distribution: --generator {spec} needs {' and '.join(missing)}, not "
              f"installed here; nothing was tested (pip install {' '.join(missing)})",
              file=sys.stderr)
        raise SystemExit(3)
    factory = getattr(module, name, None)
    if not callable(factory):
        raise SystemExit(f"--generator: {module_name} has no factory {name!r}")
    return factory


def write_pair(root: str) -> dict[str, str]:
    """The tiny target and its two drafts (tiny_models) as Hugging Face directories: config.json
    and model.safetensors in float32, no EOS (nothing may cut the L tokens short)."""
    from minispec.loader import save_checkpoint

    dirs = {}
    for name, model in tiny_models().items():
        dirs[name] = os.path.join(root, name)
        save_checkpoint(model, dirs[name])
        with open(os.path.join(dirs[name], "generation_config.json"), "w") as f:
            f.write('{"do_sample": true, "top_k": 0}\n')
    return dirs


def call_generator(generate, prompt, cfg: E2E, n: int, seed: int, label: str
                   ) -> tuple[list[tuple[int, ...]], str]:
    """n outputs of generate, one seed each; (outputs, the first protocol violation or "")."""
    base = int(rng_for(seed, "pipeline", label, cfg.name).integers(2**31))
    out, t0 = [], time.perf_counter()
    for i in range(n):
        tokens = generate(list(prompt), max_new_tokens=cfg.L, temperature=cfg.temperature,
                          top_k=cfg.top_k, top_p=cfg.top_p, seed=base + i)
        tokens = tuple(int(t) for t in tokens)
        if len(tokens) != cfg.L:
            return out, f"call {i} returned {len(tokens)} tokens, expected {cfg.L}"
        out.append(tokens)
        if sys.stderr.isatty() and (i + 1) % 100 == 0:
            rate = (i + 1) / (time.perf_counter() - t0)
            print(f"\r{label}, {cfg.name}: {i + 1}/{n} calls, {rate:.0f}/s ", end="",
                  file=sys.stderr, flush=True)
    if sys.stderr.isatty():
        print("\r" + " " * 70 + "\r", end="", file=sys.stderr, flush=True)
    return out, ""


def broken_generator(bug: str):
    """minispec's speculative pipeline (the model drafter, gamma 3) with one planted bug."""
    from minispec import Draft, Drafter, load, speculative_generate
    from minispec import verify as minispec_verify
    from minispec.sampling import Sampling

    class Broken(Drafter):
        """A model drafter written out with no cache (every draft a full recompute), with the
        bug planted where it lives in a real pipeline."""

        name = "broken"

        def __init__(self, target, model, sampling):
            super().__init__(target)
            self.model, self.sampling, self.states = model, sampling, []

        def propose(self, context, gamma, warp, rng):
            self.states = [rng.bit_generator.state]
            no_top_k = Sampling(self.sampling.temperature, 0, self.sampling.top_p)
            ctx, tokens, q = list(context), [], []
            for _ in range(gamma):
                z = self.model.logits(ctx)[-1]  # [V]
                row = warp(z)
                x = int(np.argmax(row)) if bug == "greedy draft" else sample(row, rng)
                q.append(no_top_k.warp(z) if bug == "q without top-k" else row)
                tokens.append(x)
                ctx.append(x)
            return Draft(np.array(tokens, dtype=np.int64),
                         np.array(q, dtype=np.float64).reshape(len(tokens), self.vocab_size))

        def verify_forward(self, prefix, draft, cache):
            if bug != "cache one short" or cache.length == 0:
                return super().verify_forward(prefix, draft, cache)
            cache.length -= 1  # the bug: the last position forgotten, the tokens fed one early
            out = super().verify_forward(prefix, draft, cache)
            cache.length += 1
            return out

    def factory(target_dir, draft_dir):
        target, draft = load(target_dir, device="cpu"), load(draft_dir, device="cpu")

        def generate(prompt_ids, *, max_new_tokens, temperature, top_k, top_p, seed):
            drafter = Broken(target, draft, Sampling(temperature, top_k, top_p))

            def verify(p, q, draft_tokens, rng):
                if bug == "uniforms reused" and drafter.states:  # replay the drafts' uniforms
                    rng = np.random.Generator(np.random.PCG64())
                    rng.bit_generator.state = drafter.states.pop()
                return minispec_verify(p, q, draft_tokens, rng)

            return speculative_generate(target, drafter, prompt_ids, gamma=3,
                                        max_new_tokens=max_new_tokens, temperature=temperature,
                                        top_k=top_k, top_p=top_p, seed=seed,
                                        verify=verify).tokens

        return generate

    return factory


def pipeline_label(cfg: E2E, prompt: list[int]) -> str:
    """A part-G configuration (the generator picks its own gamma: none is shown)."""
    return f"{cfg.name.replace(f' g={cfg.gamma}', '')}, {cfg.draft}, prompt of {len(prompt)}"


def part_pipeline(factory, label: str, quick: bool, n: int, seed: int,
                  with_controls: bool = True) -> tuple[list[Row], list[Row]]:
    """Part G: the generator made by `factory` on every configuration; the planted bugs (each
    a broken minispec pipeline) at the same sample size, as controls."""
    import tempfile

    import minispec

    rows, controls = [], []
    with tempfile.TemporaryDirectory() as root:
        dirs = write_pair(root)
        target = minispec.load(dirs["target"], device="cpu")  # the law: from the files written
        made: dict[tuple, object] = {}  # keyed by the factory itself: it stays alive

        def generator(make, draft):
            if (make, draft) not in made:
                made[(make, draft)] = make(dirs["target"], dirs[draft])
            return made[(make, draft)]

        for cfg, prompt in PIPELINE_QUICK if quick else PIPELINE_FULL:
            law = exact_joint(target, prompt, cfg)
            where = pipeline_label(cfg, prompt)
            samples, error = call_generator(generator(factory, cfg.draft), prompt, cfg, n, seed,
                                            label)
            row = joint_row("G", where, law, samples)
            if error:
                row.fit = Fit(row.fit.stat, row.fit.dof, 0.0, error)
            rows.append(row)
        if with_controls:
            cfg, prompt = PIPELINE_CONTROL
            law = exact_joint(target, prompt, cfg)
            for bug in PIPELINE_BUGS:
                samples, _ = call_generator(generator(broken_generator(bug), cfg.draft), prompt,
                                            cfg, n, seed, bug)
                controls.append(joint_row("G", pipeline_label(cfg, prompt), law, samples, bug))
    return rows, controls


# ------------------------------------------------------------------------------------ the report


def fmt_p(p: float) -> str:
    if p == 0.0:
        return "<1e-300"
    return f"{p:.3f}" if p >= 0.001 else f"{p:.1e}"


def print_table(rows: list[Row]) -> None:
    print(f"{'part':<4} {'configuration':<38} {'test':<28} {'samples':>8} {'G / dof':>15} "
          f"{'p-value':>8} {'Holm p':>8}  verdict")
    for r in rows:
        stat = f"{r.fit.stat:.1f} / {r.fit.dof}" if r.fit.dof else "-"
        verdict = "pass" if r.passed else "FAIL"
        exact_zero = r.fit.pvalue == 0 and r.fit.note  # an impossible outcome, not underflow
        p, adjusted = ("0", "0") if exact_zero else (fmt_p(r.fit.pvalue), fmt_p(r.adjusted))
        print(f"{r.part:<4} {r.config:<38} {r.test:<28} {r.samples:>8} {stat:>15} "
              f"{p:>8} {adjusted:>8}  {verdict}"
              + (f"  ({r.fit.note})" if r.fit.note else ""))


def judge_controls(controls: list[Row]) -> list[tuple[str, str, int, int, Row, float, bool]]:
    """Per (part, bug): the smallest p-value over its tests, Bonferroni-corrected by their count."""
    out = []
    for part, bug in dict.fromkeys((r.part, r.control) for r in controls):
        group = [r for r in controls if r.part == part and r.control == bug]
        best = min(group, key=lambda r: r.fit.pvalue)
        p = min(1.0, len(group) * best.fit.pvalue)
        out.append((part, bug, len(group), sum(r.samples for r in group), best, p,
                    p < CONTROL_ALPHA))
    return out


def plot(rows: list[Row], path: str) -> str:
    """Empirical against exact histograms, one panel per test that carries one."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return f"--plot: matplotlib is not installed, {path} not written"
    panels = [r for r in rows if r.hist is not None and (r.part != "1" or r.config.startswith(
        ("dirichlet V=16", "one-hot", "near-zero", "close draft")))]
    if not panels:
        return f"--plot: no histogram to draw, {path} not written"
    cols = 3
    nrows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(5 * cols, 3.2 * nrows), squeeze=False)
    for ax, r in zip(axes.flat, panels):
        labels, exact, empirical = r.hist
        x = np.arange(len(labels))
        ax.bar(x - 0.2, exact, 0.4, label="exact")
        ax.bar(x + 0.2, empirical, 0.4, label=f"sampled (n={r.samples})")
        ax.set_xticks(x, labels, rotation=90 if r.part != "1" else 0, fontsize=7)
        where = "index 0" if r.part == "1" else "next tokens"
        ax.set_title(f"part {r.part}: {r.config}, {where}\np = {fmt_p(r.fit.pvalue)}", fontsize=9)
        ax.legend(fontsize=7)
    for ax in axes.flat[len(panels):]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    return f"wrote {path}"


# -------------------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="the CI subset (well under a minute)")
    ap.add_argument("--sampler", metavar="MODULE:FUNCTION",
                    help="judge this verify step (parts 1 and 4) instead of minispec's")
    ap.add_argument("--plot", metavar="PNG", help="empirical against exact histograms")
    ap.add_argument("--seed", type=int, default=0,
                    help="seeds the draws; the configurations tested are fixed")
    ap.add_argument("--weights", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                      "weights"), help="the shipped pair's folder")
    ap.add_argument("--generator", metavar="MODULE:FACTORY",
                    help="judge this whole generation pipeline (part G) instead; "
                    "factory(target_dir, draft_dir) -> generate(prompt_ids, *, max_new_tokens, "
                    "temperature, top_k, top_p, seed) -> new token ids")
    ap.add_argument("--samples", type=int, default=None,
                    help="calls per configuration of --generator (default 600 quick, 1000 full)")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    if args.generator:
        return judge_generator(args, t0)
    n_tokens = 5000 if args.quick else 20000  # part 1, per configuration and sampler
    n_e2e = 800 if args.quick else 2000  # part 2, per configuration and sampler
    n_shipped = 600  # part 3: a sample costs a few calls of the 5-layer target
    n_tree = 2000 if args.quick else 6000  # part T: L-token samples per tree configuration

    from minispec.verify import verify as minispec_verify

    if args.sampler:
        sampler, name = load_sampler(args.sampler), args.sampler
    else:
        sampler, name = minispec_verify, "minispec.verify"
    print(f"verify_distribution: {'quick' if args.quick else 'full'} run, seed {args.seed}, "
          f"sampler {name}")
    cases = verify_cases(args.quick)
    rows = part1(sampler, "true", cases, n_tokens, args.seed)
    controls = []
    for bug in BUGS:
        broken = minispec_verify if bug == "unwarped q" else broken_sampler(bug)
        controls += part1(broken, bug, cases, n_tokens, args.seed, control=bug)
    notes = []
    if args.sampler:
        notes.append("parts 2 and 3 skipped: they test minispec's speculative_generate")
    else:
        e2e_rows, e2e_controls = part2(args.seed, args.quick, n_e2e, with_controls=True)
        rows += e2e_rows
        rows += part2_drafters(args.seed, args.quick, n_e2e)
        controls += e2e_controls
        batch_rows, batch_controls = part2_batch(args.seed, args.quick, n_e2e)
        rows += batch_rows
        controls += batch_controls
        tree_rows_, tree_controls = part_tree(args.seed, args.quick, n_tree, with_controls=True)
        rows += tree_rows_ + part2_trees(args.seed, args.quick, n_e2e)
        controls += tree_controls
        if args.quick:
            notes.append("part 3 skipped in --quick")
        else:
            shipped_rows, why = part3(args.seed, n_shipped, args.weights)
            rows += shipped_rows
            notes += [why] if why else []

    return report(rows, controls, notes, args.plot, t0)


def judge_generator(args, t0: float) -> int:
    """--generator: part G on the given pipeline, with the planted bugs as controls."""
    factory = load_generator(args.generator)
    n = args.samples or (600 if args.quick else 1000)
    print(f"verify_distribution: {'quick' if args.quick else 'full'} run, seed {args.seed}, "
          f"generator {args.generator}, {n} calls per configuration")
    rows, controls = part_pipeline(factory, args.generator, args.quick, n, args.seed)
    notes = ["part G: a random Llama over 16 tokens and two drafts written as Hugging Face "
             "directories; the law of the next L tokens enumerated with the target alone"]
    return report(rows, controls, notes, args.plot, t0)


def report(rows: list[Row], controls: list[Row], notes: list[str], plot_path: str | None,
           t0: float) -> int:
    """Holm over the true rows, the controls judged, the tables printed; 0 = PASS, 1 = FAIL."""
    for r, adj in zip(rows, holm([r.fit.pvalue for r in rows])):
        r.adjusted = adj
        r.passed = adj >= FAMILY_ALPHA
    print()
    print_table(rows)
    tested = [r.fit.pvalue for r in rows if r.fit.dof > 0 and not r.fit.note]
    ks = stats.kstest(tested, "uniform") if len(tested) >= 2 else None
    if any(r.part == "2" for r in rows):
        print("Part 2 drafts: far = a smaller random model (most drafts rejected); near = the "
              "target's random weights drawn at 0.6x the scale (many accepted).")
    print(f"\nMultiple testing: Holm over the {len(rows)} true tests at family alpha "
          f"{FAMILY_ALPHA} (a test passes when its Holm-adjusted p-value is >= alpha).")
    if ks is not None:
        print(f"Diagnostic: the {len(tested)} true p-values against U(0, 1), Kolmogorov-Smirnov "
              f"D = {ks.statistic:.3f}, p = {fmt_p(ks.pvalue)} (shown, not part of the verdict).")

    judged = judge_controls(controls)
    print(f"\nControls: broken samplers, same tests and sample budget; each must be rejected at "
          f"p < {CONTROL_ALPHA:g} (its smallest p-value times its number of tests, Bonferroni).")
    print(f"{'part':<4} {'control':<15} {'tests':>5} {'samples':>8}  {'smallest p at':<60} "
          f"{'p-value':>8}  verdict")
    for part, bug, m, n, best, p, rejected in judged:
        where = f"{best.config}: {best.test}"
        print(f"{part:<4} {bug:<15} {m:>5} {n:>8}  {where:<60} {fmt_p(p):>8}  "
              f"{'rejected' if rejected else 'NOT REJECTED'}")
    judged_bugs = {c.control for c in controls}
    tree_bugs = {bug: text for bug, (text, _, _) in TREE_BUGS.items()}
    for bug, text in {**BUGS, **BATCH_BUGS, **PIPELINE_BUGS, **tree_bugs}.items():
        if bug in judged_bugs:
            print(f"  {bug}: {text}")
    for note in notes:
        print(f"Note: {note}")
    if plot_path:
        print(plot(rows, plot_path))

    ok_rows = all(r.passed for r in rows)
    ok_controls = all(j[-1] for j in judged)
    print(f"\n{'PASS' if ok_rows and ok_controls else 'FAIL'}: "
          f"{sum(r.passed for r in rows)}/{len(rows)} true tests pass, "
          f"{sum(j[-1] for j in judged)}/{len(judged)} controls rejected, "
          f"{time.perf_counter() - t0:.1f} s")
    return 0 if ok_rows and ok_controls else 1


if __name__ == "__main__":
    sys.exit(main())
