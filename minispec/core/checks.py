"""Every argument and every drafter's output, checked: MinispecError naming the culprit.

The lesson's files (verify.py, speculative.py) call these so that a bad input is one clear error,
never another exception, a crash or a hang; they read as well without them.
"""

from __future__ import annotations

from collections.abc import Sequence
from numbers import Integral

import numpy as np

from ..errors import MinispecError
from .drafter import Draft, Drafter, ModelDrafter
from .model import Model

ROW_SUM_TOLERANCE = 1e-6  # a probability row may miss 1 by float64 round-off, not by more


def check_verify_args(p, q, draft_tokens, rng):
    """verify's arguments as float64/int64 arrays, or MinispecError naming the one that is wrong:
    shapes [g+1, V], [g, V], [g]; finite rows of probabilities that sum to 1; token ids in
    0..V-1; a numpy Generator."""
    if not isinstance(rng, np.random.Generator):
        raise MinispecError(f"verify: rng must be a numpy.random.Generator, got "
                            f"{type(rng).__name__}")
    try:
        p = np.asarray(p, dtype=np.float64)
        q = np.asarray(q, dtype=np.float64)
        tokens = np.asarray(draft_tokens)
    except (TypeError, ValueError) as e:
        raise MinispecError(f"verify: p, q and draft_tokens must be arrays of numbers ({e})") \
            from None
    if tokens.ndim != 1 or (tokens.size and not np.issubdtype(tokens.dtype, np.integer)):
        raise MinispecError(f"verify: draft_tokens must be a 1-D array of integer ids, got shape "
                            f"{tokens.shape} dtype {tokens.dtype}")
    g = tokens.size
    if p.ndim != 2 or p.shape[0] != g + 1 or p.shape[1] < 1 or q.shape != (g, p.shape[1]):
        raise MinispecError(f"verify: expected p [g+1, V], q [g, V] for g = {g} draft tokens "
                            f"(V >= 1), got p {p.shape} and q {q.shape}")
    for name, rows in (("p", p), ("q", q)):
        if not rows.size:  # q of a round without drafts
            continue
        sums = rows.sum(axis=1)  # NaN or infinite where an entry is: one pass finds both
        if not (np.isfinite(sums).all() and rows.min() >= 0):
            raise MinispecError(f"verify: {name} must hold finite probabilities >= 0")
        if np.abs(sums - 1.0).max() > ROW_SUM_TOLERANCE:
            bad = int(np.argmax(np.abs(sums - 1.0)))
            raise MinispecError(f"verify: each row of {name} must sum to 1, row {bad} sums to "
                                f"{sums[bad]:.9g}")
    if g and (tokens.min() < 0 or tokens.max() >= p.shape[1]):
        bad = int(tokens.min() if tokens.min() < 0 else tokens.max())
        raise MinispecError(f"verify: draft token {bad} is outside the vocabulary "
                            f"0..{p.shape[1] - 1}")
    return p, q, tokens.astype(np.int64)


def eos_ids(eos) -> tuple[int, ...]:
    """An EOS argument (None, one id, or a sequence of ids) as a tuple of ids >= 0."""
    if eos is None:
        return ()
    if isinstance(eos, np.ndarray):
        eos = eos.tolist()
    ids = [eos] if isinstance(eos, Integral) else eos
    if isinstance(ids, (str, bytes, dict)) or not isinstance(ids, (Sequence, set, frozenset)):
        ids = [eos]  # not a token id, not a sequence of them: reported below
    for t in ids:
        if isinstance(t, bool) or not isinstance(t, Integral) or t < 0:
            raise MinispecError(f"eos_token_id: expected None, a token id or a list of token "
                                f"ids (integers >= 0), got {eos!r:.200}")
    return tuple(int(t) for t in ids)


def check_alpha_gamma(alpha: float, gamma: float) -> None:
    # gamma may be fractional: the mean drafts per round when gamma varies (gamma="auto")
    if not 0.0 <= alpha <= 1.0:
        raise MinispecError(f"alpha: expected an acceptance rate in [0, 1], got {alpha!r}")
    if isinstance(gamma, bool) or not isinstance(gamma, (int, float, np.number)) or not gamma >= 0:
        raise MinispecError(f"gamma: expected a number >= 0, got {gamma!r}")


