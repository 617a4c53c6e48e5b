"""The core stays pure: no Dagster, Spark, Delta or Arrow import, statically or at runtime."""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

import backfill_assets.core as core

FORBIDDEN = ("dagster", "pyspark", "deltalake", "pyarrow", "pandas", "numpy")
CORE_DIR = pathlib.Path(core.__file__).parent
MODULES = sorted(CORE_DIR.glob("*.py"))


def imported_roots(path: pathlib.Path) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            roots |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
    return roots


def test_every_core_module_is_scanned() -> None:
    names = {p.stem for p in MODULES}
    assert {"errors", "keys", "progress", "codec", "changes", "positions", "planning",
            "mv_definition"} <= names


def test_no_module_imports_a_forbidden_package() -> None:
    offenders = {
        p.name: sorted(imported_roots(p) & set(FORBIDDEN))
        for p in MODULES
        if imported_roots(p) & set(FORBIDDEN)
    }
    assert offenders == {}


def test_importing_the_core_loads_no_forbidden_package() -> None:
    mods = ", ".join(f"backfill_assets.core.{p.stem}" for p in MODULES if p.stem != "__init__")
    code = (
        f"import sys, importlib\n"
        f"for m in '{mods}'.split(', '): importlib.import_module(m)\n"
        f"print(','.join(sorted(m for m in sys.modules if m.split('.')[0] in {FORBIDDEN!r})))"
    )
    repo_root = CORE_DIR.parent.parent  # python -c puts the cwd first on sys.path
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=repo_root)
    assert out.stdout.strip() == ""


def test_scanner_sees_forbidden_imports(tmp_path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("import pyspark.sql\nfrom deltalake import DeltaTable\nfrom . import x\n")
    assert imported_roots(bad) == {"pyspark", "deltalake"}
