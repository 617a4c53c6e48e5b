"""A version's per-file statistics and partition values, as readers of the layer use them.

delta-rs hands a version's add actions over as one Arrow table (``get_add_actions``): a
column per statistic (``min.<col>``, ``max.<col>``) and per partition column. Readers need
a few of them (the key columns and the vnode, to prune and seek); converting every statistic
of every file to Python would hold kilobytes per file (tens of MiB of the driver for a table
of many thousand files), so a statistic column is converted the first time a reader asks for it.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping

import pyarrow as pa


def partition_values(actions: pa.Table, logical: Mapping[str, str]) -> list[dict]:
    """Each file's typed partition values (logical column names), from delta-rs' actions."""
    columns = {logical.get(n[len("partition."):], n[len("partition."):]):
               actions.column(n).to_pylist()
               for n in actions.column_names if n.startswith("partition.")}
    return [{k: values[row] for k, values in columns.items()} for row in range(actions.num_rows)]


class StatColumns:
    """The min/max statistics of one version's files as delta-rs gives them (Arrow columns
    ``min.<col>`` / ``max.<col>``): a column becomes Python values the first time a reader
    asks for it, for all files at once."""

    def __init__(self, actions: pa.Table, logical: Mapping[str, str]) -> None:
        self._names: dict[tuple[str, str], str] = {}
        for name in actions.column_names:
            side, _, col = name.partition(".")
            if side in ("min", "max") and col:
                self._names[(side, logical.get(col, col))] = name
        self._table = actions.select(list(self._names.values()))
        self._values: dict[tuple[str, str], list] = {}
        self._lock = threading.Lock()

    def keys(self) -> list[tuple[str, str]]:
        return list(self._names)

    def value(self, key: tuple[str, str], row: int):
        """The statistic ``key`` = (side, column) of file ``row``; None when absent."""
        values = self._values.get(key)
        if values is None:
            name = self._names.get(key)
            if name is None:
                return None
            with self._lock:
                values = self._values.get(key)
                if values is None:
                    values = self._values[key] = self._table.column(name).to_pylist()
        return values[row]


class FileStats(Mapping):
    """One file's statistics, (side, column) -> value (None when the log has none), read from
    its version's `StatColumns` on demand."""

    __slots__ = ("_columns", "_row")

    def __init__(self, columns: StatColumns, row: int) -> None:
        self._columns, self._row = columns, row

    def __getitem__(self, key: tuple[str, str]):
        if key not in self._columns._names:
            raise KeyError(key)
        return self._columns.value(key, self._row)

    def get(self, key: tuple[str, str], default=None):
        value = self._columns.value(key, self._row)
        return default if value is None else value

    def __iter__(self):
        return iter(self._columns.keys())

    def __len__(self) -> int:
        return len(self._columns._names)
