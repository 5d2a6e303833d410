"""A trained drafting head's directory: config.json and model.safetensors (Medusa, EAGLE)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ..backend import BF16, F16, kernel_available, to_host, widen
from ..errors import MinispecError
from ..loader import as_stored_putter


def read_head_dir(path, what: str) -> tuple[dict, Path]:
    """(the parsed config.json, the path of model.safetensors) of a head directory, or
    MinispecError naming the file and what was expected; `what` names the head ("Medusa heads",
    "EAGLE head")."""
    path = Path(path)
    cfg_file, st_file = path / "config.json", path / "model.safetensors"
    if not cfg_file.is_file() or not st_file.is_file():
        raise MinispecError(f"{path}: not {what} directory (expected config.json and "
                            "model.safetensors)")
    try:
        cfg = json.loads(cfg_file.read_text())
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        raise MinispecError(f"{cfg_file}: not valid JSON ({str(e)[:100]})") from None
    if not isinstance(cfg, dict):
        raise MinispecError(f"{cfg_file}: expected a JSON object")
    return cfg, st_file


def target_signature(c) -> dict:
    """What a head's config.json records of the target it was trained for (its "target" field),
    from the target's ModelConfig: enough to tell the shipped targets apart and to refuse a head
    for another model's shape."""
    return {"model_type": c.family, "hidden_size": c.hidden_size,
            "num_hidden_layers": c.n_layers, "vocab_size": c.vocab_size}


def find_head_dir(candidates, target, what: str) -> Path:
    """The first directory of `candidates` whose config.json says it was trained for `target` (a
    Model or its ModelConfig; the "target" field matches target_signature), or MinispecError
    listing what there is."""
    want, seen = target_signature(getattr(target, "config", target)), []
    for path in candidates:
        if not (Path(path) / "config.json").is_file():
            continue
        cfg, _ = read_head_dir(path, what)
        if cfg.get("target") == want:
            return Path(path)
        seen.append(f"{path} (for {cfg.get('target')})")
    raise MinispecError(f"no {what} trained for this target ({want}) ships with minispec; found: "
                        f"{'; '.join(seen) or 'none'}. Train some (weights/train_heads.py) and "
                        "pass their directory")


def as_stored_heads(st, target):
    """put(float32 [out, in]) keeping a head file's matrices as stored (BF16, F16) where the
    target computes float32 on the CPU with the few-rows kernel and the file holds its matrices
    in one such format, as loader.load keeps a model's; None elsewhere (float32 throughout)."""
    formats = {st.tensors[n].dtype for n in st.keys()
               if len(st.tensors[n].shape) == 2 and n != "draft_vocab"}
    if target.xp is np and target.dtype == np.float32 and kernel_available() \
            and len(formats) == 1:
        return as_stored_putter(formats.pop(), target.dtype)
    return None


def head_matrix(xp, w, dtype):
    """A head's matrix w [out, in] as its drafter holds it, used through its transpose (as
    loader.py stores the target's weights): a 16-bit one (BF16 or F16, from as_stored_heads)
    stays 16-bit on the CPU, where the few-rows kernel widens it in registers; any other, or one
    for the GPU, in the target's dtype."""
    w = np.asarray(to_host(w))
    if xp is not np or w.dtype not in (BF16, F16):
        w = widen(w).astype(dtype)  # widen: a 16-bit one exactly, any other unchanged
    return xp.asarray(np.ascontiguousarray(w)).T  # [in, out]
