"""The folders are the layers: every import (at module level, inside a function or under
TYPE_CHECKING) goes to the same layer or one below, and no modules import each other in a
circle. The order, lowest first, is the map in docs/ARCHITECTURE.md. A layer with a door
(``DOORS``) is entered only through it: code outside imports the door module alone, and the
door's ``__all__`` names everything it hands out."""

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
    "backfill_assets.aggregate",  # the aggregate MV's barrier, beside the step loop
    "backfill_assets.join",  # the join MV's barrier, beside the step loop
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


# a layer entered only through its package (``__init__``), which re-exports what the code above
# it needs, with ``__all__``
DOORS = ("backfill_assets.storage", "backfill_assets.upstream", "backfill_assets.upstream.writer")
# tests of a door's inside, beside its own folder of tests: they reach what no caller may
# (monkeypatched internals, the raw change-feed reader, log entries written by hand)
INSIDE_TESTS = {
    "backfill_assets.storage": ("tests.storage", "tests.test_chunk_seek", "tests.test_settings",
                                "tests.test_change_feed", "tests.test_foreign_upstreams"),
    "backfill_assets.upstream": (),
    "backfill_assets.upstream.writer": (),
}


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


def _inside(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def _door_entries() -> dict[str, list[tuple[str, set[str]]]]:
    """Per door: each module outside it (package, resources, jobs, tests) with the names it
    imports from the door, and the modules behind the door it imports (none allowed)."""
    mods = {**modules(), **{module_name(p): p for p in (ROOT / "tests").rglob("*.py")}}
    known = set(mods)
    found: dict[str, list[tuple[str, set[str]]]] = {door: [] for door in DOORS}
    for name, path in mods.items():
        for door in DOORS:
            if _inside(name, door) or any(_inside(name, t) for t in INSIDE_TESTS[door]):
                continue
            behind = {t for t in imports_of(name, path, known)
                      if _inside(t, door) and t != door and t not in DOORS}  # a door within
            found[door].append((name, behind))
    return found


def test_a_door_is_the_only_way_into_its_layer():
    wrong = [f"{name} imports {t} (use {door})" for door, entries in _door_entries().items()
             for name, behind in entries for t in sorted(behind)]
    assert not wrong, "imports past a layer's door:\n" + "\n".join(sorted(wrong))


def _names_from(module: str) -> set[str]:
    """Every name imported ``from module import ...`` anywhere outside it."""
    mods = {**modules(), **{module_name(p): p for p in (ROOT / "tests").rglob("*.py")}}
    out = set()
    for name, path in mods.items():
        if _inside(name, module):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == module and not node.level:
                out.update(a.name for a in node.names)
    return out


def _all_of(path: pathlib.Path) -> list[str]:
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            return [ast.literal_eval(e) for e in node.value.elts]
    raise AssertionError(f"{path} has no __all__: a door lists what it hands out")


def test_each_door_lists_what_it_hands_out():
    for door in DOORS:
        path = ROOT.joinpath(*door.split(".")) / "__init__.py"
        listed = _all_of(path)
        bound = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                bound.add(node.name)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                bound.update((a.asname or a.name).split(".")[0] for a in node.names)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                bound.add(node.id)
        assert len(listed) == len(set(listed)), f"{door}.__all__ lists a name twice"
        assert not set(listed) - bound, f"{door}.__all__ names what it lacks: {set(listed) - bound}"
        unlisted = _names_from(door) - set(listed)
        assert not unlisted, f"imported from {door} but not in its __all__: {sorted(unlisted)}"
