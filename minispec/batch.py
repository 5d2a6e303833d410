"""Batches of sequences, and speculation that knows the load.

A lone request leaves a memory-bound step with arithmetic to spare, and speculative decoding
spends it: checking gamma + 1 tokens costs about what generating one does. A full batch has no
arithmetic to spare: B sequences already share each read of the weights, and their B x (gamma
+ 1) verify tokens compete for compute in use. There speculation can lower throughput, and
production systems turn it off as the batch fills. This module decodes a batch with or without
speculation, and with gamma="load-aware" chooses gamma (0 = off) round by round from measured
costs and the acceptance seen so far.

    results = generate_batch(target, draft, prompts, gamma="load-aware", max_new_tokens=64,
                             temperature=0)

Each sequence is its own speculative decoding (the round of minispec/core/speculative.py, for B
sequences at once): its own accepted prefix, KV cache, random stream and stop reason; the
drafter drafts for every live sequence in one call per draft step and the target verifies them
all in one call (minispec/batch_forward.py). A finished sequence leaves the batch; `BatchDecoder`
lets new ones join between rounds (continuous batching).

Random streams: sequence i of a batch draws every random number from
numpy.random.default_rng([seed, i]). With a fixed integer gamma (or "auto", which adapts per
sequence) its draws, and so its output, do not depend on which prompts share its batch: it gets
the same tokens in any batch, alone included, up to float rounding (tests/test_batch.py). With
"load-aware" the gamma of a round depends on the batch's size, so a sequence's output can change
with its company, while staying distributed exactly as the target's (gamma depends only on
rounds already verified).
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from .batch_forward import batch_head, batch_hidden
from .core.drafter import Draft, Drafter, ModelDrafter, NoDrafter
from .core.model import KVCache, Model
from .core.sampling import Sampling
from .core.speculative import (
    DEFAULT_GAMMA,
    GenerationResult,
    Request,
    Stats,
    as_drafter,
    check_prompt,
    expected_tokens_per_call,
    gamma_label,
    gamma_policy,
    generation_result,
    make_warp,
    new_target_cache,
)
from .core.verify import verify as minispec_verify
from .drafters import draft_model, make_drafter
from .errors import MinispecError
from .tree import TreeDrafter, check_draft, finish_round, hidden_tree, settle

# ---- a drafter's round, for a batch ----------------------------------------------------------
# A drafter serves a batch through the same contract (minispec/core/drafter.py): each sequence
# has its own copy of the batch's drafter (a shallow copy sharing weights and settings), which
# `start` gives state of its own. Two optional methods let a drafter serve the whole batch in
# fewer calls, propose_batch and target_forward_batch (EarlyExitDrafter has both); a draft model
# drafts for every sequence in one call per step (minispec/drafters/draft_model.py), except
# on the CPU step in a batch of one or two, where each sequence's chain in one numba call of its
# own (FusedModelDrafter) is faster.

CHAINS_UP_TO = 2  # the most live sequences drafted one chain-call each (weights/README.md,
# "A small batch's drafts, one chain each")


def propose_batch(drafter: Drafter, drafters: list[Drafter], contexts, gammas, warp, rngs):
    """`propose` for each sequence of a batch (drafters: their copies of `drafter`)."""
    if hasattr(drafter, "propose_batch"):
        return drafter.propose_batch(drafters, contexts, gammas, warp, rngs)
    if (isinstance(drafter, draft_model.FusedModelDrafter) and len(drafters) <= CHAINS_UP_TO
            and getattr(getattr(drafter.model, "fast_steps", None), "draft_chain", None)):
        return [d.propose(c, g, warp, r) for d, c, g, r in zip(drafters, contexts, gammas, rngs)]
    if isinstance(drafter, ModelDrafter) and type(drafter).propose in (
            ModelDrafter.propose, draft_model.FusedModelDrafter.propose,
            draft_model.TunedModelDrafter.propose):
        return draft_model.propose_batch(drafters, contexts, gammas, warp, rngs)
    return [d.propose(c, g, warp, r) for d, c, g, r in zip(drafters, contexts, gammas, rngs)]


def target_forward_batch(drafter: Drafter, drafters: list[Drafter], unseen_lists, drafts,
                         caches) -> list:
    """`target_forward` for each sequence of a batch -> one hidden [m_b + n_b, D] each: every
    chain in one batched target call (minispec/batch_forward.py), a tree on its own."""
    if hasattr(drafter, "target_forward_batch"):
        return drafter.target_forward_batch(drafters, unseen_lists, drafts, caches)
    if type(drafter).target_forward not in (Drafter.target_forward, TreeDrafter.target_forward):
        return [d.target_forward(p, t, c) for d, p, t, c in
                zip(drafters, unseen_lists, drafts, caches)]
    return batched_target_forward(drafter.target, unseen_lists, drafts, caches)


def batched_target_forward(target: Model, unseen_lists, drafts, caches) -> list:
    """The default `target_forward_batch`: the chains of every sequence in one call of
    `target`, each tree in a call of its own."""
    chains = [b for b, t in enumerate(drafts) if t.parents is None]
    out = [None] * len(drafts)
    fed = [unseen_lists[b] + drafts[b].tokens.tolist() for b in chains]
    hs = batch_hidden(target, fed, [caches[b] for b in chains]) if chains else []
    for b, h in zip(chains, hs):
        caches[b].length -= len(drafts[b].tokens)
        out[b] = h
    for b, t in enumerate(drafts):
        if t.parents is not None:
            out[b] = hidden_tree(target, unseen_lists[b], t.tokens, t.parents, caches[b])
    return out


def batch_drafter(target: Model, drafter) -> Drafter:
    """The Drafter a batch drafts with: a draft Model as make_drafter("model") makes it (its
    chain in one call where the CPU step serves, its greedy vocabulary), else as_drafter's."""
    if isinstance(drafter, Model) and isinstance(target, Model):
        return make_drafter("model", target, draft_model=drafter)
    return as_drafter(target, drafter)


