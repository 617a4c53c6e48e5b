"""The docs name only what exists: every file path, dotted module (`backfill_assets.core.vnode`, or
`step.loop.run_step` relative to the package: its module and the name in it), `python -m` entry
point and `tests/...::test` the README and docs/*.md mention; and docs/ARCHITECTURE.md's map
lists every module of the package, resources/ and jobs/. docs/BENCHMARKS_HISTORY.md
is a record of past rounds, in the names of the code each round measured: it is not checked.
The docstrings and comments of the package, resources/, jobs/ and tests/ are held to the same
rule (issue 46), and none of them, nor a doc, names a module by a name it no longer has
(``FORMER_NAMES``). Text only: fast, no imports."""

from __future__ import annotations

import ast
import io
import pathlib
import re
import tokenize

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "backfill_assets"
DOCS = [ROOT / "README.md",
        *(p for p in sorted((ROOT / "docs").glob("*.md")) if p.name != "BENCHMARKS_HISTORY.md")]
# a relative path in the docs is relative to the repo, the package or its storage layer
BASES = (ROOT, PACKAGE, PACKAGE / "storage")
TOP = ("backfill_assets", "resources", "jobs", "tests", "benchmarks", "docs", "deploy")

PY_PATH = re.compile(r"(?<![\w/.-])((?:[\w-]+/)*\w+\.py)\b")
FOLDER_PATH = re.compile(r"(?<![\w/.:-])((?:backfill_assets|resources|jobs|tests|benchmarks|deploy)"
                         r"(?:/[\w.-]+)+)")
DOTTED = re.compile(r"(?<![\w./-])((?:backfill_assets|resources|jobs|tests|benchmarks)(?:\.\w+)+)")
TEST_ID = re.compile(r"(tests/[\w/]+\.py)::(\w+)")
# `step.loop.run_step`, `core.vnode`: a module of the package, then at most one name in it
LAYER_DOTTED = re.compile(r"`(?:backfill_assets\.)?((?:core|arrow|storage|engine|upstream|mv|step"
                          r"|testing|barrier|verify|wiring)(?:\.\w+)+)`")
RUN_MODULE = re.compile(r"python -m ((?:backfill_assets|resources|jobs|tests|benchmarks|docs)"
                        r"(?:\.\w+)+)")


# names modules had before they were renamed or folded (issues 39 and 46); a docstring, comment
# or doc that uses one points a reader at a module that does not exist
FORMER_NAMES = ("arrow_changes", "arrow_expr", "arrow_types", "bulk_write", "chunk_read",
                "chunk_reads", "delta_store", "errors_io", "mv_spark", "mv_store",
                "progress_view", "seek_reads", "shared_agree", "snapshot_read",
                "spark_delta_writer", "spark_ops", "step_changes", "step_chunks",
                "upstream_check", "upstream_dml", "upstream_layout", "upstream_spec",
                "upstream_values", "window_read", "window_spill")
FORMER = re.compile(r"(?<![\w/.-])(" + "|".join(FORMER_NAMES) + r")\b")
SOURCES = ("backfill_assets", "resources", "jobs", "tests")


def _text(doc: pathlib.Path) -> str:
    """The doc with paths a line break cut (`backfill_assets/` at a line's end) joined."""
    return _joined(doc.read_text())


def _joined(text: str) -> str:
    return re.sub(r"(\w/)[ \t]*\n[ \t>#]*(?=\w)", r"\1", text)


