"""A draft vocabulary: heads that propose only the N most frequent tokens (FR-Spec, Zhao et al.
2025).

Medusa and EAGLE end in the target's own LM head, and pay for all V of its rows at every draft
step: for SmolLM2-135M (V = 49,152, width 576) that is 28M weights, more than an EAGLE head
itself and a third of the target's decode step. Most of those rows are tokens the model rarely
says. A draft vocabulary keeps the N most frequent ones (counted on the target's own output when
the head was trained) and computes only their logits; every other token gets q = 0.

The verify step needs no change and stays exact: a token the draft cannot propose has q(x) = 0,
so where the target wants it the residual max(0, p - q) = p keeps all of its mass; only the
acceptance rate pays, by the target's probability outside the cut.

The kept rows are a copy, and a draft needs no exact logits (verify judges every token it
proposes by the q it was drawn from, whatever computed q). So on the CPU a float32 target's rows
are copied rounded to bfloat16: half the bytes, which each draft step reads from memory (the
target's call in between has streamed its own weights through the caches). For SmolLM2's 8,192
rows: 18.9 MB -> 9.4 MB; with EAGLE's fc kept as stored, drafting fell from 5-6 to ~4 ms a round
on the chat prompts (weights/README.md, "A head's own bytes").

A greedy vocabulary is a cut for temperature 0 alone: a greedy draft is the argmax of its logits
and q is one-hot there, so a cut that holds the target's argmax changes no draft the target
would keep, only the cost. The target's argmax falls in few ids (the shipped toy target's: 334
of 4,096 over its training text, weights/greedy_vocab.py), listed per target in
weights/greedy_vocab.json; `make_drafter` drafts over them at T = 0 with a draft model, Medusa's
heads and EAGLE's (where no stop rule or dynamic tree reads the head's probabilities, which a
cut would renormalise). Where the target's argmax lies outside, that draft is rejected, and the
output is the target's all the same.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ..backend import BF16, kernel_available, to_host
from ..core.drafter import sampled_vocab_size
from ..errors import MinispecError
from ..safetensors import SafetensorsFile, f32_to_bf16
from ..shipped import SHIPPED
from .files import target_signature

GREEDY_VOCABS = SHIPPED / "greedy_vocab.json"  # the shipped greedy vocabularies, one per target


class DraftVocab:
    """The target's final norm and LM head for a drafter: over the whole vocabulary (ids None),
    or over the rows `ids` only (ascending token ids), the other logits -inf (q = 0 there); those
    rows held in bfloat16 where the target's are float32 on the CPU (see the module docstring).
    """

    def __init__(self, target, ids=None, source: str = "draft_vocab") -> None:
        self.target, self.V = target, sampled_vocab_size(target)
        self.ids, self.w = None, None
        if ids is None:
            return
        ids = np.asarray(ids)
        if ids.ndim != 1 or ids.size == 0 or ids.dtype.kind not in "iu":
            raise MinispecError(f"{source}: expected a non-empty 1-D list of token ids, got "
                                f"shape {list(ids.shape)} of {ids.dtype}")
        if ids[0] < 0 or ids[-1] >= self.V or (ids.size > 1 and (np.diff(ids) <= 0).any()):
            raise MinispecError(f"{source}: expected ascending distinct token ids in "
                                f"0..{self.V - 1} (the vocabulary drafted from), got "
                                f"{ids.min()}..{ids.max()}"
                                f"{'' if (np.diff(ids) > 0).all() else ', not ascending'}")
        xp = target.xp
        self.ids = ids.astype(np.int64)
        rows = target.weights["lm_head"].T[xp.asarray(self.ids)]  # [N, D]: one row per kept token
        if xp is np and rows.dtype == np.float32 and kernel_available():
            rows = f32_to_bf16(rows).view(BF16)  # the few-rows kernel widens them in registers
        self.w = xp.ascontiguousarray(rows).T  # [D, N], stored like the target's own head

    @property
    def size(self) -> int:
        """How many tokens the draft can propose."""
        return self.V if self.ids is None else self.ids.size

    def __call__(self, h) -> np.ndarray:
        """Hidden states h [T, D] -> logits [T, V] float32 on the host, -inf outside the cut."""
        if self.ids is None:
            return to_host(self.target.lm_head(h))[:, : self.V]
        out = np.full((h.shape[0], self.V), -np.inf, dtype=np.float32)
        out[:, self.ids] = to_host(self.target.lm_head(h, self.w))
        return out


def read_draft_vocab(st, cfg: dict, source) -> np.ndarray | None:
    """The "draft_vocab" tensor of a head's safetensors file `st` (None if it has none), checked
    against config.json's "draft_vocab_size" when that is given."""
    if "draft_vocab" not in st:
        return None
    ids = st.get_ints("draft_vocab")
    n = cfg.get("draft_vocab_size")
    if n is not None and n != ids.size:
        raise MinispecError(f"{source}: draft_vocab_size is {n!r:.40} but the draft_vocab tensor "
                            f"holds {ids.size} ids")
    return ids


def load_draft_vocab(path) -> np.ndarray:
    """The "draft_vocab" token ids of a safetensors file: what train_heads.py writes into a
    head's model.safetensors (e.g. weights/smollm2/eagle/model.safetensors), usable by any
    drafter of the same target (`make_drafter("model", ..., draft_vocab=...)`)."""
    st = SafetensorsFile(path)  # a clear error for a missing or malformed file
    if "draft_vocab" not in st:
        raise MinispecError(f"{path}: no 'draft_vocab' tensor (a head trained with "
                            "train_heads.py --draft-vocab N has one)")
    return st.get_ints("draft_vocab")


def cut_for(warp, draft_head, greedy_head):
    """The rows a draft step computes under `warp` (speculative.make_warp's): `greedy_head` (a
    greedy vocabulary's DraftVocab) at temperature 0 where there is one, else `draft_head`."""
    greedy = getattr(getattr(warp, "sampling", None), "greedy", False)
    return greedy_head if greedy and greedy_head is not None else draft_head


def read_greedy_vocab(target, path=GREEDY_VOCABS) -> np.ndarray | None:
    """The greedy vocabulary of `target` listed in `path` (a JSON file as weights/greedy_vocab.py
    writes: {"vocabularies": [{"target": {...}, "ids": [...]}, ...]}, matched by the target's
    shape as the shipped heads are), ascending int64 ids; None where the file lists none for it
    (or, for the default file, does not exist). MinispecError names the file and what is wrong."""
    path = Path(path)
    if not path.is_file():
        if path == GREEDY_VOCABS:
            return None
        raise MinispecError(f"{path}: no such file (expected a greedy vocabulary JSON file)")
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        entries = doc["vocabularies"]
        if not isinstance(entries, list):
            raise TypeError
        want = target_signature(getattr(target, "config", target))
        mine = [e for e in entries if isinstance(e, dict) and e.get("target") == want]
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError):
        raise MinispecError(f"{path}: expected JSON of the form {{\"vocabularies\": [{{\"target\": "
                            "{...}, \"ids\": [...]}, ...]}") from None
    if not mine:
        return None
    ids = mine[0].get("ids")
    if (not isinstance(ids, list) or not ids
            or not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < 2**31
                       for i in ids)):
        raise MinispecError(f"{path}: the entry for {want}: \"ids\" must be a non-empty list of "
                            "integer token ids (0 <= id < 2**31)")
    return np.array(ids, dtype=np.int64)  # DraftVocab checks the range and the order
