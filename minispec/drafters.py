"""Drafters: whatever proposes the gamma tokens the target then verifies.

Leviathan et al. 2023 draft with a smaller model M_q (section 2.3) and note that any cheaper
approximation works, down to trivial n-gram models; speculative sampling is lossless for every
drafter, provided it reports q, the exact distribution each draft token was drawn from. A
drafter that always proposes the same token given its context reports a one-hot q.

Three drafters, chosen by name with `make_drafter`:
    "model"       ModelDrafter: a second, smaller model (Leviathan et al.'s M_q)
    "ngram"       NgramDrafter: prompt lookup, copying what followed an earlier occurrence of
                  the context's last tokens (Saxena 2023, "Prompt Lookup Decoding")
    "early-exit"  EarlyExitDrafter: the target's own first k layers and its head, sharing the
                  target's KV cache (self-speculative decoding; Elhoushi et al. 2024, LayerSkip)

`speculative_generate` drives a drafter in rounds:
    start(prompt_ids)                                 once per generation
    share_cache(target, cache) -> forward             optional: once, after start (early exit)
    propose(context, gamma, warp_fn, rng) -> (draft tokens [g], q [g, V])
    accept(context)                                   context now ends with the emitted tokens
"""

from __future__ import annotations

from collections.abc import Callable
from numbers import Integral
from typing import Protocol

import numpy as np

from .errors import MinispecError
from .sampling import sample


