"""Speculative decoding: the round and the loop (Leviathan et al. 2023, Algorithm 1; Chen et al.
2023, Algorithm 2).

A cheap drafter guesses gamma tokens; the target scores all of them in one call; `verify` keeps
the longest prefix the target agrees with, in a way that leaves the output distributed exactly as
if the target had sampled every token itself. `speculative_round` is one such round, written in
the paper's order; `generate` repeats it until EOS or the token budget. Autoregressive decoding
is the same loop with a drafter that never drafts (`NoDrafter`): one target call per token.

    result = generate(target, drafter, prompt_ids, Sampling(temperature=0), Request(64))

`speculative_generate` and `autoregressive_generate` are the same loop behind keyword arguments.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from numbers import Integral

import numpy as np

from ..errors import MinispecError
from .checks import (
    as_drafter,
    check_alpha_gamma,
    check_draft,
    check_emitted,
    check_prompt,
    eos_ids,
)
from .drafter import Draft, Drafter, NoDrafter, sampled_vocab_size
from .model import Model
from .sampling import Sampling
from .verify import verify

__all__ = [
    "AutoGamma", "FixedGamma", "GenerationResult", "Request", "Round", "Stats",
    "autoregressive_generate", "expected_tokens_per_call", "generate", "next_gamma",
    "sampled_vocab_size", "speculative_generate", "speculative_round", "verify",
]

# verify's signature: (p [g+1, V], q [g, V], draft_tokens [g], rng) -> emitted tokens [1..g+1]
VerifyFn = Callable[[np.ndarray, np.ndarray, np.ndarray, np.random.Generator], np.ndarray]


# ---- the request --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Request:
    """What to generate, besides how to sample it: at most max_new_tokens new tokens (fewer if
    the context runs out), stopping after any of eos_token_ids (kept in the output); seed fixes
    every random draw (None: fresh randomness). Checked when made."""

    max_new_tokens: int
    eos_token_ids: tuple[int, ...] = ()
    seed: int | None = None

    def __post_init__(self) -> None:
        n, seed = self.max_new_tokens, self.seed
        if isinstance(n, bool) or not isinstance(n, Integral) or n < 1:
            raise MinispecError(f"max_new_tokens: expected an integer >= 1, got {n!r}")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, Integral)
                                 or seed < 0):
            raise MinispecError(f"seed: expected None or an integer >= 0, got {seed!r}")
        object.__setattr__(self, "max_new_tokens", int(n))
        object.__setattr__(self, "eos_token_ids", eos_ids(self.eos_token_ids))
        object.__setattr__(self, "seed", None if seed is None else int(seed))


# ---- gamma: how many drafts a round asks for ----------------------------------------------------

DEFAULT_GAMMA = 4  # drafts per round unless told otherwise (the API, the command line, benchmarks)


class FixedGamma:
    """The same gamma every round."""

    def __init__(self, gamma: int) -> None:
        self.gamma = gamma

    def update(self, depth: int, accepted: int) -> None:
        """A fixed gamma learns nothing from a round."""


AUTO_GAMMA_START = 5  # Hugging Face's num_assistant_tokens default for its "heuristic" schedule
AUTO_GAMMA_MAX = 16  # our cap (HF has none): a long run of full acceptances stops here


def next_gamma(gamma: int, depth: int, accepted: int) -> int:
    """gamma="auto": the next round's gamma after a round that drafted `depth` positions (a
    chain's length, a tree's depth) and kept `accepted` of them.

    Hugging Face's "heuristic" schedule for num_assistant_tokens: start at AUTO_GAMMA_START; +2
    after a round whose drafts were all accepted, -1 after a rejection; here also kept within
    1..AUTO_GAMMA_MAX, and a round with no drafts (nothing to learn from) changes nothing.
    """
    if depth == 0:
        return gamma
    return min(gamma + 2, AUTO_GAMMA_MAX) if accepted == depth else max(gamma - 1, 1)


def expected_tokens_per_call(alpha: float, gamma: int) -> float:
    """Expected tokens one round emits: (1 - alpha^(gamma+1)) / (1 - alpha) (Equation 1).

    alpha: expected acceptance rate of a draft token; gamma: drafts per round. alpha = 1 gives
    the limit gamma + 1 (every draft accepted, plus the bonus token).
    """
    check_alpha_gamma(alpha, gamma)
    if alpha >= 1.0:
        return float(gamma + 1)
    return (1.0 - alpha ** (gamma + 1)) / (1.0 - alpha)


class AutoGamma:
    """gamma="auto": `next_gamma` after every round, from AUTO_GAMMA_START. gamma depends only on
    rounds already verified, so the output stays exact: every round's tokens are distributed as
    the target's for any gamma."""

    def __init__(self) -> None:
        self.gamma = AUTO_GAMMA_START

    def update(self, depth: int, accepted: int) -> None:
        self.gamma = next_gamma(self.gamma, depth, accepted)