def check_draft(draft, gamma: int, drafter) -> Draft:
    """The drafter's proposal, checked: a chain of at most gamma tokens with q [g, V].
    MinispecError names the drafter and what it returned."""
    who = f"drafter {drafter.name!r}"
    if not isinstance(draft, Draft):
        raise MinispecError(f"{who}: propose must return a Draft(tokens, q), got "
                            f"{type(draft).__name__}")
    if draft.parents is not None:
        raise MinispecError(f"{who}: proposed a tree; a drafter that proposes trees must "
                            "subclass minispec.tree.TreeDrafter, whose round verifies them")
    tokens, q, V = np.asarray(draft.tokens), np.asarray(draft.q), drafter.vocab_size
    if tokens.ndim != 1 or (tokens.size and not np.issubdtype(tokens.dtype, np.integer)):
        raise MinispecError(f"{who}: draft tokens must be a 1-D integer array [n], got shape "
                            f"{tokens.shape} dtype {tokens.dtype}")
    g = tokens.shape[0]
    if g > gamma:
        raise MinispecError(f"{who}: expected at most {gamma} draft tokens, got {g}")
    if q.shape != (g, V):
        raise MinispecError(f"{who}: q must be [g, V] = [{g}, {V}] (one row per draft over "
                            f"the sampled vocabulary), got shape {q.shape}")
    if g and (tokens.min() < 0 or tokens.max() >= V):
        raise MinispecError(f"{who}: draft token ids must be in 0..{V - 1}, got "
                            f"{tokens.tolist()!r:.200}")
    return Draft(tokens.astype(np.int64, copy=False), q)


def check_emitted(emitted, drafts: list[int], V: int, verify) -> list[int]:
    """verify's output as a list, or MinispecError if it is not a kept prefix of the drafts plus
    one token id in 0..V-1."""
    try:
        arr = np.asarray(emitted)
    except (TypeError, ValueError):  # ragged or otherwise not an array
        arr = np.empty((0, 0))
    out = arr.tolist() if arr.ndim == 1 else [arr.tolist()]  # a nested list is refused below
    g = len(drafts)
    if (not 1 <= len(out) <= g + 1 or out[:-1] != drafts[: len(out) - 1]
            or not all(isinstance(t, int) for t in out) or not 0 <= out[-1] < V):
        name = getattr(verify, "__name__", repr(verify))
        raise MinispecError(f"verify {name}: expected the accepted prefix of the drafts "
                            f"{drafts} plus one token, got {out!r:.200}")
    return out


def as_drafter(target, drafter) -> Drafter:
    """A Drafter for `target`: a drafter made for it, or a draft Model (wrapped in ModelDrafter)."""
    if not isinstance(target, Model):
        raise MinispecError(f"target: expected a minispec Model (minispec.load), got "
                            f"{type(target).__name__}")
    if isinstance(drafter, Model):
        return ModelDrafter(target, drafter)
    if not isinstance(drafter, Drafter):
        raise MinispecError(f"drafter: expected a Model or a minispec.drafters.Drafter, got "
                            f"{type(drafter).__name__}")
    if drafter.target is not target:
        raise MinispecError(f"drafter {drafter.name!r} was made for model "
                            f"{getattr(drafter.target, 'name', '?')!r}, not for the target "
                            f"{target.name!r}; make it with that target")
    return drafter


def check_prompt(target, prompt_ids, request) -> tuple[list[int], int]:
    """The prompt as a list of ids in the target's vocabulary, and the new tokens that fit the
    context; EOS ids checked against the vocabulary too. MinispecError names the bad one."""
    try:
        ids = np.asarray(prompt_ids)
    except (TypeError, ValueError):  # ragged nesting
        ids = np.empty((0, 0))
    if ids.ndim != 1 or ids.size == 0 or not np.issubdtype(ids.dtype, np.integer):
        raise MinispecError(f"prompt_ids: expected a non-empty 1-D sequence of integer token "
                            f"ids, got shape {ids.shape} dtype {ids.dtype}")
    V = target.vocab_size
    if ids.min() < 0 or ids.max() >= V:
        bad = int(ids.min() if ids.min() < 0 else ids.max())
        raise MinispecError(f"prompt_ids: token id {bad} is outside the vocabulary 0..{V - 1}")
    bad_eos = [t for t in request.eos_token_ids if t >= V]
    if bad_eos:
        raise MinispecError(f"eos_token_id: {bad_eos[0]} is outside the vocabulary 0..{V - 1}")
    context_length = target.config.max_position_embeddings
    room = context_length - ids.size
    if room < 1:
        raise MinispecError(
            f"prompt_ids: {ids.size} tokens leave no room for new tokens in the context of "
            f"{context_length} positions (max_position_embeddings of {target.name!r})")
    return ids.tolist(), min(request.max_new_tokens, room)