def draft_step(drafter: Drafter):
    """What one draft step of `drafter` runs, for timing (`calibrate`, minispec/measure/):
    (model, layers), the model's first `layers` layers (None: all) and its head, or None for a
    drafter without a forward call."""
    if isinstance(drafter, ModelDrafter):
        return drafter.model, None
    own = getattr(drafter, "draft_step", None)
    return own() if own is not None else None


# ---- the load-aware policy ---------------------------------------------------------------------


@dataclass
class BatchCosts:
    """Measured seconds of the calls a batched round makes, by batch size B (`calibrate`).

    verify[B][k]: one target call of B sequences feeding k tokens each (k = 1: a plain decode
    step of the batch; k = gamma + 1: a verify call), for some k (always 1 and the largest).
    draft[B]: one draft step of B sequences (0 for a drafter without a forward call). Between
    measured sizes and token counts, linear in B and in k.
    rounds[B][gamma] (optional): one whole round of B sequences drafting gamma tokens each, as
    BatchDecoder.step plays it (drafting, the target call, the heads, every sequence's warp
    and verify, the bookkeeping); when measured, `t_round` is that, else the calls' sum.
    """

    verify: dict[int, dict[int, float]] = field(default_factory=dict)
    draft: dict[int, float] = field(default_factory=dict)
    rounds: dict[int, dict[int, float]] | None = None
    # the interpolated costs asked for so far: the policy asks for the same few every round
    _memo: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def t_verify(self, B: int, k: int) -> float:
        key = ("verify", B, k)
        if key not in self._memo:
            self._memo[key] = _interpolate(
                {b: _interpolate(row, k) for b, row in self.verify.items()}, B)
        return self._memo[key]

    def t_draft(self, B: int) -> float:
        key = ("draft", B)
        if key not in self._memo:
            self._memo[key] = _interpolate(self.draft, B)
        return self._memo[key]

    def t_round(self, B: int, gamma: int) -> float:
        """A round of B sequences at this gamma: as measured (`rounds`, linear in B between
        the sizes timed), else Theorem 3.8's sum, gamma draft steps and one verify call."""
        if self.rounds is None:
            return gamma * self.t_draft(B) + self.t_verify(B, gamma + 1)
        key = ("round", B, gamma)
        if key not in self._memo:
            self._memo[key] = _interpolate({b: row[gamma] for b, row in self.rounds.items()}, B)
        return self._memo[key]

    @property
    def max_k(self) -> int:
        return min(max(row) for row in self.verify.values())

    @property
    def max_gamma(self) -> int:
        """The most drafts a round the costs cover."""
        if self.rounds is None:
            return self.max_k - 1
        return min(max(row) for row in self.rounds.values())


