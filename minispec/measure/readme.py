"""Regenerate the README's results blocks from the commands that produce them.

A results block names its command, and holds that command's output verbatim:

    <!-- results: crossover: python -m minispec crossover --repeats 3 -->
    ```
    ...the output...
    ```
    <!-- /results -->

    python -m minispec.measure.readme --list             # the blocks and their commands
    python -m minispec.measure.readme --only crossover   # rerun one block
    python -m minispec.measure.readme                    # rerun every block (tens of minutes)
    python -m minispec.measure.readme --file weights/README.md

Each command runs from the repository root with the interpreter running this script; a block is
rewritten only when its command succeeds, with the date and the machine's core count added
under it, so a stale figure is one command away from fresh. Timings still depend on the machine
and its load; counts (acceptance, tokens per call, p-values at a seed) do not.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BLOCK = re.compile(r"<!-- results: (?P<name>[\w-]+): (?P<cmd>.+?) -->\n(?P<body>.*?)"
                   r"<!-- /results -->", re.S)


def blocks(text: str) -> list[tuple[str, str]]:
    """(name, command) of every results block, in order."""
    return [(m["name"], m["cmd"]) for m in BLOCK.finditer(text)]


def run_command(cmd: str) -> str:
    """The command's stdout (a leading `python` is this interpreter); SystemExit if it fails."""
    argv = shlex.split(cmd)
    if argv and argv[0] == "python":
        argv[0] = sys.executable
    t0 = time.time()
    r = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, check=False,
                       env=dict(os.environ, PYTHONPATH=str(ROOT)))
    if r.returncode != 0:
        raise SystemExit(f"readme: `{cmd}` failed with status {r.returncode}:\n"
                         f"{r.stderr[-2000:]}")
    stamp = (f"({time.strftime('%Y-%m-%d')}, {os.cpu_count()} CPU cores, "
             f"{time.time() - t0:.0f} s)")
    return r.stdout.rstrip("\n") + "\n" + stamp


def rewrite(text: str, only: set[str] | None = None, runner=run_command) -> str:
    """text with each selected block's body replaced by its command's output."""
    def sub(m: re.Match) -> str:
        if only is not None and m["name"] not in only:
            return m.group(0)
        print(f"readme: {m['name']}: {m['cmd']}", file=sys.stderr, flush=True)
        out = runner(m["cmd"])
        return (f"<!-- results: {m['name']}: {m['cmd']} -->\n```\n{out}\n```\n"
                f"<!-- /results -->")

    return BLOCK.sub(sub, text)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m minispec.measure.readme",
                                 description="Rerun the commands behind the README's results "
                                 "blocks and rewrite them.")
    ap.add_argument("--file", default=str(ROOT / "README.md"), help="the Markdown file")
    ap.add_argument("--only", action="append", help="rerun only this block (repeatable)")
    ap.add_argument("--list", action="store_true", help="list the blocks and their commands")
    args = ap.parse_args(argv)
    path = Path(args.file)
    text = path.read_text(encoding="utf-8")
    found = blocks(text)
    if args.list:
        for name, cmd in found:
            print(f"{name}: {cmd}")
        return 0
    unknown = set(args.only or ()) - {name for name, _ in found}
    if unknown:
        print(f"readme: no block named {', '.join(sorted(unknown))} in {path}", file=sys.stderr)
        return 2
    path.write_text(rewrite(text, set(args.only) if args.only else None), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
