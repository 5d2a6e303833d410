"""Drafters: whatever proposes the gamma tokens the target then verifies.

The contract every drafter follows is in minispec/core/drafter.py (trees extend it in
minispec/tree.py, batches in minispec/batch.py). Seven drafters ship, chosen by name with
`make_drafter`:
    "model"       ModelDrafter: a second, smaller model (Leviathan et al.'s M_q); made as a
                  FusedModelDrafter, whose chains take one numba call on the CPU step
    "ngram"       NgramDrafter: prompt lookup, copying what followed an earlier occurrence of
                  the context's last tokens (Saxena 2023, "Prompt Lookup Decoding")
    "early-exit"  EarlyExitDrafter: the target's own first k layers and its head, sharing the
                  target's KV cache (self-speculative decoding; Elhoushi et al. 2024, LayerSkip)
    "model-tree"  TreeModelDrafter: the second model's top-k candidates at each depth, a tree
                  verified in one target call (minispec/tree.py)
    "medusa"      MedusaDrafter: K heads on the target's last hidden state guess the next K
                  tokens; their top-k candidates form the tree (Cai et al. 2024, Medusa)
    "eagle"       EagleDrafter: one decoder layer guesses the target's next feature from its
                  features and tokens (Li et al. 2024, EAGLE); a chain, a static tree, or
                  EAGLE-2's dynamic tree
    "auto"        AutoDrafter: prompt lookup in the rounds where the context's suffix recurs in
                  it, the EAGLE head (eagle-copy's chain) in the others (drafters/auto.py)
"""

from __future__ import annotations

from ..core.drafter import (
    Draft,
    Drafter,
    ModelDrafter,
    NoDrafter,
    check_vocabularies,
    sampled_vocab_size,
)
from ..errors import MinispecError
from ..safetensors import SafetensorsFile
from ..shipped import SHIPPED
from .auto import HEAD_CHAIN, LOOKUP_MIN_N, AutoDrafter
from .draft_model import FusedModelDrafter, TunedModelDrafter
from .eagle import EagleDrafter, load_eagle, random_eagle
from .early_exit import EarlyExitDrafter, default_exit_layer
from .files import find_head_dir, read_head_dir
from .medusa import MedusaDrafter, load_medusa, random_medusa
from .ngram import NgramDrafter, find_ngram, find_ngrams
from .tree_model import TreeModelDrafter
from .vocab import load_draft_vocab, read_draft_vocab, read_greedy_vocab

DRAFTERS = ("model", "ngram", "early-exit", "model-tree", "medusa", "eagle", "auto")
SHIPPED_MEDUSA = SHIPPED / "medusa"  # weights/ in a checkout, or the installed copy
SHIPPED_EAGLE = SHIPPED / "eagle"
# the shipped heads, one per target (the shipped toy target, SmolLM2-135M-Instruct): make_drafter
# takes the one whose config.json names the target's shape
SHIPPED_HEADS = {"medusa": (SHIPPED_MEDUSA, SHIPPED / "smollm2" / "medusa"),
                 "eagle": (SHIPPED_EAGLE, SHIPPED / "smollm2" / "eagle")}

EAGLE_STOP = 0.15  # the "eagle-stop" preset's threshold (an EAGLE chain of dynamic length)
EAGLE_COPY = 2  # the "eagle-copy" preset: eagle-stop that copies once a draft agrees with a
# prompt lookup of at least 2 tokens
AUTO_GAMMA = 16  # the auto preset's gamma, tuned (weights/README.md): the most drafts a round may
# hold; its lookup copies grow up to it, its head's chain ends itself (EAGLE_STOP)
MODEL_STOP = 0.2  # the drafters table's "model stop" row: a draft model's chain of dynamic length
# the drafters that need no draft model, by the names `bench --draft none`, `minispec real` and
# `judge --drafter NAME` use: name -> (make_drafter's name, its options)
PRESETS = {"ngram": ("ngram", {}), "early-exit": ("early-exit", {}),
           "medusa": ("medusa", {}), "medusa-tree": ("medusa", {"tree": (2, 2, 1, 1)}),
           "eagle": ("eagle", {}), "eagle-tree": ("eagle", {"tree": (2, 2, 1, 1)}),
           "eagle-2": ("eagle", {"tree": (4, 3, 2, 2), "dynamic": (3, 12)}),
           "eagle-stop": ("eagle", {"stop": EAGLE_STOP}),
           "eagle-copy": ("eagle", {"stop": EAGLE_STOP, "copy": EAGLE_COPY}),
           "auto": ("auto", {})}
# the presets tuned with a gamma of their own: the tables (bench --draft none, drafters) run them
# at it, whatever --gamma says
PRESET_GAMMA = {"auto": AUTO_GAMMA}

__all__ = [
    "AUTO_GAMMA", "AutoDrafter", "DRAFTERS", "Draft", "Drafter", "EAGLE_COPY", "EAGLE_STOP",
    "EagleDrafter", "EarlyExitDrafter", "FusedModelDrafter", "HEAD_CHAIN", "MODEL_STOP",
    "MedusaDrafter", "ModelDrafter",
    "NgramDrafter", "NoDrafter", "PRESETS", "PRESET_GAMMA",
    "TreeModelDrafter", "TunedModelDrafter", "check_vocabularies", "default_exit_layer",
    "find_ngram", "find_ngrams", "head_draft_vocab", "load_draft_vocab", "load_eagle",
    "load_medusa", "make_drafter", "random_eagle", "random_medusa", "read_greedy_vocab",
    "sampled_vocab_size",
]