def _interpolate(table: dict[int, float], x: float) -> float:
    """Piecewise linear through (B, seconds); beyond the ends, the nearest two points' line."""
    xs = sorted(table)
    if len(xs) == 1:
        return table[xs[0]] * x / xs[0]
    i = int(np.clip(np.searchsorted(xs, x), 1, len(xs) - 1))
    x0, x1 = xs[i - 1], xs[i]
    y0, y1 = table[x0], table[x1]
    return max(y0 + (y1 - y0) * (x - x0) / (x1 - x0), 0.0)


class LoadAwareGamma:
    """gamma="load-aware": before each round, the gamma with the most expected new tokens per
    second for the batch's current size B, from measured costs and the acceptance seen so far.

    Theorem 3.8 of Leviathan et al. 2023, generalized to a batch: a round of B sequences with
    gamma drafts each costs gamma draft steps of the batch and one verify call of B x (gamma
    + 1) tokens, and yields B x E[tokens] new tokens, E = (1 - alpha^(gamma+1)) / (1 - alpha):

        rate(gamma) = B E(alpha, gamma) / t_round(B, gamma),
        t_round(B, gamma) = gamma t_draft(B) + t_verify(B, gamma + 1)     (the theorem's),

    and rate(0) = B / t_round(B, 0) is speculation off. `time_rounds` times whole rounds as the
    decoder plays them (BatchCosts.rounds): on a CPU a small model's round also pays for the
    loop's own work (a warp and a draw per draft, each sequence's verify) and for weights gone
    cold in the caches between the calls, which timing the calls alone leaves out.

    alpha is the per-token acceptance accepted / (accepted + rejections) of the rounds so far,
    started from a prior of `alpha0` worth `prior` tested drafts. Whether to draft at all is
    decided at an optimistic alpha, one standard error above that estimate: a policy that
    switched speculation off on a pessimistic prior would never draft again and never learn it
    was wrong; as drafts are tested the margin shrinks. How many to draft is decided at the
    estimate itself: any gamma measures alpha, and optimism would lengthen the chains.

    Turning speculation on or off has a price the costs leave out (the first rounds after the
    switch run slower, a draft model first reads the tokens it missed), and where the two modes
    are close, flipping between them costs more than either: the policy switches only for a
    rate `stay` above the current mode's best. The choice depends only on rounds already
    verified, so the output stays exact.
    """

    def __init__(self, costs: BatchCosts, max_gamma: int = 8, alpha0: float = 0.7,
                 prior: float = 20.0, stay: float = 0.05) -> None:
        self.costs = costs
        self.max_gamma = min(max_gamma, costs.max_gamma)
        self.accepted, self.tested = alpha0 * prior, prior
        self.gamma: int | None = None  # the last round's (None before the first)
        self.stay = stay

    @property
    def alpha(self) -> float:
        return self.accepted / self.tested

    @property
    def alpha_optimistic(self) -> float:
        a = self.alpha
        return min(a + math.sqrt(a * (1 - a) / self.tested), 1.0)

    def rate(self, gamma: int, B: int, alpha: float | None = None) -> float:
        """Expected new tokens per second with this gamma at batch size B (at the optimistic
        alpha unless one is given)."""
        alpha = self.alpha_optimistic if alpha is None else alpha
        tokens = B * expected_tokens_per_call(min(alpha, 1.0), gamma)
        return tokens / self.costs.t_round(B, gamma)

    def choose(self, B: int) -> int:
        """The gamma of the next round at batch size B: speculation on where its best rate at
        the optimistic alpha beats plain decoding's (the last round's mode kept while its rate
        is within `stay` of the other's), and then the gamma of the best rate at the measured
        alpha. Optimism is for trying speculation at all; every drafting gamma measures alpha
        alike, and an optimistic alpha would favour long chains (their tokens grow fastest
        with it)."""
        off = self.rate(0, B)
        on = max((self.rate(g, B) for g in range(1, self.max_gamma + 1)), default=0.0)
        drafting = on > off
        if self.gamma is not None and drafting != (self.gamma > 0):  # a switch of mode, only
            kept, other = (on, off) if self.gamma > 0 else (off, on)  # for a clear gain
            if kept >= (1 - self.stay) * other:
                drafting = self.gamma > 0
        self.gamma = 0 if not drafting else max(
            range(1, self.max_gamma + 1), key=lambda g: self.rate(g, B, alpha=self.alpha))
        return self.gamma

    def update(self, depth: int, accepted: int) -> None:
        if depth:
            self.accepted += accepted
            self.tested += accepted + (accepted < depth)