def _prose(path: pathlib.Path) -> str:
    """A module's docstrings and comments: the text in it written for a reader."""
    source = path.read_text()
    out = [ast.get_docstring(node, clean=False) or "" for node in ast.walk(ast.parse(source))
           if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
    out += [tok.string for tok in tokenize.generate_tokens(io.StringIO(source).readline)
            if tok.type == tokenize.COMMENT]
    return _joined("\n".join(out))


def _basenames() -> set[str]:
    return {p.name for top in TOP for p in (ROOT / top).rglob("*")}


def _module_file(dotted: str) -> pathlib.Path | None:
    """The file of the longest module prefix of ``dotted`` (the rest may be one attribute)."""
    parts = dotted.split(".")
    for n in range(len(parts), 0, -1):
        base = ROOT.joinpath(*parts[:n])
        for path in (base.with_suffix(".py"), base / "__init__.py"):
            if path.exists():
                return path if n >= len(parts) - 1 else None
    return None


def _defined(path: pathlib.Path) -> set[str]:
    """The names a module binds anywhere (functions, classes, assignments, imports)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            found.add(node.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            found.update((a.asname or a.name).split(".")[0] for a in node.names)
    return found


def _layer_name_dead(dotted: str) -> bool:
    """``dotted`` (relative to the package) is not a module, or a module and a name it lacks
    (an attribute of that name, ``TableVersion.load``, is not checked)."""
    parts = dotted.split(".")
    for n in range(len(parts), 0, -1):
        base = PACKAGE.joinpath(*parts[:n])
        for path in (base.with_suffix(".py"), base / "__init__.py"):
            if path.exists():
                return n < len(parts) and parts[n] not in _defined(path)
    return True


def _dead_in(doc: pathlib.Path, names: set[str], text: str | None = None) -> list[str]:
    text = _text(doc) if text is None else text
    dead = [p for p in PY_PATH.findall(text)
            if not (any((b / p).exists() for b in BASES) if "/" in p else p in names)]
    dead += [p for p in FOLDER_PATH.findall(text) if not (ROOT / p.rstrip(".")).exists()]
    dead += [d for d in DOTTED.findall(text) if _module_file(d) is None]
    dead += [d for d in LAYER_DOTTED.findall(text) if _layer_name_dead(d)]
    dead += [f"{path}::{test}" for path, test in TEST_ID.findall(text)
             if (ROOT / path).exists()
             and not re.search(rf"def {test}\b", (ROOT / path).read_text())]
    dead += [f"python -m {m} (no __main__)" for m in RUN_MODULE.findall(text)
             if (f := _module_file(m)) is not None and f.name != "__main__.py"
             and "__main__" not in f.read_text()]
    return [f"{doc.relative_to(ROOT)}: {d}" for d in sorted(set(dead))]


def test_the_docs_name_only_paths_and_modules_that_exist():
    names = _basenames()
    dead = [d for doc in DOCS for d in _dead_in(doc, names)]
    assert not dead, "\n".join(dead)


def test_docstrings_and_comments_name_only_paths_and_modules_that_exist():
    names = _basenames()
    dead = [d for top in SOURCES for path in sorted((ROOT / top).rglob("*.py"))
            for d in _dead_in(path, names, _prose(path))]
    assert not dead, "\n".join(dead)


def test_no_module_is_named_by_a_name_it_no_longer_has():
    texts = {doc: _text(doc) for doc in DOCS}
    texts.update({path: _prose(path) for top in SOURCES for path in (ROOT / top).rglob("*.py")})
    found = sorted(f"{path.relative_to(ROOT)}: {m.group(1)}" for path, text in texts.items()
                   for m in FORMER.finditer(text))
    assert not found, "former module names (say the module's name now):\n" + "\n".join(found)


def map_entries(doc: pathlib.Path = ROOT / "docs" / "ARCHITECTURE.md") -> list[str]:
    """The files docs/ARCHITECTURE.md's folder map names, as paths: a folder (``name/``)
    opens where a line starts with it and holds the modules named on the lines below it that
    are indented further; a module at the start of a line closes the folders it is not
    indented under."""
    block = doc.read_text().split("## Folders and modules", 1)[1].split("```")[1]
    stack: list[tuple[int, str]] = []
    found = []
    for line in block.splitlines():
        stripped = line.lstrip()
        indent = len(line) - len(stripped)
        first = stripped.split(" ", 1)[0]
        if first.endswith("/") or first.endswith(".py"):
            while stack and stack[-1][0] >= indent:
                stack.pop()
        if first.endswith("/"):
            stack.append((indent, first))
        folder = "".join(name for _, name in stack)
        found += [folder + m for m in re.findall(r"(?<![\w/.])(\w+\.py)\b", stripped)]
    return found


def _resolved(entry: str) -> pathlib.Path | None:
    """A map entry is relative to the package, or to the repo (resources/, jobs/, ...)."""
    for base in (PACKAGE, ROOT):
        if (base / entry).is_file():
            return base / entry
    return None


def _docstring_only(path: pathlib.Path) -> bool:
    """A package's ``__init__.py`` that only says what its folder holds (the folder's line in
    the map says it too)."""
    body = ast.parse(path.read_text()).body
    return path.name == "__init__.py" and all(
        isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) for node in body)


def test_the_architecture_map_lists_every_module():
    entries = map_entries()
    dead = [e for e in entries if _resolved(e) is None]
    assert not dead, "named in docs/ARCHITECTURE.md's map, not there:\n" + "\n".join(dead)
    listed = {_resolved(e) for e in entries}
    missing = sorted(str(p.relative_to(ROOT))
                     for top in ("backfill_assets", "resources", "jobs")
                     for p in (ROOT / top).rglob("*.py")
                     if p not in listed and not _docstring_only(p))
    assert not missing, "add to docs/ARCHITECTURE.md's map:\n" + "\n".join(missing)
