"""The results files in the tree are the ones the docs cite for a current figure, and nothing
names a results file that is gone (issue 46: the lab notebook out). A round's other files stay
in git history, where docs/BENCHMARKS_HISTORY.md points. Text only: fast, no imports."""

from __future__ import annotations

import pathlib
import re
import subprocess

ROOT = pathlib.Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# where a results file could be named: the docs, the Makefile and every Python source
SOURCES = [*DOCS, ROOT / "Makefile",
           *(p for top in ("backfill_assets", "benchmarks", "jobs", "resources", "tests")
             for p in sorted((ROOT / top).rglob("*.py")))]
# a results file of a measured round: its name carries the round (`_round22_`, `_r28b`); the
# default outputs of the make targets (`bulk.json`, `*_quick.json`) carry none and are written
# by whoever runs them
ROUND_FILE = re.compile(r"(?<![\w.-])([\w-]*(?:round\d+|_r\d+[a-z]?)(?![\d])[\w-]*"
                        r"\.(?:json|log|txt))\b")


def _tracked_results() -> list[str]:
    """The results files in the tree (git's list; the folder's, outside a checkout)."""
    try:
        out = subprocess.run(["git", "ls-files", "-z", "benchmarks/results"], cwd=ROOT,
                             capture_output=True, check=True, timeout=60).stdout
        names = [pathlib.PurePosixPath(p).name for p in out.decode().split("\0") if p]
    except (OSError, subprocess.SubprocessError):
        names = []
    return names or sorted(p.name for p in RESULTS.iterdir() if p.is_file())


def _cited(paths: list[pathlib.Path]) -> dict[str, list[str]]:
    """Round results file name -> the files that name it."""
    found: dict[str, list[str]] = {}
    for path in paths:
        for name in ROUND_FILE.findall(path.read_text(encoding="utf-8")):
            found.setdefault(name, []).append(str(path.relative_to(ROOT)))
    return found


def test_every_results_file_in_the_tree_is_cited_by_a_doc():
    text = "\n".join(doc.read_text(encoding="utf-8") for doc in DOCS)
    uncited = [name for name in _tracked_results() if name not in text]
    assert not uncited, ("results files no doc cites for a current figure (git keeps them; "
                         "remove them from the tree or cite them):\n" + "\n".join(uncited))


def test_no_doc_or_script_names_a_results_file_that_is_gone():
    missing = {name: where for name, where in _cited(SOURCES).items()
               if not (RESULTS / name).exists()}
    assert not missing, "\n".join(f"{n} (named in {', '.join(sorted(set(w)))})"
                                  for n, w in sorted(missing.items()))


def test_the_pattern_finds_round_files_and_skips_default_outputs():
    text = ("`bulk_round22_100M.json`, vs_baselines_100M_r28b.log and, from make, bulk.json, "
            "bulk_quick.json, crossover_5M.json")
    assert ROUND_FILE.findall(text) == ["bulk_round22_100M.json", "vs_baselines_100M_r28b.log"]
