"""The lesson reads alone: minispec/core/ and what its imports reach, followed all the way.

The README's "Read the code" lists the core's files; a reader following their imports must meet
the forward pass, sampling, verify, the drafter contract and the round, and the input/output
modules under them (config, loader, tokenizer, safetensors, backend), never trees, batches, the
other drafters, CUDA graphs, the judge, the benchmarks, the command line, the real-model tier or
the converter. Those extend the core from outside.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "minispec"
CORE = sorted((PACKAGE / "core").glob("*.py"))
# what the core may reach: itself, the package's __init__, and the layer below it
ALLOWED = {"minispec", "minispec.core", "minispec.backend", "minispec.config", "minispec.errors",
           "minispec.kernels",  # backend.matmul's loops (imported on the first product)
           "minispec.rope_scaling",
           "minispec.loader", "minispec.safetensors", "minispec.shipped", "minispec.tokenizer"}
ALLOWED |= {f"minispec.core.{f.stem}" for f in CORE if f.stem != "__init__"}


def module_file(name: str) -> Path | None:
    """The source file of a minispec module (a package's __init__.py), or None."""
    path = ROOT.joinpath(*name.split("."))
    if path.is_dir():
        return path / "__init__.py"
    return path.with_suffix(".py") if path.with_suffix(".py").exists() else None


def imports_of(name: str) -> set[str]:
    """Every minispec module that module `name` imports, anywhere in the file (functions
    included), with the packages above each (importing a.b.c runs a and a.b first)."""
    path = module_file(name)
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module
            found.add(target)
            found |= {f"{target}.{a.name}" for a in node.names}  # `from pkg import module`
    reached = set()
    for mod in found:
        if mod.split(".")[0] != "minispec":
            continue
        parts = mod.split(".")
        reached |= {".".join(parts[:i]) for i in range(1, len(parts) + 1)}
    return {m for m in reached if module_file(m) is not None}


def reach(start: set[str]) -> set[str]:
    seen, todo = set(), list(start)
    while todo:
        mod = todo.pop()
        if mod not in seen:
            seen.add(mod)
            todo += imports_of(mod)
    return seen


def test_the_core_imports_nothing_above_it():
    reached = reach({f"minispec.core.{f.stem}" for f in CORE if f.stem != "__init__"}
                    | {"minispec.core"})
    assert reached - ALLOWED == set()
    # and the rule can fail: a module above the core reaches what the core must not
    assert {"minispec.tree", "minispec.core.speculative"} <= reach({"minispec.batch"})


def test_importing_the_core_loads_nothing_above_it():
    code = ("import sys, minispec.core.speculative, minispec.core.drafter; "
            "print(' '.join(sorted(m for m in sys.modules if m.startswith('minispec'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=ROOT).stdout.split()
    assert set(out) <= ALLOWED, set(out) - ALLOWED
    assert "minispec.core.verify" in out


@pytest.mark.parametrize("path", CORE, ids=lambda p: p.name)
def test_core_functions_fit_on_a_screen(path):
    tree = ast.parse(path.read_text())
    long = [(n.name, n.end_lineno - n.lineno + 1) for n in ast.walk(tree)
            if isinstance(n, ast.FunctionDef) and n.end_lineno - n.lineno + 1 > 60]
    assert long == []