def batch_sizes_up_to(n: int) -> tuple[int, ...]:
    """The batch sizes `calibrate` times for a batch of at most n sequences: the powers of two
    below n, and n (the costs are linear in B between them)."""
    return tuple(sorted({2**i for i in range(n.bit_length()) if 2**i < n} | {n}))


CALIBRATED_K = (1, 2, 3, 5)  # token counts timed besides max_k; others are interpolated
TIMED_GAMMAS = (0, 1, 2, 4)  # the rounds' gammas timed besides max_gamma (time_rounds)
# before timing a gamma's rounds, untimed rounds at that gamma for WARM_UP_S seconds (at most
# WARM_UP_ROUNDS): on a shared CPU the rounds after other work run up to twice as slow as the
# loop's steady ones (the shipped pair, batch 4: a plain round 3.0-4.0 ms in a run of plain
# rounds, 5.8-6.8 ms right after a speculative one; batch 1, gamma 4: 6.0 -> 3.5 ms over ten).
# Plain rounds (gamma 0), the cheapest, always get all WARM_UP_ROUNDS: after the prompt's round
# they slow most, and longest (the shipped pair, batch 8: 6.0, 5.3, 4.8, 4.2, 4.0, 3.6, then
# 3.4 ms from the eighth on; batch 16: 8.7 ms down to 6.9 at the eighth). Every gamma gets at
# least WARM_UP_LEAST: the first drafting round reads the whole context into a draft model's
# cache (the shipped pair, batch 1: 183 ms, 21 ms, 3.2 ms, then 1.8-2.1 ms at gamma 2)
WARM_UP_S, WARM_UP_ROUNDS, WARM_UP_LEAST = 0.03, 8, 3
# then timed rounds: at least `repeats`, more while they add up to less than TIMED_S seconds (at
# most TIMED_ROUNDS); their median is the gamma's cost
TIMED_S, TIMED_ROUNDS = 0.02, 6