def make_drafter(name: str, target, *, draft_model=None, exit_layer: int | None = None,
                 tree=None, medusa_dir=None, dynamic=None, eagle_dir=None,
                 stop: float | None = None, draft_vocab=None, copy: int | None = None,
                 lookup: int | None = None, greedy_vocab="shipped") -> Drafter:
    """The drafter called `name` (one of DRAFTERS) for `target`.

    "model" needs draft_model (a Model sharing the target's vocabulary) and takes stop (a chain
    ended where the draft's own confidence falls below it) and draft_vocab (ascending token ids:
    only their rows of its LM head are computed, q = 0 elsewhere) and, without stop,
    greedy_vocab (ascending token ids the chain drafts from at temperature 0 alone, in place of
    draft_vocab there; default "shipped": without draft_vocab, the target's greedy vocabulary
    in weights/greedy_vocab.json, if it has one; None: none; "medusa" and "eagle" take it too,
    EAGLE where neither stop nor dynamic is given); "early-exit" runs the
    first exit_layer layers of the target (default: default_exit_layer, a quarter of them);
    "ngram" looks up the context, max_n 3; "model-tree" needs draft_model and takes tree, the
    children per depth (default (2, 2, 1, 1)); "medusa" loads heads from medusa_dir (default:
    the shipped heads trained for this target: weights/medusa for the shipped target,
    weights/smollm2/medusa for SmolLM2-135M-Instruct) and takes tree (default (1, 1, 1, 1));
    "eagle" loads a head from eagle_dir (default: the shipped head for this target, likewise)
    and drafts a chain (ended early where the head's confidence falls below stop, given
    stop; copied from the context once a draft agrees with a prompt lookup of at least copy
    tokens, given copy), or a tree given tree, grown dynamically given dynamic=(beam, nodes).
    "auto" drafts by prompt lookup in the rounds where the context's last `lookup` tokens
    (default LOOKUP_MIN_N) recur in it, and with the EAGLE head in the others: the head of
    eagle_dir (default: the shipped head for this target) as the eagle-copy preset drafts (stop
    and copy, default EAGLE_STOP and EAGLE_COPY), at most HEAD_CHAIN drafts a round; by lookup
    alone where no shipped head fits.
    Options a drafter does not use are ignored.
    """
    if name == "model":
        if draft_model is None:
            raise MinispecError(
                "drafter 'model' needs a draft model (--draft DIR), or choose "
                "the ngram or early-exit drafter, which need none")
        if stop is None:
            ids = _greedy_ids(greedy_vocab, target)
            if isinstance(greedy_vocab, str) and ids is not None:  # the shipped default: not
                # with a draft_vocab, and only the ids a draft of a smaller vocabulary has
                ids = None if draft_vocab is not None else ids[
                    ids < sampled_vocab_size(draft_model)]
            return FusedModelDrafter(target, draft_model, draft_vocab, ids)
        return TunedModelDrafter(target, draft_model, draft_vocab, stop)
    if name == "model-tree":
        if draft_model is None:
            raise MinispecError("drafter 'model-tree' needs a draft model (--draft DIR)")
        return TreeModelDrafter(target, draft_model, *(() if tree is None else (tree,)))
    if name == "medusa":
        if medusa_dir is None:
            medusa_dir = find_head_dir(SHIPPED_HEADS["medusa"], target, "Medusa heads")
        heads = load_medusa(medusa_dir, target, *(() if tree is None else (tree,)))
        heads.greedy_vocab(_greedy_ids(greedy_vocab, target))
        return heads
    if name == "eagle":
        if eagle_dir is None:
            eagle_dir = find_head_dir(SHIPPED_HEADS["eagle"], target, "EAGLE head")
        head = load_eagle(eagle_dir, target, tree, dynamic, stop, copy)
        head.greedy_vocab(_greedy_ids(greedy_vocab, target))
        return head
    if name == "ngram":
        return NgramDrafter(target)
    if name == "auto":
        return AutoDrafter(target, _auto_head(target, eagle_dir, stop, copy),
                           LOOKUP_MIN_N if lookup is None else lookup)
    if name == "early-exit":
        k = default_exit_layer(target) if exit_layer is None else exit_layer
        return EarlyExitDrafter(target, k)
    raise MinispecError(f"drafter: expected one of {' | '.join(DRAFTERS)}, got {name!r}")


def _greedy_ids(greedy_vocab, target):
    """make_drafter's greedy_vocab: "shipped" -> the target's listed greedy vocabulary (or
    None); None or ids as given."""
    if isinstance(greedy_vocab, str):
        if greedy_vocab != "shipped":
            raise MinispecError(f"greedy_vocab: expected \"shipped\", None or token ids, got "
                                f"{greedy_vocab!r:.40}")
        return read_greedy_vocab(target)
    return greedy_vocab


def _auto_head(target, eagle_dir, stop, copy):
    """The auto drafter's head: an EAGLE chain as eagle-copy drafts, or None where no head fits
    (none given, none shipped for this target)."""
    if eagle_dir is None:
        try:
            eagle_dir = find_head_dir(SHIPPED_HEADS["eagle"], target, "EAGLE head")
        except MinispecError:
            return None
    return load_eagle(eagle_dir, target, stop=EAGLE_STOP if stop is None else stop,
                      copy=EAGLE_COPY if copy is None else copy)


def head_draft_vocab(target):
    """The draft vocabulary of the shipped EAGLE head trained for `target` (SmolLM2's: its 8,192
    most frequent tokens), or None where there is no such head or it proposes every token."""
    try:
        path = find_head_dir(SHIPPED_HEADS["eagle"], target, "EAGLE head")
    except MinispecError:
        return None
    cfg, st_file = read_head_dir(path, "EAGLE head")
    return read_draft_vocab(SafetensorsFile(st_file), cfg, path / "config.json")
