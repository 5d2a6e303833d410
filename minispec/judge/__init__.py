"""The statistical judge: is a verify step, a drafter or a whole pipeline lossless?

    python -m minispec judge --help            # what each part tests, PASS, exit codes
    python -m minispec judge --quick           # minispec's own verify step, loop and drafters
    python -m minispec judge --drafter mypkg.mymod:factory      # a drafter of one's own
    python -m minispec judge --generator mypkg.mymod:factory    # a pipeline of one's own

Modules, one idea each: `stats` (G-tests, Holm, exact laws), `verify_step` (part 1: a verify step
alone; part T: the tree walk alone), `selftest` (parts 2 and 3: minispec's loop end to end; part
D: a user's drafter in it), `pipeline` (part G: a whole generator), `main` (the command line and
the report). Needs scipy (pip install 'minispec[judge]'); importing this package imports nothing
else and runs nothing.
"""

from __future__ import annotations

import importlib.util
import sys
import types


def main(argv: list[str] | None = None) -> int:
    """Run the judge with command-line arguments `argv` -> the exit status (see --help)."""
    if importlib.util.find_spec("scipy") is None:
        print("minispec judge: needs scipy, not installed here; nothing was tested (pip install "
              "scipy, or pip install 'minispec[judge]')", file=sys.stderr)
        return 3
    from .main import main as run

    return run(argv)


class _Package(types.ModuleType):
    """This package, whose attribute `main` stays the function above. Importing the submodule
    minispec.judge.main (as `main` does, or `from minispec.judge.main import advice`) would
    otherwise rebind the package's `main` to that module, and a later `from minispec.judge
    import main` would get a module, not a function."""

    def __setattr__(self, name: str, value) -> None:
        if name == "main" and isinstance(value, types.ModuleType):
            return  # the submodule stays reachable as sys.modules["minispec.judge.main"]
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