def calibrate(target: Model, draft: Model | None = None, *, draft_layers: int | None = None,
              batch_sizes: Sequence[int] = (1, 2, 4, 8, 16, 32), max_k: int = 9,
              context: int = 64, repeats: int = 2, drafter=None,
              sampling: Sampling | None = None) -> BatchCosts:
    """Time the batched calls `LoadAwareGamma` weighs, on caches of `context` positions; with a
    `drafter` (a Drafter made for target, or a draft Model), its rounds too (`time_rounds`, at
    `sampling`, greedy if None), which the policy then weighs instead of the calls' sum.

    draft: the model one draft step runs (its first draft_layers layers and the head, for the
    early-exit drafter: draft=target), or None for a drafter without a forward call.
    Each B is timed at k in CALIBRATED_K and max_k (a verify call's cost is close to linear in
    k between them: the products' rows), `repeats` times, in passes over all of them (so a
    burst of load on a shared machine hits every size a little rather than one size a lot),
    after one untimed call (a draft step right after another, as a round runs them, its
    weights still in the caches); the fastest time is kept (interference only ever adds time), then
    made monotone: a cost is raised to the largest kept for fewer tokens or a smaller batch.
    A batch of one is timed through the model's own call, as the decoder runs it (batch_hidden:
    the CPU step or a CUDA graph where the model has one).
    """
    from .batch_forward import batch_embed, batch_run_layers

    context = min(context, target.config.max_position_embeddings - max_k)
    ids = (np.arange(context + max_k) % min(target.vocab_size, 256)).tolist()

    def prepared(model, B):  # B caches holding `context` positions, room for max_k more:
        one = model.new_cache(context + max_k)  # one prefill, copied (the same tokens in each)
        batch_hidden(model, [ids[:context]], [one])
        return [one] + [KVCache(one.k.copy(), one.v.copy(), one.length) for _ in range(B - 1)]

    def timed(model, caches, B, k, layers=None):
        t0 = time.perf_counter()  # the cache stays at `context`: each call writes the same k
        if B == 1 and layers is None:
            model.lm_head(model.hidden_states(ids[context:context + k], caches[0]))
            caches[0].rollback(context)
        else:
            h = batch_run_layers(model, batch_embed(model, [ids[context:context + k]] * B,
                                                    [context] * B), caches, [context] * B,
                                 [k] * B, 0, layers)
            model.lm_head(h)
        return time.perf_counter() - t0

    ks = sorted({k for k in CALIBRATED_K if k < max_k} | {max_k})
    calls = [(target, B, k, None, ("verify", B, k)) for B in batch_sizes for k in ks]
    if draft is not None:
        calls += [(draft, B, 1, draft_layers, ("draft", B, 1)) for B in batch_sizes]
    most = max(batch_sizes)  # every size takes the first B of the same caches (calls keep them)
    caches = {"verify": prepared(target, most)}
    if draft is not None:
        caches["draft"] = prepared(draft, most)
    best = dict.fromkeys([key for *_, key in calls], float("inf"))
    for r in range(repeats + 1):  # pass 0 is the untimed warm-up
        for model, B, k, layers, key in calls:
            t = timed(model, caches[key[0]][:B], B, k, layers)
            if key[0] == "draft":  # a round's draft steps run back to back: time a warm one
                t = timed(model, caches[key[0]][:B], B, k, layers)  # (the first, cold: 2-4x)
            best[key] = min(best[key], t) if r else best[key]
    verify = {B: {k: best["verify", B, k] for k in ks} for B in batch_sizes}
    draft_s = {B: best["draft", B, 1] if draft is not None else 0.0 for B in batch_sizes}
    # more work never costs less: timing noise (a shared machine) is taken out by keeping each
    # cost at least the largest one measured for less work (fewer tokens, a smaller batch)
    sizes = sorted(batch_sizes)
    for i, B in enumerate(sizes):
        for j, k in enumerate(ks):
            smaller = [verify[B][ks[j - 1]]] if j else []
            smaller += [verify[sizes[i - 1]][k]] if i else []
            verify[B][k] = max([verify[B][k], *smaller])
        if i:
            draft_s[B] = max(draft_s[B], draft_s[sizes[i - 1]])
    rounds = None
    if drafter is not None:
        rounds = time_rounds(target, drafter, sampling or Sampling(), batch_sizes=batch_sizes,
                             max_gamma=max_k - 1, context=context, repeats=repeats)
    return BatchCosts(verify, draft_s, rounds)


