"""Regenerate the results blocks of the README, docs/ and weights/README.md from their commands.

A results block names its command, and holds that command's output verbatim:

    <!-- results: crossover: python -m minispec crossover --repeats 3 -->
    ```
    ...the output...
    ```
    <!-- /results -->

    python -m minispec.measure.readme --list             # every block: its file and command
    python -m minispec.measure.readme --only crossover   # rerun one block, wherever it is
    python -m minispec.measure.readme                    # rerun every block (hours)
    python -m minispec.measure.readme --file weights/README.md   # only that file's blocks

By default the blocks are those of README.md, docs/*.md and weights/README.md. A block is
addressed by its name alone, so names are unique across those files (a repeated name is an
error). Each command runs from the repository root with the interpreter running this script; a
block is rewritten only when its command succeeds, with the date and the machine's core count
added under it, so a stale figure is one command away from fresh. Timings still depend on the
machine and its load; counts (acceptance, tokens per call, p-values at a seed) do not.
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


def default_files(root: Path = ROOT) -> list[Path]:
    """The Markdown files whose blocks the tool keeps: README.md, docs/*.md, weights/README.md."""
    files = [root / "README.md", *sorted((root / "docs").glob("*.md")),
             root / "weights" / "README.md"]
    return [f for f in files if f.is_file()]


def blocks(text: str) -> list[tuple[str, str]]:
    """(name, command) of every results block, in order."""
    return [(m["name"], m["cmd"]) for m in BLOCK.finditer(text)]


def find(paths: list[Path]) -> list[tuple[Path, str, str]]:
    """(file, name, command) of every block in paths, in order; ValueError if a name repeats."""
    found: list[tuple[Path, str, str]] = []
    where: dict[str, Path] = {}
    for path in paths:
        for name, cmd in blocks(path.read_text(encoding="utf-8")):
            if name in where:
                raise ValueError(f"results block {name!r} is in {shown(where[name])} and in "
                                 f"{shown(path)}: names must be unique across the files")
            where[name] = path
            found.append((path, name, cmd))
    return found


def shown(path: Path) -> str:
    """path relative to the repository root where it lies under it."""
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


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


def regenerate(paths: list[Path], only: set[str] | None = None, runner=run_command) -> list[Path]:
    """Rewrite the selected blocks (every block when only is None) in place; the files written."""
    written = []
    for path in paths:
        text = path.read_text(encoding="utf-8")
        names = {name for name, _ in blocks(text)}
        if not names or (only is not None and not names & only):
            continue
        path.write_text(rewrite(text, only, runner), encoding="utf-8")
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m minispec.measure.readme",
                                 description="Rerun the commands behind the results blocks of "
                                 "README.md, docs/*.md and weights/README.md and rewrite them.")
    ap.add_argument("--file", help="only this Markdown file (default: README.md, docs/*.md and "
                    "weights/README.md)")
    ap.add_argument("--only", action="append", help="rerun only this block (repeatable)")
    ap.add_argument("--list", action="store_true", help="list the blocks, their files and commands")
    args = ap.parse_args(argv)
    paths = [Path(args.file)] if args.file else default_files()
    try:
        found = find(paths)
    except (OSError, ValueError) as e:
        print(f"readme: {e}", file=sys.stderr)
        return 2
    if args.list:
        for path, name, cmd in found:
            print(f"{shown(path)}: {name}: {cmd}")
        return 0
    unknown = set(args.only or ()) - {name for _, name, _ in found}
    if unknown:
        where = args.file or "README.md, docs/*.md or weights/README.md"
        print(f"readme: no block named {', '.join(sorted(unknown))} in {where}", file=sys.stderr)
        return 2
    regenerate(paths, set(args.only) if args.only else None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
