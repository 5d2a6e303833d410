"""Parts 1 and T of the judge: a verify step alone, and the tree walk alone.

Part 1. Fixed target rows p[0..g] and draft rows q[0..g-1]; each round draws g draft tokens from
q and calls verify(p, q, draft_tokens, rng), until N tokens are emitted. For an exact sampler the
token a round emits at index i, given everything emitted before it, is distributed as p[i]
(index i is reached only through the draft prefix, which p[i] is conditioned on). So:
  tokens   the counts at each index i against n_i * p[i] (n_i = tokens emitted at index i),
  pairs    the token at index i+1 given the one at index i, against p[i+1],
  lengths  the number of tokens per round against Algorithm 1's law: index i is passed with
           probability beta_i = sum(min(p_i, q_i)) (this row checks the acceptance rule, i.e. the
           speed claim; a different lossless rule, e.g. block verification, would fail only it).
Conditioning on n_i is valid because whether index i is reached depends only on earlier draws.
Its controls: Algorithm 1 written out below with one line broken each.

Part T. minispec.tree.verify_tree on trees of several shapes whose siblings are drawn i.i.d.,
without replacement, or as top-k candidates, from near, far and disjoint drafts of a synthetic
target (a fixed random row for every prefix), rounds repeated until L tokens are out, against
the exact law of those L tokens. Its controls: the tree walk written out below (`walk_tree`)
with one line broken each.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..core.sampling import sample, warp
from ..tree import children_of, verify_tree
from .stats import (
    CASES_SEED,
    Row,
    combine,
    g_parts,
    joint_row,
    normalize,
    rng_for,
    softmax,
)

Sampler = Callable[[np.ndarray, np.ndarray, np.ndarray, np.random.Generator], np.ndarray]


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


@dataclass
class Case:
    """Fixed target rows p [g+1, V] and draft rows q [g, V] for the verify step alone."""

    name: str
    p: np.ndarray
    q: np.ndarray


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
TREE_BUGS = {  # each a one-line change to the tree walk (walk_tree)
    "tree residual": "after a rejected sibling the next is tested against the same, un-updated "
                     "target row (residual not updated)",
    "proposal not renormalized": "siblings drawn without replacement, verified as if drawn "
                                 "i.i.d. from q",
    "top-k as sampled": "deterministic top-k candidates verified as if sampled from q",
}
TREE_CONTROL_CASES = {"tree residual": TreeCase((3,), "independent", "near"),
                      "proposal not renormalized": TreeCase((3,), "without-replacement", "near"),
                      "top-k as sampled": TreeCase((3,), "deterministic", "near")}


@functools.lru_cache(maxsize=None)  # a fixed function of its arguments, asked ~10^5 times a run
def tree_rows(prefix: tuple[int, ...], who: str, draft: str = "near") -> np.ndarray:
    """f(prefix) (who="target") or g(prefix) (who="draft"): a fixed row for every prefix
    (read-only: it is shared by every call that asks for it)."""
    row = _tree_row(prefix, who, draft)
    row.setflags(write=False)
    return row


def _tree_row(prefix: tuple[int, ...], who: str, draft: str) -> np.ndarray:
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


def walk_tree(p, q, tokens, parents, siblings: str, rng: np.random.Generator,
              bug: str | None = None) -> tuple[list[int], int]:
    """minispec.tree.verify_tree written out once more, so that each control changes one line.

    With bug=None this is the correct walk; the judge tests minispec's own, not this one.
    """
    if bug in ("proposal not renormalized", "top-k as sampled"):
        siblings = "independent"  # the bug: every sibling taken for an i.i.d. draw from q
    kids = children_of(parents)
    path: list[int] = []
    node = -1
    while True:
        r = np.asarray(p[node + 1], dtype=np.float64)
        tried: list[int] = []
        for c in kids[node]:
            x = int(tokens[c])
            if siblings == "deterministic":
                s = np.zeros(len(r))
                s[x] = 1.0
            else:
                s = np.array(q[c], dtype=np.float64)
                if siblings == "without-replacement" and tried:
                    s[tried] = 0.0
                    s /= s.sum()
            if rng.random() * s[x] < r[x]:
                path.append(c)
                node = c
                break
            if bug != "tree residual":  # the bug: the next sibling tested against the same r
                res = np.maximum(r - s, 0.0)
                r = res / res.sum() if res.sum() > 0 else r
            tried.append(x)
        else:
            return path, sample(r, rng)


def sample_trees(case: TreeCase, n: int, seed: int, label: str, bug: str | None = None
                 ) -> list[tuple[int, ...]]:
    """n sequences of TREE_L tokens, trees verified round after round by minispec's
    verify_tree (or, for a control, by walk_tree with `bug`)."""
    rng = rng_for(seed, "tree", label, case.name)
    out = []
    for _ in range(n):
        seq: tuple[int, ...] = ()
        while len(seq) < TREE_L:
            tokens, parents, q, p = draw_tree(case, seq, rng)
            if bug is None:
                path, token = verify_tree(p, q, tokens, parents, case.siblings, rng)
            else:
                path, token = walk_tree(p, q, tokens, parents, case.siblings, rng, bug)
            seq += tuple(int(tokens[i]) for i in path) + (int(token),)
        out.append(seq[:TREE_L])
    return out


def part_tree(seed: int, quick: bool, n: int, with_controls: bool) -> tuple[list[Row], list[Row]]:
    """verify_tree alone against the exact law, and its controls (walk_tree, one line broken)."""
    law = tree_law()
    rows = [joint_row("T", case.name, law, sample_trees(case, n, seed, "true"))
            for case in (TREE_QUICK if quick else TREE_FULL)]
    controls = []
    for bug in TREE_BUGS if with_controls else ():
        case = TREE_CONTROL_CASES[bug]
        controls.append(joint_row("T", case.name, law, sample_trees(case, n, seed, bug, bug),
                                  bug))
    return rows, controls
