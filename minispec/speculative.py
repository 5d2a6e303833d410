"""Speculative decoding (Leviathan et al. 2023, Algorithm 1; Chen et al. 2023, Algorithm 2).

A cheap drafter guesses gamma tokens; the target scores all of them in one call; `verify` keeps
the longest prefix the target agrees with, in a way that leaves the output distributed exactly as
if the target had sampled every token itself. Autoregressive decoding lives here too, as the same
loop with no drafter: one target call per token. Both share the argument checks, the warping, the
KV-cache handling and the stopping rules, written once in `_generate`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from numbers import Integral

import numpy as np

from .drafters import ModelDrafter, check_vocabularies, is_model
from .errors import MinispecError
from .sampling import check_sampling_params, sample, warp


def verify(p, q, draft_tokens, rng: np.random.Generator) -> np.ndarray:
    """The speculative step: which draft tokens to keep, and the one token the target adds.

    p [g+1, V] float64: the target's (warped) distributions at each draft position and one past;
    q [g, V] float64: the distributions the draft tokens were drawn from; draft_tokens [g] int64;
    rng: the Generator that supplies every random number. g may be 0.
    Returns the emitted tokens, int64 [1..g+1]: the accepted prefix of the drafts, then either a
    correction (sampled after the first rejection) or, if all g were accepted, a bonus token.

    Leviathan et al. 2023, Algorithm 1 and section 2.3; Chen et al. 2023, Algorithm 2. For each
    draft x_i ~ q_i: draw r ~ U(0, 1), accept x_i if r < min(1, p_i(x) / q_i(x)). At the first
    rejection, sample from norm(max(0, p_i - q_i)) instead and stop; if nothing was rejected,
    sample one more token from p_g. Why this is lossless: P(emit x) = min(p(x), q(x)) (accepted)
    + (1 - sum_y min(p(y), q(y))) * norm(max(0, p - q))(x) (rejected, resampled) = p(x), for any
    q (Leviathan et al., Appendix A.1; Chen et al., Theorem 1). With greedy (one-hot) p and q a
    draft is accepted iff it is the target's argmax, and the correction is that argmax.
    """
    g = len(draft_tokens)
    if p.ndim != 2 or p.shape[0] != g + 1 or q.shape != (g, p.shape[1]):
        raise MinispecError(
            f"verify: expected p [g+1, V], q [g, V] for g = {g} draft tokens, "
            f"got p {p.shape} and q {q.shape}"
        )
    emitted = []
    for i in range(g):
        x = int(draft_tokens[i])
        r = rng.random()  # U[0, 1)
        # Accept with probability min(1, p(x)/q(x)), written r*q(x) < p(x) so that nothing is
        # divided by zero: p(x) = 0 never accepts (strict <), and a draft the drafter claimed
        # impossible, q(x) = 0, is accepted whenever the target allows it (the limit p/q -> inf).
        if r * q[i, x] < p[i, x]:
            emitted.append(x)
            continue
        residual = np.maximum(p[i] - q[i], 0.0)  # where the target wants more than was drafted
        mass = residual.sum()
        # mass 0 means p == q (numerically), where a rejection can only come from q(x) = 0 = p(x):
        # the residual is then p itself.
        emitted.append(sample(residual / mass if mass > 0 else p[i], rng))
        return np.array(emitted, dtype=np.int64)
    emitted.append(sample(p[g], rng))  # all accepted: the bonus token, from the target for free
    return np.array(emitted, dtype=np.int64)


# ---- results --------------------------------------------------------------------------------


@dataclass
class Round:
    """One target call, for traces: what was drafted, what the target kept and added."""

    drafted: list[int]  # the draft tokens proposed this round (empty for autoregressive decoding)
    accepted: int  # how many of them verify() accepted (a prefix)
    token: int  # the target's own token: the correction, or the bonus if all were accepted
    kind: str  # "correction" | "bonus" ("bonus" too when nothing was drafted)
    emitted: list[int]  # added to the output: drafted[:accepted] + [token], cut after an EOS
    gamma: int = 0  # the drafts asked for this round (the drafter may propose fewer)


@dataclass
class Stats:
    """Counters and timings of one generation (speculative or autoregressive)."""

    drafter: str  # the drafter's name ("model", ...), "none" for autoregressive decoding
    gamma: int | str  # the requested drafts per round, "auto", or 0 for autoregressive decoding
    new_tokens: int = 0
    drafted: int = 0  # draft tokens proposed
    accepted: int = 0  # draft tokens accepted by verify() (before any cut at EOS)
    target_calls: int = 0  # target forward calls = rounds (the first one also reads the prompt)
    draft_calls: int = 0  # drafter forward calls (0 for a drafter without a model)
    draft_seconds: float = 0.0  # in drafter.propose
    verify_seconds: float = 0.0  # in the target call, warping p and verify()
    total_seconds: float = 0.0  # the whole generation
    rounds: list[Round] = field(default_factory=list)

    @property
    def acceptance_rate(self) -> float:
        """accepted / drafted (0.0 when nothing was drafted)."""
        return self.accepted / self.drafted if self.drafted else 0.0

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
        d.update(
            acceptance_rate=self.acceptance_rate,
            tokens_per_target_call=self.tokens_per_target_call,
            tokens_per_second=self.tokens_per_second,
        )
        if rounds:
            d["rounds"] = [r.__dict__.copy() for r in self.rounds]
        return d


@dataclass
class GenerationResult:
    """What a generate function returns: the new tokens, why it stopped, and its stats."""

    tokens: list[int]  # new token ids only (the prompt is not repeated); ends with EOS if "eos"
    stop_reason: str  # "eos" | "length"
    stats: Stats


# ---- the loop -------------------------------------------------------------------------------


def autoregressive_generate(
    model,
    prompt_ids,
    *,
    max_new_tokens: int,
    temperature: float,
    top_k: int = 0,
    top_p: float = 1.0,
    eos_token_id: int | Sequence[int] | None = None,
    seed: int | None = None,
) -> GenerationResult:
    """The baseline: sample max_new_tokens tokens from `model`, one forward call per token.

    prompt_ids: the context (token ids). temperature 0 is greedy; top_k 0 and top_p 1.0 are off.
    Stops after eos_token_id (an id or several; kept in the output) or max_new_tokens new tokens
    (fewer if the context length runs out). One seeded Generator draws every random number.
    """
    prompt, max_new, eos = _check_request(
        model, None, prompt_ids, max_new_tokens, temperature, top_k, top_p, eos_token_id, seed
    )
    return _generate(model, None, 0, prompt, max_new, temperature, top_k, top_p, eos, seed)


def speculative_generate(
    target,
    drafter,
    prompt_ids,
    *,
    gamma: int | str = 4,
    max_new_tokens: int,
    temperature: float,
    top_k: int = 0,
    top_p: float = 1.0,
    eos_token_id: int | Sequence[int] | None = None,
    seed: int | None = None,
) -> GenerationResult:
    """Speculative decoding: the same output distribution as autoregressive decoding of `target`
    (token for token when temperature is 0), with fewer target calls.

    drafter: a Model sharing the target's tokenizer (wrapped in a ModelDrafter) or any Drafter.
    gamma: draft tokens per round (>= 1), or "auto" to adapt it as it goes (`next_gamma`).
    The other arguments are autoregressive_generate's.
    """
    if is_model(drafter):
        drafter = ModelDrafter(drafter)
    if isinstance(drafter, ModelDrafter):
        check_vocabularies(target, drafter.model)
    elif not all(hasattr(drafter, a) for a in ("start", "propose", "accept")):
        raise MinispecError(
            f"drafter: expected a Model or a Drafter (start/propose/accept), "
            f"got {type(drafter).__name__}"
        )
    if gamma != "auto" and (
        isinstance(gamma, bool) or not isinstance(gamma, Integral) or gamma < 1
    ):
        raise MinispecError(f"gamma: expected an integer >= 1 or 'auto', got {gamma!r}")
    prompt, max_new, eos = _check_request(
        target, drafter, prompt_ids, max_new_tokens, temperature, top_k, top_p, eos_token_id, seed
    )
    return _generate(target, drafter, gamma, prompt, max_new, temperature, top_k, top_p, eos, seed)


def _round_gamma(gamma: int, remaining: int) -> int:
    """Drafts to ask for this round: gamma, shrunk near the end so that the round's up to
    gamma + 1 new tokens fit in the `remaining` budget (remaining 1: no drafts, one target step).
    """
    return min(gamma, remaining - 1)


AUTO_GAMMA_START = 5  # Hugging Face's num_assistant_tokens default for its "heuristic" schedule
AUTO_GAMMA_MAX = 16  # our cap (HF has none): a long run of full acceptances stops here


def next_gamma(gamma: int, drafted: int, accepted: int) -> int:
    """gamma="auto": the next round's gamma after a round that drafted and accepted so many.

    Hugging Face's "heuristic" schedule for num_assistant_tokens: start at AUTO_GAMMA_START; +2
    after a round whose drafts were all accepted, -1 after a rejection; here also kept within
    1..AUTO_GAMMA_MAX, and a round with no drafts (nothing to learn from) changes nothing.
    gamma depends only on rounds already verified, so the output stays exact: every round's
    tokens are distributed as the target's for any gamma.
    """
    if drafted == 0:
        return gamma
    return min(gamma + 2, AUTO_GAMMA_MAX) if accepted == drafted else max(gamma - 1, 1)


def _generate(target, drafter, gamma, prompt, max_new, temperature, top_k, top_p, eos, seed):
    """The loop both generate functions share; drafter None is autoregressive decoding."""
    start = time.perf_counter()
    rng = np.random.default_rng(seed)
    V = sampled_vocab_size(target)

    def warp_fn(logits):  # the same warp for p and q, over the same V token ids
        return warp(logits[..., :V], temperature, top_k, top_p)

    stats = Stats(drafter="none" if drafter is None else drafter.name, gamma=gamma)
    gamma = AUTO_GAMMA_START if gamma == "auto" else gamma  # "auto": next_gamma adapts it
    context = list(prompt)
    tokens: list[int] = []
    stop_reason = "length"
    # The target's cache holds every context token but the last, which each round feeds again in
    # front of the drafts: their logits are p_0..p_g.
    cache = target.new_cache(len(prompt) + max_new)
    forward = target.forward  # the verify call
    if drafter is not None:
        drafter.start(list(prompt))
        if hasattr(drafter, "share_cache"):  # made of the target's layers: drafts in its cache
            forward = drafter.share_cache(target, cache)  # verifies without redoing that work
    no_drafts, no_q = np.empty(0, dtype=np.int64), np.empty((0, V))
    while len(tokens) < max_new:
        asked = g = _round_gamma(gamma, max_new - len(tokens)) if drafter is not None else 0
        t0 = time.perf_counter()
        drafts, q = drafter.propose(context, g, warp_fn, rng) if g > 0 else (no_drafts, no_q)
        drafts, q = np.asarray(drafts, dtype=np.int64), np.asarray(q, dtype=np.float64)
        if len(drafts) > g:
            raise MinispecError(f"drafter {stats.drafter!r} proposed {len(drafts)} > {g} tokens")
        if q.shape[1] < V:  # a draft vocabulary without the target's padding: q = 0 there
            q = np.pad(q, ((0, 0), (0, V - q.shape[1])))
        t1 = time.perf_counter()
        g = len(drafts)
        logits = forward(context[cache.length :] + drafts.tolist(), cache)  # [T, V_target]
        p = warp_fn(logits[-(g + 1) :])  # [g+1, V]: only the rows verify() reads
        emitted = verify(p, q, drafts, rng).tolist()
        cache.rollback(len(context) + len(emitted) - 1)  # keep last + the accepted drafts
        t2 = time.perf_counter()

        accepted = len(emitted) - 1
        round_ = Round(
            drafted=drafts.tolist(),
            accepted=accepted,
            token=emitted[-1],
            kind="bonus" if accepted == g else "correction",
            emitted=emitted,
            gamma=asked,
        )
        for i, t in enumerate(emitted):
            if t in eos:  # tokens after EOS are dropped, EOS itself is kept
                round_.emitted = emitted = emitted[: i + 1]
                stop_reason = "eos"
                break
        tokens += emitted
        context += emitted
        stats.rounds.append(round_)
        stats.drafted += g
        stats.accepted += accepted
        stats.target_calls += 1
        stats.draft_seconds += t1 - t0
        stats.verify_seconds += t2 - t1
        if stats.gamma == "auto":
            gamma = next_gamma(gamma, g, accepted)
        if stop_reason == "eos":
            break
        if drafter is not None:
            drafter.accept(context)
    stats.new_tokens = len(tokens)
    stats.draft_calls = getattr(drafter, "calls", 0)
    stats.total_seconds = time.perf_counter() - start
    return GenerationResult(tokens=tokens, stop_reason=stop_reason, stats=stats)


def sampled_vocab_size(target) -> int:
    """The token ids generation samples from: the target's vocabulary, without the embedding
    rows padded past its tokenizer (they are no token: nothing decodes them, no drafter has them).
    """
    tokenizer = getattr(target, "tokenizer", None)
    if tokenizer is None:
        return target.vocab_size
    return min(target.vocab_size, tokenizer.vocab_size)


def _check_request(
    model, drafter, prompt_ids, max_new_tokens, temperature, top_k, top_p, eos, seed
):
    """Check the arguments both generate functions share; MinispecError names the bad one.

    Returns (prompt ids as a list, max new tokens that fit the context, set of EOS ids).
    """
    check_sampling_params(temperature, top_k, top_p)
    if (
        isinstance(max_new_tokens, bool)
        or not isinstance(max_new_tokens, Integral)
        or (max_new_tokens < 1)
    ):
        raise MinispecError(f"max_new_tokens: expected an integer >= 1, got {max_new_tokens!r}")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, Integral) or seed < 0):
        raise MinispecError(f"seed: expected None or an integer >= 0, got {seed!r}")
    ids = np.asarray(prompt_ids)
    if ids.ndim != 1 or ids.size == 0 or not np.issubdtype(ids.dtype, np.integer):
        raise MinispecError(
            f"prompt_ids: expected a non-empty 1-D sequence of integer token ids, "
            f"got shape {ids.shape} dtype {ids.dtype}"
        )
    V = model.vocab_size
    draft_model = getattr(drafter, "model", None)
    if draft_model is not None:
        V = min(V, draft_model.vocab_size)  # the draft model must be able to read the prompt
    if ids.min() < 0 or ids.max() >= V:
        bad = int(ids.min() if ids.min() < 0 else ids.max())
        raise MinispecError(f"prompt_ids: token id {bad} is outside the vocabulary 0..{V - 1}")
    eos_ids = [] if eos is None else [eos] if isinstance(eos, Integral) else eos
    if isinstance(eos_ids, (str, bytes)) or not hasattr(eos_ids, "__iter__"):
        eos_ids = [eos]  # not a token id: reported just below
    for t in eos_ids:
        if isinstance(t, bool) or not isinstance(t, Integral) or not 0 <= t < model.vocab_size:
            raise MinispecError(
                f"eos_token_id: expected None or token ids in 0..{model.vocab_size - 1}, "
                f"got {eos!r}"
            )
    context_length = model.config.max_position_embeddings
    room = context_length - ids.size
    if room < 1:
        raise MinispecError(
            f"prompt_ids: {ids.size} tokens leave no room for new tokens in the context of "
            f"{context_length} positions (max_position_embeddings of {model.name!r})"
        )
    return ids.tolist(), min(int(max_new_tokens), room), {int(t) for t in eos_ids}