def time_rounds(target: Model, drafter, sampling: Sampling, *, batch_sizes: Sequence[int],
                max_gamma: int = 8, context: int = 64, repeats: int = 2
                ) -> dict[int, dict[int, float]]:
    """{B: {gamma: seconds}} for gamma 0..max_gamma: one round of B sequences drafting gamma
    tokens each, as BatchDecoder.step plays it (what LoadAwareGamma weighs).

    B copies of a `context`-token prompt are read in a first, untimed round; then for each
    gamma of TIMED_GAMMAS and max_gamma, untimed rounds at that gamma (WARM_UP_S, at least
    WARM_UP_LEAST, all WARM_UP_ROUNDS at gamma 0: the loop's steady state, where a policy that
    settles on a gamma runs), then timed rounds (`repeats`, or more up to TIMED_S), their
    median kept. Rounds that draft cost a + b gamma, the line through them by the median of
    the pairwise slopes (Theil-Sen: one slow round moves it little); gamma 0, a round without
    drafting, stands apart: it is timed first and again last, the lower kept. Sizes are then
    made monotone as `calibrate`'s calls are: a larger batch never costs less.

    The rounds are the loop's own: the drafter's steps with a warp and a draw per draft, the
    target call, every sequence's verify, and the weights as warm as a round leaves them. A
    drafter without a draft model (draft_step None: a lookup, heads) is timed as gamma free
    drafts, as the calls' sum takes it: the synthetic prompt gives a lookup nothing to copy.
    The sequences grow by at most gamma + 1 tokens a round; a short context times less.
    """
    drafter = batch_drafter(target, drafter)  # the decoder's own: a chain in one call
    if draft_step(drafter) is None:
        drafter = _FreeDrafts(target)
    limit = target.config.max_position_embeddings

    def gammas(most):
        return sorted({g for g in TIMED_GAMMAS if g < most} | {most})

    def grows(most):  # the new tokens a sequence may emit: the prompt's round emits 1
        rounds = WARM_UP_ROUNDS + max(repeats, TIMED_ROUNDS)
        return 1 + rounds * (1 + sum(g + 1 for g in gammas(most)))

    while max_gamma > 0 and grows(max_gamma) + 1 > limit:
        max_gamma -= 1
    new = grows(max_gamma)
    ids = min(drafter.vocab_size, getattr(drafter, "model", target).vocab_size, 256)
    prompt = np.arange(max(1, min(context, limit - new))) % ids  # ids every side can read
    rounds = {}
    for B in sorted(batch_sizes):
        decoder = copies_of(target, drafter, sampling, prompt.tolist(), B, Request(new))
        best: dict[int, float] = {}
        for g in gammas(max_gamma) + [0]:  # gamma 0 again last: it has no line to steady it
            for s in decoder.live:
                s.policy.gamma = g
            warm = time.perf_counter() + WARM_UP_S
            for i in range(WARM_UP_ROUNDS):  # untimed: the first rounds at a gamma run slower
                decoder.step()
                if g and i + 1 >= WARM_UP_LEAST and time.perf_counter() > warm:
                    break
            times = []
            while len(times) < repeats or (sum(times) < TIMED_S and len(times) < TIMED_ROUNDS):
                t0 = time.perf_counter()
                decoder.step()
                times.append(time.perf_counter() - t0)
            best[g] = min(float(np.median(times)), best.get(g, math.inf))
        drafting = [(g, t) for g, t in best.items() if g]
        slopes = [(t1 - t0) / (g1 - g0) for i, (g0, t0) in enumerate(drafting)
                  for g1, t1 in drafting[i + 1:]]
        b = max(float(np.median(slopes)), 0.0) if slopes else 0.0
        a = float(np.median([t - b * g for g, t in drafting])) if drafting else 0.0
        rounds[B] = {0: best[0], **{g: a + b * g for g in range(1, max_gamma + 1)}}
    sizes = sorted(batch_sizes)
    for small, B in zip(sizes, sizes[1:]):
        rounds[B] = {g: max(t, rounds[small][g]) for g, t in rounds[B].items()}
    return rounds


def copies_of(target: Model, drafter, sampling: Sampling, prompt: list[int], B: int,
              request: Request) -> BatchDecoder:
    """A BatchDecoder (gamma 0) of B sequences of one prompt, sequence b drawing from
    default_rng([0, b]), the prompt read once: the first sequence's round reads it, and the
    others' caches get its keys and values but the last token's, which their first round feeds
    (a drafter's own state follows the cache's length). What time_rounds times: a prefill of
    B x context tokens cost as much as the rounds after it (batch 32: 0.72 of 2.4 s)."""
    decoder = BatchDecoder(target, drafter, sampling, gamma=0)
    decoder.add(prompt, request, np.random.default_rng([0, 0]))
    decoder.step()  # the prompt's round, one sequence: a prefill, not a decode round
    read, n = decoder.live[0].cache, len(prompt) - 1
    for b in range(1, B):
        decoder.add(prompt, request, np.random.default_rng([0, b]))
        cache = decoder.live[-1].cache
        cache.k[:, :, :n], cache.v[:, :, :n] = read.k[:, :, :n], read.v[:, :, :n]
        cache.length = n
    return decoder


