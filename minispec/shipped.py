"""Where the shipped models live: `weights/` in a checkout, or the copy a wheel installs.

`pip install .` (or a wheel) carries weights/target, weights/draft, weights/medusa,
weights/eagle, weights/prompts.json, weights/greedy_vocab.json and weights/workloads/ as the
package data of `minispec._weights`, so every
command that defaults to the shipped models works from any directory. A checkout (and an
editable install) reads its own weights/ folder instead.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[1] / "weights"
INSTALLED = Path(__file__).resolve().parent / "_weights"


def shipped_dir() -> Path:
    """The folder holding target/, draft/, medusa/, eagle/ and prompts.json."""
    if (CHECKOUT / "target" / "config.json").is_file():
        return CHECKOUT
    if (INSTALLED / "target" / "config.json").is_file():
        return INSTALLED
    return CHECKOUT  # neither: the errors then name the checkout's path, which a user can fix


SHIPPED = shipped_dir()

PREFIX = "shipped:"
MODELS = ("target", "draft")  # what minispec.load takes
HEADS = {"medusa": ("Medusa heads", "medusa_dir"), "eagle": ("an EAGLE head", "eagle_dir")}
NAMES = (*MODELS, *HEADS, "prompts.json")  # everything shipped


def resolve(path, names=MODELS):
    """"shipped:NAME" -> the shipped NAME, the same spelling in a checkout and after `pip install
    .`; any other path is returned unchanged. names: the NAMEs the caller takes (default the
    models, what `load` takes; NAMES: anything shipped, as the commands' path options take)."""
    if not (isinstance(path, str) and path.startswith(PREFIX)):
        return path
    name = path[len(PREFIX):]
    if name not in names:
        from .errors import MinispecError

        what = f"expected {PREFIX}NAME with NAME one of {', '.join(names)}"
        if name in HEADS and name not in names:
            kind, option = HEADS[name]
            raise MinispecError(f"{path!r}: a head directory ({kind}), not a model: "
                                f"make_drafter({name!r}, target) reads it (its default for the "
                                f"shipped target; {option}= takes another); {what}")
        if name in NAMES:
            raise MinispecError(f"{path!r}: the shipped prompt file, not a model; {what}")
        raise MinispecError(f"{path!r:.80}: {what}")
    return SHIPPED / name


def path_arg(text: str) -> Path:
    """An argparse `type` for a model or prompts path: "shipped:NAME" (any shipped NAME) or any
    path, as a Path."""
    return Path(resolve(text, NAMES))


def models_hint(message: str) -> str:
    """For an error "DIR/config.json: file not found" where DIR holds model directories (as
    weights/ holds target/ and draft/): a hint naming them, e.g. " (weights holds model
    directories: weights/draft, weights/target; give one of them)"; else ""."""
    m = re.search(r"(\S+)/config\.json: file not found", message)
    if m is None:
        return ""
    folder = Path(m.group(1))
    try:
        found = sorted(d for d in folder.iterdir() if _is_model_dir(d))
    except OSError:
        return ""
    if not found:
        return ""
    shown = ", ".join(str(d) for d in found[:4]) + (", ..." if len(found) > 4 else "")
    return f" ({folder} holds model directories: {shown}; give one of them)"


def _is_model_dir(d: Path) -> bool:
    """A directory whose config.json names a model family (a head's config.json names none)."""
    import json

    try:
        cfg = json.loads((d / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(cfg, dict) and ("model_type" in cfg or "architectures" in cfg)


def display(path) -> str:
    """A path as a user would name it: "shipped:NAME" for the shipped models (so no machine's
    absolute path shows in printed reports), any other path as given."""
    try:
        rel = Path(path).resolve().relative_to(SHIPPED.resolve())
    except ValueError:
        return str(path)
    return f"{PREFIX}{rel.as_posix()}"


CACHE_NAME = "smollm2-135m-instruct"  # where `minispec real` keeps SmolLM2 converted


def default_cache() -> Path:
    """$MINISPEC_CACHE, else ~/.cache/minispec/smollm2-135m-instruct."""
    env = os.environ.get("MINISPEC_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "minispec" / CACHE_NAME
