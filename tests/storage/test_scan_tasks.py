"""How a scan spreads a table's files over Spark tasks (no Spark: the packing is pure)."""

from __future__ import annotations

from hypothesis import example, given
from hypothesis import strategies as st

from backfill_assets.storage.rows import scan

_rows = st.lists(st.integers(min_value=0, max_value=3 * scan.READ_TASK_ROWS), min_size=1,
                 max_size=300)


def _entries(rows: list[int]) -> list[dict]:
    return [{"path": f"f{i}", "rows": n} for i, n in enumerate(rows)]


def _check_partition(entries: list[dict], tasks: list[list[dict]], min_tasks: int) -> None:
    paths = sorted(e["path"] for t in tasks for e in t)
    assert paths == sorted(e["path"] for e in entries)  # every file once, none invented
    assert all(tasks)
    total = sum(e["rows"] for e in entries)
    assert len(tasks) <= max(min_tasks, -(-total // scan.READ_TASK_ROWS), 1)
    assert len(tasks) >= min(len(entries), min_tasks)


@given(_rows, st.integers(min_value=1, max_value=8))
@example([0, 0, 2 * scan.READ_TASK_ROWS + 1], 1)  # CI found it: empty files, three tasks
def test_pack_reads_every_file_once_in_few_balanced_tasks(rows, min_tasks):
    entries = _entries(rows)
    tasks = scan.pack(entries, min_tasks)
    _check_partition(entries, tasks, min_tasks)
    held = [sum(e["rows"] for e in t) for t in tasks]
    # largest-first into the lightest task: no task exceeds the mean by more than one file
    assert max(held) <= sum(held) / len(held) + max(rows)


@given(_rows, st.integers(min_value=1, max_value=8))
def test_pack_in_order_keeps_the_files_order(rows, min_tasks):
    entries = _entries(rows)
    tasks = scan.pack_in_order(entries, min_tasks)
    assert [e["path"] for t in tasks for e in t] == [e["path"] for e in entries]
    assert all(tasks)
    assert len(tasks) <= max(1, min(len(entries), scan.MAX_READ_TASKS,
                                    max(min_tasks, -(-sum(rows) // scan.READ_TASK_ROWS))))


def test_files_without_rows_do_not_make_a_task_each():
    entries = _entries([0] * 40)
    assert len(scan.pack_in_order(entries, 4)) == 4
    assert len(scan.pack(entries, 4)) == 4


def test_many_small_files_share_a_few_tasks():
    """768 files of 6.5k rows (a 5M-row vnode-partitioned upstream): 5 tasks, not 768."""
    entries = _entries([6510] * 768)
    assert len(scan.pack(entries, 4)) == 5
    assert len(scan.pack_in_order(entries, 4)) == 5