class _FreeDrafts(Drafter):
    """For timing a round of a drafter without a draft model: gamma drafts that cost nothing
    (the context's last token repeated, one-hot q)."""

    name = "free"

    def propose(self, context, gamma, warp, rng) -> Draft:
        tokens = np.full(gamma, context[-1], dtype=np.int64)
        q = np.zeros((gamma, self.vocab_size))
        q[:, context[-1]] = 1.0
        return Draft(tokens, q)


# ---- the batch decoder ----------------------------------------------------------------------


@dataclass
class _Sequence:
    """One sequence of the batch and everything that is its own."""

    slot: int
    prompt: list[int]
    context: list[int]
    max_new: int
    eos: tuple[int, ...]
    rng: np.random.Generator
    cache: object
    drafter: Drafter  # its own fork of the batch's drafter, started on its prompt
    policy: object  # its gamma policy (fixed or auto); unused when the batch is load-aware
    stats: Stats
    started: float = field(default_factory=time.perf_counter)

    @property
    def left(self) -> int:
        return self.max_new - (len(self.context) - len(self.prompt))


class BatchDecoder:
    """Speculative decoding of a changing batch of sequences, one round at a time.

    add() a sequence whenever; step() runs one round for every live sequence and returns the
    ones that finished, which leave the batch. gamma: an integer (0 = plain decoding),
    "auto" (Hugging Face's schedule, per sequence) or "load-aware" (one gamma per round for the
    whole batch, `LoadAwareGamma`; costs: its BatchCosts, if not given its own rounds timed
    by `time_rounds` for batches of 1..max_batch sequences (default 32): each size timed adds
    to the calibration). verify: the speculative step, as in speculative_generate.
    """

    def __init__(self, target: Model, drafter, sampling: Sampling, *, gamma=DEFAULT_GAMMA,
                 verify=minispec_verify, costs: BatchCosts | None = None,
                 max_batch: int | None = None) -> None:
        self.drafter = NoDrafter(target) if drafter is None else batch_drafter(target, drafter)
        self.target, self.sampling, self.verify = target, sampling, verify
        self.gamma = gamma
        self.load_aware = None
        if max_batch is not None and (isinstance(max_batch, bool)
                                      or not isinstance(max_batch, (int, np.integer))
                                      or max_batch < 1):
            raise MinispecError(f"max_batch: expected a positive integer or None, got "
                                f"{max_batch!r:.40}")
        if isinstance(gamma, str) and gamma == "load-aware":
            if costs is None:  # the rounds this decoder will play, timed
                costs = BatchCosts(rounds=time_rounds(
                    target, self.drafter, sampling,
                    batch_sizes=batch_sizes_up_to(int(max_batch or 32))))
            self.load_aware = LoadAwareGamma(costs)
        else:
            gamma_policy(gamma, least=0)  # checked now, one policy per sequence at add()
        self.live: list[_Sequence] = []
        self._next = 0
        self.warp = make_warp(sampling, self.drafter.vocab_size)

    def add(self, prompt_ids, request: Request, rng: np.random.Generator | None = None) -> int:
        """A new sequence joins the batch; returns its slot number (its key in step's output)."""
        prompt, max_new = check_prompt(self.target, prompt_ids, request)
        slot, self._next = self._next, self._next + 1
        rng = np.random.default_rng(request.seed) if rng is None else rng
        cache = new_target_cache(self.target, len(prompt), max_new)
        policy = None if self.load_aware else gamma_policy(self.gamma, least=0)
        drafter = copy.copy(self.drafter)  # the same weights and settings; start gives it
        # per-sequence state of its own
        drafter.start(list(prompt), cache)
        stats = Stats(self.drafter.name, gamma_label(self.gamma, self.gamma))
        self.live.append(_Sequence(slot, prompt, list(prompt), max_new, request.eos_token_ids,
                                   rng, cache, drafter, policy, stats))
        return slot

    def step(self) -> list[tuple[int, GenerationResult]]:
        """One round for every live sequence: speculative_round's steps with the drafting and
        the target call batched: draft for all, one target call for all, then each sequence
        settles its own verify. Returns (slot, result) of those that stopped (EOS or their
        budget)."""
        seqs = self.live
        if not seqs:
            return []
        if self.load_aware is not None:
            g = self.load_aware.choose(len(seqs))
            gammas = [min(g, s.left - 1) for s in seqs]
        else:
            gammas = [min(s.policy.gamma, s.left - 1) for s in seqs]
        drafters = [s.drafter for s in seqs]
        t0 = time.perf_counter()
        drafts = propose_batch(self.drafter, drafters, [s.context for s in seqs], gammas,
                               self.warp, [s.rng for s in seqs])
        drafts = [check_draft(d, g, self.drafter, room=s.cache.max_len - len(s.context))
                  for d, g, s in zip(drafts, gammas, seqs)]
        t1 = time.perf_counter()
        hidden = target_forward_batch(
            self.drafter, drafters, [s.context[s.cache.length:] for s in seqs], drafts,
            [s.cache for s in seqs])  # one target call for every sequence's chain
        probs = batch_head(self.target, hidden, [len(d.tokens) + 1 for d in drafts], self.warp)
        done = []
        for s, g, d, p, h in zip(seqs, gammas, drafts, probs, hidden):
            path, token = settle(self.verify, p, d, s.rng)
            r = finish_round(s.drafter, s.context, s.cache, d, path, token, h, s.eos)
            r.gamma = g
            r.draft_seconds = t1 - t0  # the batch's time: every sequence waited for all of it
            r.verify_seconds = time.perf_counter() - t1
            s.stats.add(r)
            (self.load_aware or s.policy).update(r.depth, r.accepted)
            if r.hit_eos or s.left <= 0:
                done.append((s.slot, generation_result(s.context, s.prompt, s.stats,
                                                       s.drafter.calls, s.started)))
        finished = {slot for slot, _ in done}  # its latency, from add()
        self.live = [s for s in seqs if s.slot not in finished]
        return done


