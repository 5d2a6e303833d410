"""The draft model beyond the core's plain loop: two exact options, and a batch's drafting.

minispec/core/drafter.py's ModelDrafter is Leviathan et al.'s M_q, drafting one sequence with a
plain loop over the draft model's forward pass. Here, built on it:

- `TunedModelDrafter`, the draft model with two options, both exact (the verify step is
  unchanged): a cut draft vocabulary (FR-Spec) and a chain of dynamic length (`stop`), drafted
  by `propose_batch`'s loop;
- `FusedModelDrafter`, a TunedModelDrafter without `stop` whose chain is drafted in one numba
  call on the CPU step (cpu_steps.CpuSteps.draft_chain), at temperature 0 over the target's
  greedy vocabulary where one is given (drafters/vocab.py): what make_drafter("model") makes
  without `stop`;
- `propose_batch`: every sequence of a batch drafted in one call of the draft model per step
  (minispec/batch.py calls it for any ModelDrafter, the options included, but for a
  FusedModelDrafter in a batch of one or two sequences, which drafts each chain in its call).
"""

from __future__ import annotations

import numpy as np

from ..batch_forward import batch_hidden
from ..core.drafter import Draft, ModelDrafter
from ..core.sampling import sample
from ..core.sampling import warp as softmax  # at temperature 1: the plain softmax
from ..errors import MinispecError
from .vocab import DraftVocab, cut_for


class TunedModelDrafter(ModelDrafter):
    """A ModelDrafter with two options, both exact (the verify step is unchanged):

    draft_vocab: ascending token ids; the draft computes only their rows of its LM head and
        gives every other token q = 0 (FR-Spec; drafters/vocab.py). For a draft whose output
        layer is most of its weights (a small model over a 49,152-token vocabulary) this is
        most of the cost of a draft token.
    stop: a chain of dynamic length. Before drafting token i, the chance that the chain so far
        and token i are all kept is estimated by the draft's own probabilities (the product of
        those of the tokens drafted so far, times its top probability now); below `stop` the
        chain ends. The choice reads only what was drafted before token i, never token i, so
        each drafted token is still kept with min(1, p/q). It pays only where the draft's
        probabilities say how likely it is to be kept: a draft distilled to the target's
        distributions (SmolLM2's) is close; the shipped toy draft is not, and drafts too little.
    """

    def __init__(self, target, model, draft_vocab=None, stop: float | None = None) -> None:
        super().__init__(target, model)
        if stop is not None and not (isinstance(stop, (int, float)) and not isinstance(stop, bool)
                                     and 0 <= stop < 1):
            raise MinispecError(f"model: stop must be a probability in [0, 1), got {stop!r:.40}")
        self.stop = None if stop is None else float(stop)
        self.draft_head = None if draft_vocab is None else DraftVocab(
            model, draft_vocab, "model draft_vocab")

    def propose(self, context, gamma, warp, rng) -> Draft:
        """The chain of drafts, with the options (see propose_batch: this is the batch of one)."""
        return propose_batch([self], [context], [gamma], warp, [rng])[0]


class FusedModelDrafter(TunedModelDrafter):
    """ModelDrafter, with its chain drafted in one call where the draft model takes the CPU
    step (cpu_steps.enable): the g forward calls, LM heads and draws as one numba loop, without
    the Python between them (weights/README.md, "The model drafter's chain in one call").
    Greedy (temperature 0): each draft the argmax, q the loop's own `warp` of the same logits,
    one-hot. Sampled with temperature alone (top-k and top-p off): q the softmax the loop's warp
    computes, in float64, and each draft drawn from it as sampling.sample draws, its uniform
    taken from `rng` in the core loop's order (q's last bits may differ from warp's: q is the
    distribution the draft was drawn from, which is what verify needs). The logits are the
    draft model's own CPU step's, bit for bit. Anything else (top-k,
    top-p, a model the step does not serve) is the core's loop.

    draft_vocab: TunedModelDrafter's option (no `stop`): the chain computes only those rows of
    the LM head, q = 0 elsewhere; where the chain does not serve, TunedModelDrafter's loop.
    greedy_vocab: ascending token ids, a draft vocabulary for temperature 0 alone (in place of
    draft_vocab there): a greedy draft is the argmax, q one-hot at it, so a cut that holds the
    target's argmax drafts what the target keeps at a smaller cost (drafters/vocab.py)."""

    def __init__(self, target, model, draft_vocab=None, greedy_vocab=None) -> None:
        super().__init__(target, model, draft_vocab)
        self.greedy_head = None if greedy_vocab is None else DraftVocab(
            model, greedy_vocab, "model greedy_vocab")

    def head(self, warp):
        """The LM head a draft step uses under `warp`: the greedy vocabulary's rows at T = 0
        where there is one, else the draft vocabulary's (None: the whole head)."""
        return cut_for(warp, self.draft_head, self.greedy_head)

    def _loop(self, context, gamma, warp, rng) -> Draft:
        """The chain without draft_chain: the core's loop, or with a cut vocabulary
        TunedModelDrafter's (the core's loop has none)."""
        if self.head(warp) is None:
            return ModelDrafter.propose(self, context, gamma, warp, rng)
        return super().propose(context, gamma, warp, rng)

    def propose(self, context, gamma, warp, rng) -> Draft:
        chain = getattr(getattr(self.model, "fast_steps", None), "draft_chain", None)
        s = getattr(warp, "sampling", None)
        if chain is None or s is None or (not s.greedy and (s.top_k or s.top_p < 1)):
            return self._loop(context, gamma, warp, rng)
        g, feed = self.prepare(context, gamma)
        if g == 0:
            return self._loop(context, gamma, warp, rng)
        done = chain(feed, self.cache, g, self.vocab_size, s.temperature, rng, self.head(warp))
        if done is None:  # nothing drawn from rng: the loop draws as it would have
            return self._loop(context, gamma, warp, rng)
        tokens, logits, q = done  # q [g, V] when sampled
        if s.greedy:
            q = warp(logits)  # [g, V]: one-hot at each argmax, with warp's checks of the logits
        elif not np.isfinite(logits[:, :self.vocab_size].max(axis=1)).all():
            warp(logits)  # raises, naming what is wrong with the logits
        self.calls += g
        self._synced, self._fed = len(context), tokens[:g - 1].tolist()
        return Draft(tokens, q)


