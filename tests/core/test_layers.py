"""The folders are the layers: every import (at module level, inside a function or under
TYPE_CHECKING) goes to the same layer or one below, and no modules import each other in a
circle. The order, lowest first, is the map in docs/ARCHITECTURE.md."""

from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGES = ("backfill_assets", "resources", "jobs")

# lowest first; a module belongs to the longest prefix that names it
LAYERS: tuple[str, ...] = (
    "backfill_assets.__init__",  # the package itself: process settings read before pyarrow loads
    "backfill_assets.core",
    "backfill_assets.arrow",
    "backfill_assets.storage.store",
    "backfill_assets.storage.delta",
    "backfill_assets.storage.rows",
    "backfill_assets.storage.chunks",
    "backfill_assets.storage.writes",
    "backfill_assets.storage",
    "backfill_assets.engine",
    "backfill_assets.upstream",
    "backfill_assets.mv",
    "backfill_assets.step",
    "backfill_assets.testing",  # hooks only the tests set (the kill hook)
    "backfill_assets.barrier",  # what runs a barrier's steps: pacing, by cost, follower
    "backfill_assets.verify",  # the independent oracle
    "resources",
    "backfill_assets.wiring",
    "jobs",
    "backfill_assets.definitions",
    # entry points: the demo and the dev server load the whole code location
    "jobs.demo",
    "jobs.demo_cluster",
)


def module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, pathlib.Path]:
    return {module_name(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}


def imports_of(name: str, path: pathlib.Path, known: set[str]) -> set[str]:
    """Every project module ``name`` imports, wherever the import statement stands."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            targets = [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def layer_of(name: str) -> int:
    if name in PACKAGES:
        return LAYERS.index(f"{name}.__init__") if f"{name}.__init__" in LAYERS else 0
    best = max((p for p in LAYERS if name == p or name.startswith(p + ".")), key=len,
               default=None)
    assert best is not None, f"{name} is in no layer: add its folder to LAYERS"
    return LAYERS.index(best)


def graph() -> dict[str, set[str]]:
    mods = modules()
    known = set(mods)
    return {name: imports_of(name, path, known) for name, path in mods.items()}


def test_imports_only_go_down():
    wrong = [f"{a} ({LAYERS[layer_of(a)]}) imports {b} ({LAYERS[layer_of(b)]})"
             for a, targets in graph().items() for b in targets if layer_of(b) > layer_of(a)]
    assert not wrong, "imports that go up a layer:\n" + "\n".join(sorted(wrong))


def test_no_import_cycles():
    edges = graph()
    state: dict[str, int] = {}  # 1 on the path, 2 done
    cycles: list[list[str]] = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(edges[node]):
            if state.get(nxt) == 1:
                cycles.append(path[path.index(nxt):] + [nxt] if nxt in path else [node, nxt])
            elif nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = 2

    for start in sorted(edges):
        if start not in state:
            visit(start, [start])
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_every_module_has_a_layer():
    for name in modules():
        layer_of(name)