def gamma_policy(gamma, *, least: int = 1):
    """gamma as the loop uses it: an integer >= least -> FixedGamma, "auto" -> AutoGamma, or
    any object with .gamma and .update(depth, accepted) (a policy of your own): after each
    round, the positions it drafted (Round.depth) and kept (Round.accepted)."""
    if isinstance(gamma, str) and gamma == "auto":
        return AutoGamma()
    if hasattr(gamma, "gamma") and hasattr(gamma, "update"):
        return gamma
    if isinstance(gamma, bool) or not isinstance(gamma, Integral) or gamma < least:
        raise MinispecError(f"gamma: expected an integer >= {least} or 'auto', got {gamma!r:.100}")
    return FixedGamma(int(gamma))


# ---- results ------------------------------------------------------------------------------------


@dataclass
class Round:
    """One target call, for traces: what was drafted, what the target kept and added."""

    drafted: list[int]  # the draft tokens proposed this round (empty for autoregressive decoding)
    accepted: int  # the positions kept: the accepted prefix of a chain, the accepted path of a tree
    token: int  # the target's own token: the correction, or the bonus if all were accepted
    kind: str  # "correction" | "bonus" ("bonus" too when nothing was drafted)
    emitted: list[int]  # added to the output: drafted[:accepted] + [token], cut after an EOS
    gamma: int = 0  # the depth asked for this round (the drafter may propose less)
    depth: int = 0  # the positions drafted: len(drafted) for a chain, a tree's deepest path
    hit_eos: bool = False  # an EOS was emitted
    # timings, left out of comparisons: two runs with one seed have equal rounds
    draft_seconds: float = field(default=0.0, compare=False)  # in drafter.propose
    verify_seconds: float = field(default=0.0, compare=False)  # target call, verify, accept


