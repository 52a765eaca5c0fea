"""The Python package's layering: the GPU modules import one way (arrays <- device <- nccl <-
staging <- route), function-level imports included; no two modules of ringreduce import
each other in a circle at import time (module-level imports), nor through function-level
imports. Imports under
`if TYPE_CHECKING:` never run and are not counted."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parent.parent / "ringreduce"
GPU_ORDER = ["arrays", "device", "nccl", "staging", "route"]


def _module(path: Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _nodes(tree: ast.Module, top_only: bool) -> list[ast.AST]:
    """Import statements of a module: all of them, or those run at import time (module
    level, including under if/try), never those under `if TYPE_CHECKING:`."""
    out: list[ast.AST] = []

    def walk(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                out.append(node)
            elif isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                continue
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                if not top_only:
                    walk(node.body)
            else:
                for field in ("body", "orelse", "finalbody", "handlers"):
                    walk([n for n in getattr(node, field, []) if isinstance(n, ast.AST)])

    walk(tree.body)
    return out


def _imports(path: Path, top_only: bool) -> set[str]:
    """ringreduce modules `path` imports (relative imports resolved; `from pkg import mod`
    counts as mod when mod is a module)."""
    me = _module(path)
    pkg = me if path.name == "__init__.py" else me.rpartition(".")[0]
    found: set[str] = set()
    for node in _nodes(ast.parse(path.read_text()), top_only):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("ringreduce")}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg.split(".")
                base = base[:len(base) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            if not mod.startswith("ringreduce"):
                continue
            for a in node.names:
                sub = f"{mod}.{a.name}"
                target = PKG.parent / Path(*sub.split("."))
                found.add(sub if target.with_suffix(".py").exists() or target.is_dir() else mod)
    found.discard(me)
    return found


def _graph(top_only: bool) -> dict[str, set[str]]:
    mods = {_module(p): p for p in PKG.rglob("*.py")}
    return {m: {i for i in _imports(p, top_only) if i in mods} for m, p in mods.items()}


@pytest.mark.timeout(60)
def test_gpu_modules_import_one_way() -> None:
    g = _graph(top_only=False)
    for i, name in enumerate(GPU_ORDER):
        mine = {d.rpartition(".")[2] for d in g[f"ringreduce.gpu.{name}"]
                if d.startswith("ringreduce.gpu")}
        above = set(GPU_ORDER[i:]) | {"gpu"}
        assert not mine & above, f"ringreduce.gpu.{name} imports {sorted(mine & above)}"


def _cycle(g: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of graph g, or None. Package __init__ files import their own modules
    by design: edges from a package to its submodules are not cycles with them."""
    def edges(m: str) -> set[str]:
        return {d for d in g[m] if not d.startswith(m + ".")}

    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for d in sorted(edges(m)):
            if state.get(d) == 1:
                return stack[stack.index(d):] + [d]
            if d not in state and (found := visit(d)):
                return found
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(g):
        if m not in state and (found := visit(m)):
            return found
    return None


@pytest.mark.timeout(60)
def test_no_import_cycles() -> None:
    cycle = _cycle(_graph(top_only=True))
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


@pytest.mark.timeout(60)
def test_no_function_level_cycles() -> None:
    # Group.split / Group.destroy (the object in _state that users hold) reach
    # ringreduce.groups through _state.GROUP_OPS, which groups fills: no upward import.
    g = _graph(top_only=False)
    cycle = _cycle(g)
    assert cycle is None, "import cycle (function-level imports too): " + " -> ".join(cycle or [])