def propose_batch(drafters, contexts, gammas, warp, rngs) -> list[Draft]:
    """Each sequence's chain of drafts, one call of the draft model per step for every
    sequence still drafting (minispec/batch_forward.py), each with its own draft cache. The
    first call also feeds the context tokens a cache has not seen. The last draft is not fed:
    nothing needs its logits this round. drafters: ModelDrafters of one target and one draft
    model, each with its own cache (a batch's copies of one drafter: one set of options)."""
    first = drafters[0]
    model, stop, V = first.model, getattr(first, "stop", None), first.vocab_size
    plans = [d.prepare(c, g) for d, c, g in zip(drafters, contexts, gammas)]  # (g, tokens)
    todo = [g for g, _ in plans]  # drafts each sequence may still make (stop shortens it)
    drafts = [np.empty(g, dtype=np.int64) for g in todo]
    qs = [np.empty((g, V)) for g in todo]
    feed = [tokens for _, tokens in plans]
    fed = [0] * len(plans)  # of each chain's drafts, how many went into its cache
    sure = [1.0] * len(plans)  # the estimated chance that each chain so far is kept
    for i in range(max(todo, default=0)):
        live = [b for b, g in enumerate(todo) if g > i]  # still drafting
        if not live:  # every chain ended early
            break
        hs = batch_hidden(model, [feed[b] for b in live], [drafters[b].cache for b in live])
        logits = heads(first, hs, warp)  # [B_live, V_draft]: each sequence's last row
        probs = warp(logits)  # [B_live, V], in one call (warp works row by row)
        # the draft's own (unwarped) distributions, for `stop` (see the class docstring)
        own = None if stop is None else softmax(logits, 1.0)  # [B_live, V]
        for j, b in enumerate(live):
            drafters[b].calls += 1
            fed[b] = i  # drafts 0..i-1 are in the cache now
            if own is not None and sure[b] * own[j].max() < stop:
                todo[b] = i  # token i would not be kept often enough: end here
                continue
            qs[b][i] = probs[j]  # [V]: only the row we sample from
            drafts[b][i] = sample(qs[b][i], rngs[b])
            feed[b] = [int(drafts[b][i])]
            if own is not None:
                sure[b] *= float(own[j, drafts[b][i]])
                if sure[b] < stop:  # no later token can pass: the same chain, sooner
                    todo[b] = i + 1
    out = []
    for d, c, g, n, tokens, q in zip(drafters, contexts, todo, fed, drafts, qs):
        d._synced, d._fed = (len(c), tokens[:n].tolist()) if g else (d.cache.length, [])
        out.append(Draft(tokens[:g], q[:g]) if g else d.empty_draft())
    return out


def heads(drafter, hs, warp=None):
    """The LM head on each sequence's last hidden row -> [B, V_draft]: the draft's own, or its
    rows of a cut vocabulary (host logits, -inf outside it): the draft vocabulary's, or under a
    greedy `warp` a FusedModelDrafter's greedy vocabulary's."""
    rows = drafter.model.xp.concatenate([h[-1:] for h in hs])  # [B, D]
    head = (drafter.head(warp) if hasattr(drafter, "head")
            else getattr(drafter, "draft_head", None))
    return drafter.model.lm_head(rows) if head is None else head(rows)
