"""Where the shipped models live: `weights/` in a checkout, or the copy a wheel installs.

`pip install .` (or a wheel) carries weights/target, weights/draft, weights/medusa,
weights/eagle and weights/prompts.json as the package data of `minispec._weights`, so every
command that defaults to the shipped models works from any directory. A checkout (and an
editable install) reads its own weights/ folder instead.
"""

from __future__ import annotations

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
NAMES = ("target", "draft", "medusa", "eagle", "prompts.json")


def resolve(path):
    """"shipped:NAME" -> the shipped NAME (target, draft, medusa, eagle, prompts.json), the same
    spelling in a checkout and after `pip install .`; any other path is returned unchanged."""
    if not (isinstance(path, str) and path.startswith(PREFIX)):
        return path
    name = path[len(PREFIX):]
    if name not in NAMES:
        from .errors import MinispecError

        raise MinispecError(f"{path!r:.80}: expected {PREFIX}NAME with NAME one of "
                            f"{', '.join(NAMES)}")
    return SHIPPED / name


def path_arg(text: str) -> Path:
    """An argparse `type` for a model or prompts path: "shipped:NAME" or any path, as a Path."""
    return Path(resolve(text))


def display(path) -> str:
    """A path as a user would name it: "shipped:NAME" for the shipped models (so no machine's
    absolute path shows in printed reports), any other path as given."""
    try:
        rel = Path(path).resolve().relative_to(SHIPPED.resolve())
    except ValueError:
        return str(path)
    return f"{PREFIX}{rel.as_posix()}"
