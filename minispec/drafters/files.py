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