@dataclass
class Stats:
    """Counters and timings of one generation (speculative or autoregressive)."""

    drafter: str  # the drafter's name ("model", ...), "none" for autoregressive decoding
    gamma: int | str  # the requested drafts per round, "auto", or 0 for autoregressive decoding
    new_tokens: int = 0
    drafted: int = 0  # draft tokens proposed (every node of a tree)
    positions: int = 0  # positions drafted: the rounds' depths (= drafted when drafts are chains)
    accepted: int = 0  # positions kept by verification (before any cut at EOS)
    target_calls: int = 0  # target forward calls = rounds (the first one also reads the prompt)
    draft_calls: int = 0  # drafter forward calls (0 for a drafter without a model)
    draft_seconds: float = 0.0  # in drafter.propose
    verify_seconds: float = 0.0  # the rounds' target call, verify and accept (Round's)
    total_seconds: float = 0.0  # the whole generation
    rounds: list[Round] = field(default_factory=list)

    def add(self, r: Round) -> None:
        self.rounds.append(r)
        self.new_tokens += len(r.emitted)
        self.drafted += len(r.drafted)
        self.positions += r.depth
        self.accepted += r.accepted
        self.target_calls += 1
        self.draft_seconds += r.draft_seconds
        self.verify_seconds += r.verify_seconds

    @property
    def acceptance_rate(self) -> float:
        """accepted / positions: the share of drafted positions the target kept, for chains and
        trees alike (0.0 when nothing was drafted)."""
        return self.accepted / self.positions if self.positions else 0.0

    @property
    def tokens_per_target_call(self) -> float:
        """New tokens per target forward call: 1.0 for autoregressive, up to gamma + 1."""
        return self.new_tokens / self.target_calls if self.target_calls else 0.0

    @property
    def tokens_per_second(self) -> float:
        """New tokens per second of total_seconds."""
        return self.new_tokens / self.total_seconds if self.total_seconds > 0 else 0.0

    def as_dict(self, rounds: bool = False) -> dict:
        """The counters, timings and derived rates as a plain dict (JSON-ready); rounds optional."""
        d = {k: v for k, v in self.__dict__.items() if k != "rounds"}
        d.update(acceptance_rate=self.acceptance_rate,
                 tokens_per_target_call=self.tokens_per_target_call,
                 tokens_per_second=self.tokens_per_second)
        if rounds:
            d["rounds"] = [r.__dict__.copy() for r in self.rounds]
        return d


@dataclass
class GenerationResult:
    """What a generate function returns: the new tokens, why it stopped, and its stats."""

    tokens: list[int]  # new token ids only (the prompt is not repeated); ends with EOS if "eos"
    stop_reason: str  # "eos" | "length"
    stats: Stats


# ---- one round ----------------------------------------------------------------------------------


def speculative_round(drafter: Drafter, context: list[int], cache, gamma: int, warp,
                      verify: VerifyFn, rng: np.random.Generator, eos: tuple[int, ...]) -> Round:
    """One round of Algorithm 1 (Leviathan et al. 2023): draft, one target call, verify.

    context: the tokens so far (prompt + output), extended in place by the emitted tokens.
    cache: the target's KV cache, holding every context token but the last (none before round
    1: the round then feeds the whole prompt). warp: logits ->
    the probabilities generation samples from (the same for the target's p and the drafter's q).
    verify: the speculative step (minispec.verify, or any function with its signature).
    """
    t0 = time.perf_counter()
    # 1. the drafter proposes g <= gamma tokens and q, the distributions it drew them from
    draft = check_draft(drafter.propose(context, gamma, warp, rng), gamma, drafter)
    t1 = time.perf_counter()

    # 2. one target call over the context tokens the cache lacks (the last one; the whole prompt
    #    in round 1) and the g drafts: its last g + 1 rows give p_0..p_g, the target's
    #    distributions after each draft prefix
    hidden = drafter.target_forward(context[cache.length:], draft, cache)  # [m + g, D]
    p = warp(drafter.target.lm_head(hidden[-len(draft.tokens) - 1:]))  # [g+1, V]

    # 3. keep a prefix of the drafts, then the target's correction or bonus token
    accepted, token = settle(verify, p, draft, rng)

    # 4-6. keep what was accepted, stop at an EOS, let the drafter catch up
    r = finish_round(drafter, context, cache, draft, accepted, token, hidden, eos)
    r.gamma, r.draft_seconds, r.verify_seconds = gamma, t1 - t0, time.perf_counter() - t1
    return r


def settle(verify: VerifyFn, p, draft: Draft, rng) -> tuple[int, int]:
    """Step 3 of a round -> (accepted: how many drafts were kept, token: the target's correction
    or bonus), from `verify` (its output checked)."""
    drafts = draft.tokens.tolist()
    emitted = check_emitted(verify(p, draft.q, draft.tokens, rng), drafts, p.shape[1], verify)
    return len(emitted) - 1, emitted[-1]


