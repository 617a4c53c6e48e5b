"""`benchmarks/` sits above everything: it measures the product and may import any of it, but
nothing imports it. A test that needed a benchmark's helper would make the suite depend on a
script that is only run by hand (and a change to a benchmark could then break `make test`);
product code that needed one would ship the lab with the platform. What both need lives in the
product (the load generator, `jobs/dagster_dev.py`, `verify/scale_check.py`) or in tests/."""

from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]
IMPORTERS = ("backfill_assets", "resources", "jobs", "tests", "docs")


def _imported_modules(path: pathlib.Path) -> list[str]:
    """Every module an import statement of ``path`` names, wherever it stands."""
    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.append(node.module)
    return names


def _benchmark_imports() -> list[str]:
    return [f"{path.relative_to(ROOT)} imports {name}"
            for folder in IMPORTERS for path in sorted((ROOT / folder).rglob("*.py"))
            for name in _imported_modules(path)
            if name == "benchmarks" or name.startswith("benchmarks.")]


def test_nothing_imports_benchmarks():
    wrong = _benchmark_imports()
    assert not wrong, ("move what these need into the product or tests/:\n"
                       + "\n".join(wrong))


def test_the_check_sees_an_import(tmp_path):
    """The walk would find one (a check that can never fail checks nothing)."""
    probe = tmp_path / "probe.py"
    probe.write_text("def f():\n    from benchmarks.common import human_rows\n", encoding="utf-8")
    assert _imported_modules(probe) == ["benchmarks.common"]