def generate_batch(target: Model, drafter, prompts: Sequence, *, gamma=DEFAULT_GAMMA,
                   max_new_tokens: int, temperature: float, top_k: int = 0,
                   top_p: float = 1.0, eos_token_id=None, seed: int | None = None,
                   verify=minispec_verify, costs: BatchCosts | None = None
                   ) -> list[GenerationResult]:
    """Decode every prompt of `prompts` together -> one GenerationResult per prompt, in order.

    drafter: as speculative_generate's (a draft Model or a Drafter made for target), or None for
    plain decoding. gamma: an integer (0 = plain autoregressive decoding of the batch), "auto"
    or "load-aware" (see BatchDecoder; costs: LoadAwareGamma's measurements, its rounds timed
    by `time_rounds` for batches of 1..len(prompts) when not given). Sequence i draws its
    random numbers from default_rng([seed, i]) (fresh randomness for seed None); see the module
    docstring for what that guarantees. The other arguments are speculative_generate's. A sequence's
    stats.total_seconds is its latency, its rounds' timings those of the batch's rounds.
    """
    sampling = Sampling(temperature, top_k, top_p)
    request = Request(max_new_tokens, eos_token_id, seed)
    if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Sequence) or not prompts:
        raise MinispecError("prompts: expected a non-empty list of prompts (token id lists)")
    decoder = BatchDecoder(target, drafter, sampling, gamma=gamma, verify=verify, costs=costs,
                           max_batch=len(prompts))  # the batch only shrinks
    for i, prompt in enumerate(prompts):
        rng = np.random.default_rng() if seed is None else np.random.default_rng([seed, i])
        decoder.add(prompt, request, rng)
    results: dict[int, GenerationResult] = {}
    while decoder.live:
        results.update(decoder.step())
    return [results[i] for i in range(len(prompts))]