def finish_round(drafter: Drafter, context: list[int], cache, draft: Draft, accepted: int,
                 token: int, hidden, eos: tuple[int, ...]) -> Round:
    """Steps 4-6 of a round: the target's cache keeps the accepted drafts, the emitted tokens
    are cut after an EOS and added to `context`, the drafter reads what the target computed.
    -> the Round (without timings)."""
    g = len(draft.tokens)
    m = hidden.shape[0] - g  # the context tokens the call fed before the drafts
    # 4. the target's cache keeps the accepted drafts: setting one integer. target_forward left
    #    cache.length at the context, the drafts' keys and values in the positions after it;
    #    the last emitted token has no keys or values yet: the next round feeds it
    cache.length += accepted
    emitted = draft.tokens[:accepted].tolist() + [int(token)]
    return end_round(drafter, context, draft.tokens.tolist(), emitted, hidden[:m + accepted],
                     eos, depth=g, bonus=accepted == g)


def end_round(drafter: Drafter, context: list[int], drafted: list[int], emitted: list[int],
              kept_hidden, eos: tuple[int, ...], depth: int, bonus: bool) -> Round:
    """Steps 5-6, for chains and trees (minispec/tree.py) alike: an EOS ends the generation (it
    is kept, anything after it dropped); otherwise the drafter reads the hidden states of what
    was kept. -> the Round (without timings)."""
    stop = next((i for i, t in enumerate(emitted) if t in eos), None)
    out = emitted if stop is None else emitted[: stop + 1]
    context += out
    if stop is None:
        drafter.accept(context, kept_hidden)
    return Round(drafted=drafted, accepted=len(emitted) - 1, token=emitted[-1],
                 kind="bonus" if bonus else "correction", emitted=out, depth=depth,
                 hit_eos=stop is not None)


# ---- the loop -----------------------------------------------------------------------------------


def generate(target: Model, drafter, prompt_ids, sampling: Sampling, request: Request, *,
             gamma=DEFAULT_GAMMA, verify: VerifyFn = verify,
             on_round: Callable[[Round], None] | None = None) -> GenerationResult:
    """Decode `request.max_new_tokens` tokens after `prompt_ids` from `target`, in rounds.

    drafter: a Drafter made for `target` (a Model is wrapped in a ModelDrafter); NoDrafter(target)
    decodes autoregressively. gamma: drafts per round, or the depth of a drafter's trees (an
    integer >= 0, "auto", or a policy object with .gamma and .update(depth, accepted)).
    verify: the speculative step for chains. on_round: called with each Round as it is done
    (to show tokens as they come).
    """
    drafter = as_drafter(target, drafter)
    policy = gamma_policy(gamma, least=0)
    prompt, max_new = check_prompt(target, prompt_ids, request)
    start = time.perf_counter()
    rng = np.random.default_rng(request.seed)
    warp = make_warp(sampling, drafter.vocab_size)
    context = list(prompt)
    cache = new_target_cache(target, len(prompt), max_new)
    drafter.start(list(prompt), cache)
    stats = Stats(drafter=drafter.name, gamma=gamma_label(gamma, policy))
    play = drafter.round or speculative_round  # a TreeDrafter plays minispec/tree.py's round
    while len(context) - len(prompt) < max_new:
        left = max_new - (len(context) - len(prompt))
        g = min(policy.gamma, left - 1)  # a round emits up to g + 1 tokens: stay in the budget
        r = play(drafter, context, cache, g, warp, verify, rng, request.eos_token_ids)
        stats.add(r)
        policy.update(r.depth, r.accepted)  # positions, not nodes: a tree's depth is its gamma
        if on_round is not None:
            on_round(r)
        if r.hit_eos:
            break
    return generation_result(context, prompt, stats, drafter.calls, start)


# ---- what the loop and the batch loop (minispec/batch.py) share ------------------------------

TREE_ROOM = 64  # cache slots past the budget for a tree's nodes (trees larger are pruned)