class Drafter(Protocol):
    """The interface `speculative_generate` drives; see the module docstring for the call order.

    name: short label for stats and traces ("model" | "ngram" | "early-exit").
    calls: model forward calls made since `start` (0 for drafters with no model); read for stats.

    Optional, for a drafter built from the target's own layers (EarlyExitDrafter):
    `share_cache(target, cache) -> forward`, called once after `start` with the target and its KV
    cache (MinispecError if the drafter was built from another model). The
    drafter may then write that cache's positions from cache.length on while drafting, and the
    loop verifies with the returned forward(tokens, cache) -> logits in place of target.forward
    (same arguments, same logits up to rounding), which skips the work drafting already did.
    """

    name: str
    calls: int

    def start(self, prompt_ids: list[int]) -> None:
        """Forget the previous generation; `prompt_ids` is the context the first round sees."""

    def propose(
        self,
        context: list[int],
        gamma: int,
        warp_fn: Callable[[object], np.ndarray],
        rng: np.random.Generator,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Draft g <= gamma tokens (g may be 0) continuing `context`.

        Returns draft tokens int64 [g] and q float64 [g, V]: row i is the exact distribution
        token i was drawn from, after warp_fn (the same temperature/top-k/top-p warp the target
        gets; warp_fn takes logits [..., V] and returns probabilities over the V token ids
        generation samples from). q may have fewer columns than V: the missing trailing ones
        count as probability 0 (a draft model without the target's padded ids). Random draws
        come from `rng` only.
        """

    def accept(self, context: list[int]) -> None:
        """Verification done: `context` now ends with the emitted tokens (a prefix of the drafts
        plus one). Drop whatever state no longer matches it; catching up can wait for `propose`."""


def is_model(obj) -> bool:
    """True for a minispec Model (something with forward/new_cache), False for a Drafter."""
    return hasattr(obj, "forward") and hasattr(obj, "new_cache") and not hasattr(obj, "propose")


class ModelDrafter:
    """Draft with a second, smaller model sharing the target's tokenizer (M_q in Leviathan et al.).

    Its KV cache holds a prefix of the context: after a round it is rolled back to the tokens the
    target kept, and the next `propose` feeds whatever it has not seen yet (the correction or
    bonus token, plus the last draft when every draft was accepted) in one multi-token call.
    """

    name = "model"

    def __init__(self, model) -> None:
        self.model = model
        self.cache = None
        self.calls = 0
        self._synced = 0  # context length at the last propose: the cache matched it up to here
        self._fed: list[int] = []  # drafts fed to the cache after that (all but the last draft)

    def start(self, prompt_ids: list[int]) -> None:
        """New generation: an empty cache (allocated once, reused by later generations)."""
        if self.cache is None:
            self.cache = self.model.new_cache()
        self.cache.rollback(0)
        self.calls, self._synced, self._fed = 0, 0, []

    def propose(self, context, gamma, warp_fn, rng):
        """Sample gamma tokens from the draft model, one forward call each; the first call also
        feeds the context tokens the cache has not seen. The last draft is not fed: nothing
        needs its logits this round."""
        model = self.model
        # the cache will hold context + drafts[:-1]; near the draft's own context limit, draft less
        gamma = min(gamma, model.config.max_position_embeddings - len(context) + 1)
        tokens = context[self.cache.length :]  # catch-up: tokens accepted since the last round
        if gamma < 1 or (tokens and max(tokens) >= model.vocab_size):
            # nothing to draft, or the target sampled an id past this model's vocabulary (only
            # possible without tokenizers): the round is one target step
            self._synced, self._fed = self.cache.length, []
            return np.empty(0, dtype=np.int64), np.empty((0, model.vocab_size))
        if len(context) + gamma - 1 > self.cache.max_len:  # grow (rare): re-read the context
            self.cache = model.new_cache(
                min(model.config.max_position_embeddings, 2 * (len(context) + gamma))
            )
            tokens = context
        drafts = np.empty(gamma, dtype=np.int64)
        q = []
        for i in range(gamma):
            logits = model.forward(tokens, self.cache)  # [T, V_draft]
            self.calls += 1
            q.append(warp_fn(logits[-1]))  # [V_draft]: only the row we sample from
            drafts[i] = sample(q[-1], rng)
            tokens = [int(drafts[i])]
        self._synced, self._fed = len(context), drafts[:-1].tolist()
        return drafts, np.stack(q)

    def accept(self, context: list[int]) -> None:
        """Roll the cache back to the drafts the target kept (the rest of `context` is caught up
        on in the next `propose`)."""
        n = self._synced
        for d in self._fed:
            if n == len(context) or context[n] != d:
                break
            n += 1
        # keep at least the last context token unseen: the next propose feeds it to get logits
        # (a sampler whose correction repeats the rejected draft would otherwise leave nothing)
        self.cache.rollback(min(n, len(context) - 1))


class NgramDrafter:
    """Prompt lookup: draft by copying from the context (Saxena 2023, "Prompt Lookup Decoding";
    Leviathan et al. 2023 mention n-gram drafters in section 2.3). No model, no cache.

    Find the most recent earlier occurrence of the context's last n tokens, trying n = max_n
    down to 1 (the longest suffix that recurs wins), and propose the up to gamma tokens that
    followed it. The copy may run on into the tokens it is producing, like an LZ77 copy, so a
    repeat shorter than gamma (`a b a b`, `x x x`) still fills gamma drafts. No earlier
    occurrence: no drafts, and the round is one plain target step.

    The drafts are a function of the context, so each q row is one-hot. verify() then accepts a
    draft x with probability p(x) (r * 1 < p(x)), and on rejection samples norm(max(0, p -
    onehot(x))): p with x removed, renormalized. Exact, like every drafter.
    """

    name = "ngram"

    def __init__(self, max_n: int = 3, *, vocab_size: int) -> None:
        for label, value in (("max_n", max_n), ("vocab_size", vocab_size)):
            if isinstance(value, bool) or not isinstance(value, Integral) or value < 1:
                raise MinispecError(f"NgramDrafter: {label} must be an integer >= 1, got {value!r}")
        self.max_n, self.vocab_size = int(max_n), int(vocab_size)  # q has vocab_size columns
        self.calls = 0  # no model: never a forward call

    def start(self, prompt_ids: list[int]) -> None:
        """Nothing to reset: the lookup reads the whole context every round."""

    def propose(self, context, gamma, warp_fn, rng):
        """Copy up to gamma tokens from after the latest earlier match of the context's suffix
        (0 tokens without a match); q one-hot. warp_fn and rng are not needed."""
        ctx = np.asarray(context, dtype=np.int64)
        start = find_ngram(ctx, self.max_n)
        drafts: list[int] = []
        for j in range(start, start + gamma) if start >= 0 else ():
            x = int(ctx[j]) if j < len(ctx) else drafts[j - len(ctx)]  # copy past the end
            if x >= self.vocab_size:  # a prompt id outside the sampled vocabulary: stop there
                break
            drafts.append(x)
        q = np.zeros((len(drafts), self.vocab_size))  # [g, V]
        q[np.arange(len(drafts)), drafts] = 1.0
        return np.array(drafts, dtype=np.int64), q

    def accept(self, context: list[int]) -> None:
        """Nothing to roll back."""


def find_ngram(context: np.ndarray, max_n: int) -> int:
    """Where to copy from: the index just past the most recent earlier occurrence of the last n
    tokens of `context` (int array [S]), for the largest n <= max_n that has one; -1 if none.

    "Earlier" means ending before the last token (the suffix itself does not count); occurrences
    may overlap it (in `x x x` the suffix `x x` also occurs at 0, so the answer is 2).
    """
    s = len(context)
    for n in range(min(max_n, s - 1), 0, -1):
        windows = np.lib.stride_tricks.sliding_window_view(context[:-1], n)  # [S-n, n]
        hits = np.flatnonzero((windows == context[-n:]).all(axis=1))  # starts of the matches
        if hits.size:
            return int(hits[-1]) + n
    return -1


class EarlyExitDrafter:
    """Self-speculative decoding: the target's first k layers, then its final norm and LM head,
    are the draft model; no second model (Elhoushi et al. 2024, LayerSkip; Zhang et al. 2023,
    "Draft & Verify").

    Layers 0..k-1 compute the same keys, values and hidden states for a token whether drafting
    or verification runs them, so nothing is computed twice. The loop hands the drafter the
    target's KV cache (`share_cache`); drafting writes layers 0..k-1 of it for each position it
    feeds and keeps that position's layer-k hidden state; `verify_forward` then runs layers
    0..k-1 only for what drafting never fed (the last draft) and layers k..L-1 for all g+1
    positions. Every cache entry is the target's own, so the loop's rollback of the target
    cache rolls the drafter back too: `accept` has nothing to do.

    Exact like every drafter: q is the warped distribution of the early-exit logits, the one
    each draft is sampled from. A head trained on the last layer reads layer k's hidden state
    poorly, so acceptance is modest unless the model was trained for it (LayerSkip's layer
    dropout and early-exit loss); a draft step costs about k/L of a target step.
    """

    name = "early-exit"

    def __init__(self, target, exit_layer: int) -> None:
        L = target.n_layers
        if (
            isinstance(exit_layer, bool)
            or not isinstance(exit_layer, Integral)
            or not 1 <= exit_layer < L
        ):
            raise MinispecError(
                f"exit_layer: expected an integer in 1..{L - 1} (target "
                f"{target.name!r} has {L} layers), got {exit_layer!r}"
            )
        self.target, self.k = target, int(exit_layer)
        self.cache = None  # the target's, from share_cache
        self.calls = 0
        self._pos = 0  # first position drafting fed this round
        self._fed: list[int] = []  # the tokens it fed there, in order
        self._h: list = []  # their layer-k hidden states, one [T, D] piece per draft step

    def start(self, prompt_ids: list[int]) -> None:
        """New generation: forget the cache of the last one (the loop shares a new one)."""
        self.cache, self.calls, self._fed, self._h = None, 0, [], []

    def share_cache(self, target, cache):
        """Draft in the target's cache from now on; verify with the returned `verify_forward`."""
        if target is not self.target:  # its logits would be another model's
            raise MinispecError(
                f"drafter: this early-exit drafter is made of {self.target.name!r}'s layers, not "
                f"the target {target.name!r}'s; make it with make_drafter('early-exit', target)"
            )
        self.cache = cache
        return self.verify_forward

    def propose(self, context, gamma, warp_fn, rng):
        """Sample gamma tokens from the early exit, one call of layers 0..k-1 each; the first
        also feeds what the target cache lacks (the last context token; the prompt at first)."""
        target, cache = self.target, self.cache
        if cache is None:
            raise MinispecError(
                "EarlyExitDrafter: no target KV cache to draft in; it runs "
                "inside speculative_generate, which calls share_cache"
            )
        pos = cache.length  # the target cache holds context[:pos] in every layer
        tokens = list(context[pos:])
        gamma = min(gamma, cache.max_len - len(context) + 1)  # feeds positions < len+gamma-1
        self._pos, self._fed, self._h = pos, [], []
        drafts = np.empty(max(gamma, 0), dtype=np.int64)
        q = []
        for i in range(gamma):
            h = target.run_layers(target.embed(tokens, pos), cache, pos, 0, self.k)  # [T, D]
            self.calls += 1
            self._fed += tokens
            self._h.append(h)
            q.append(warp_fn(target.head(h[-1:])[0]))  # [V]: only the row we sample from
            drafts[i] = sample(q[-1], rng)
            pos, tokens = pos + len(tokens), [int(drafts[i])]
        return drafts, np.stack(q) if q else np.empty((0, 0))  # [g, V] (the loop pads [0, 0])

    def verify_forward(self, tokens, cache):
        """target.forward(tokens, cache), reusing layers 0..k-1 of the positions drafting fed.

        Those positions' keys and values are already in `cache` (drafting wrote them) and their
        layer-k hidden states were kept; anything else is computed here, so the logits are the
        target's whatever was drafted. Advances cache.length by len(tokens), like forward.
        """
        target = self.target
        tokens = [int(t) for t in tokens]
        pos, n = cache.length, len(self._fed)
        reuse = cache is self.cache and pos == self._pos and tokens[:n] == self._fed
        parts, n = (self._h, n) if reuse and n else ([], 0)
        if n < len(tokens):  # layers 0..k-1 for what drafting never fed
            h = target.embed(tokens[n:], pos + n)
            parts = parts + [target.run_layers(h, cache, pos + n, 0, self.k)]
        h = parts[0] if len(parts) == 1 else target.xp.concatenate(parts)  # -> [T, D]
        h = target.run_layers(h, cache, pos, self.k, target.n_layers)
        cache.length = pos + len(tokens)
        self._fed, self._h = [], []
        return target.head(h)  # [T, V]

    def accept(self, context: list[int]) -> None:
        """Nothing to do: the loop rolled the shared cache back to what the target kept."""


DRAFTERS = ("model", "ngram", "early-exit")


def default_exit_layer(target) -> int:
    """The early-exit drafter's default k: a quarter of the target's layers, at least 1."""
    return max(1, target.n_layers // 4)


def make_drafter(name: str, target, *, draft_model=None, exit_layer: int | None = None):
    """The drafter called `name` ("model" | "ngram" | "early-exit") for `target`.

    "model" needs draft_model (a Model sharing the target's vocabulary); "early-exit" runs the
    first exit_layer layers of the target (default: default_exit_layer, a quarter of them);
    "ngram" looks up the context, max_n 3. exit_layer is ignored by the other two.
    """
    if name == "model":
        if draft_model is None:
            raise MinispecError(
                "drafter 'model' needs a draft model (--draft DIR), or choose "
                "the ngram or early-exit drafter, which need none"
            )
        check_vocabularies(target, draft_model)
        return ModelDrafter(draft_model)
    if name == "ngram":
        from .speculative import sampled_vocab_size  # speculative imports this module

        return NgramDrafter(vocab_size=sampled_vocab_size(target))
    if name == "early-exit":
        k = default_exit_layer(target) if exit_layer is None else exit_layer
        return EarlyExitDrafter(target, k)
    raise MinispecError(f"drafter: expected one of {' | '.join(DRAFTERS)}, got {name!r}")


def check_vocabularies(target, draft) -> None:
    """Raise MinispecError unless `draft` can propose tokens for `target`.

    Both must index the same tokens: with tokenizers on both sides, the same token -> id map;
    without, a draft vocabulary no larger than the target's. The target's may be larger (its
    embedding padded past the tokenizer, as in Qwen2.5 pairs): the padded ids get q = 0.
    """
    if draft is target:
        return
    if draft.vocab_size > target.vocab_size:
        raise MinispecError(
            f"draft {draft.name!r} has vocab_size {draft.vocab_size}, larger than target "
            f"{target.name!r} ({target.vocab_size}): the draft must use the target's vocabulary"
        )
    tok_t, tok_d = getattr(target, "tokenizer", None), getattr(draft, "tokenizer", None)
    if tok_t is None or tok_d is None:
        return
    if not _same_vocab(tok_t, tok_d):
        raise MinispecError(
            f"draft {draft.name!r} and target {target.name!r} have different tokenizers "
            "(their token -> id maps differ): speculative decoding needs a shared vocabulary"
        )
    if draft.vocab_size < tok_d.vocab_size:
        raise MinispecError(
            f"draft {draft.name!r} has vocab_size {draft.vocab_size}, fewer than the "
            f"{tok_d.vocab_size} tokens of its tokenizer: it cannot read every token"
        )


# (id(a), id(b)) -> (a, b) for tokenizer pairs found equal; holding the pair keeps the ids valid
_checked_pairs: dict[tuple[int, int], tuple] = {}


def _same_vocab(a, b) -> bool:
    """Same token -> id map (special tokens included); each pair is compared once."""
    if a is b or (id(a), id(b)) in _checked_pairs:
        return True
    same = _vocab(a) == _vocab(b)
    if same:
        _checked_pairs[(id(a), id(b))] = (a, b)
    return same


def _vocab(tokenizer) -> dict[str, int]:
    tok = getattr(tokenizer, "tok", tokenizer)  # minispec.Tokenizer wraps a tokenizers.Tokenizer
    return tok.get_vocab(with_added_tokens=True)
