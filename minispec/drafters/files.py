"""A trained drafting head's directory: config.json and model.safetensors (Medusa, EAGLE)."""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import MinispecError


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