def make_warp(sampling: Sampling, V: int):
    """One warp for p and q: logits [..., V'] -> probabilities [..., V] over the V ids
    generation samples from."""

    def warp(logits):
        probs = sampling.warp(logits[..., :V])  # [..., V'] -> [..., min(V', V)]
        if probs.shape[-1] < V:  # a draft vocabulary without the target's padded ids: q = 0
            probs = np.pad(probs, [(0, 0)] * (probs.ndim - 1) + [(0, V - probs.shape[-1])])
        return probs  # [..., V]

    warp.sampling = sampling  # the settings, for a drafter that drafts greedily its own way
    return warp


def new_target_cache(target: Model, prompt_len: int, max_new: int):
    """The target's cache for one generation: every position it can use, and room after them
    for the nodes of a tree of drafts."""
    return target.new_cache(min(prompt_len + max_new + TREE_ROOM,
                                target.config.max_position_embeddings))


def gamma_label(gamma, policy) -> int | str:
    """gamma as Stats shows it: the number, "auto", or the name of a policy of one's own."""
    return gamma if isinstance(gamma, (int, str)) else type(policy).__name__


def generation_result(context: list[int], prompt: list[int], stats: Stats, draft_calls: int,
                      start: float) -> GenerationResult:
    """The finished generation: its new tokens, why it stopped, its stats with the totals."""
    stats.draft_calls = draft_calls
    stats.total_seconds = time.perf_counter() - start
    stopped = bool(stats.rounds) and stats.rounds[-1].hit_eos
    return GenerationResult(tokens=context[len(prompt):],
                            stop_reason="eos" if stopped else "length", stats=stats)


# ---- the two functions users call ---------------------------------------------------------------


def speculative_generate(target, drafter, prompt_ids, *, gamma: int | str = DEFAULT_GAMMA,
                         max_new_tokens: int, temperature: float, top_k: int = 0,
                         top_p: float = 1.0, eos_token_id: int | Sequence[int] | None = None,
                         seed: int | None = None, verify: VerifyFn = verify) -> GenerationResult:
    """Speculative decoding: the same output distribution as autoregressive decoding of `target`
    (token for token when temperature is 0), with fewer target calls.

    drafter: a Model sharing the target's tokenizer (wrapped in a ModelDrafter) or any Drafter
    made for `target` (minispec.drafters.make_drafter). gamma: draft tokens per round (>= 1), or
    "auto" to adapt it as it goes (`next_gamma`). verify: the speculative step; any function with
    `minispec.verify`'s signature fn(p, q, draft_tokens, rng) runs inside the real loop. The
    other arguments are autoregressive_generate's.
    """
    gamma_policy(gamma)  # gamma >= 1 here: 0 drafts is autoregressive_generate
    return generate(target, drafter, prompt_ids, Sampling(temperature, top_k, top_p),
                    Request(max_new_tokens, eos_token_id, seed), gamma=gamma, verify=verify)


def autoregressive_generate(model, prompt_ids, *, max_new_tokens: int, temperature: float,
                            top_k: int = 0, top_p: float = 1.0,
                            eos_token_id: int | Sequence[int] | None = None,
                            seed: int | None = None) -> GenerationResult:
    """The baseline: sample max_new_tokens tokens from `model`, one forward call per token.

    prompt_ids: the context (token ids). temperature 0 is greedy; top_k 0 and top_p 1.0 are off.
    Stops after eos_token_id (an id or several; kept in the output) or max_new_tokens new tokens
    (fewer if the context length runs out). One seeded Generator draws every random number.
    """
    sampling, request = Sampling(temperature, top_k, top_p), Request(max_new_tokens,
                                                                     eos_token_id, seed)
    if not isinstance(model, Model):
        raise MinispecError(f"model: expected a minispec Model (minispec.load), got "
                            f"{type(model).__name__}")
    return generate(model, NoDrafter(model), prompt_ids, sampling, request, gamma=0)
