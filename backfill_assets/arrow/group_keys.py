"""An aggregate's group keys over Arrow columns: their canonical texts (core/vnode.py's
`canonical_value_text`), the JSON list of them that keys the aggregate's tables, and their
vnodes (core/aggregates.py `group_vnode`), a column at a time.

Why: a barrier keys every change row and every touched group this way, and a value at a time
in Python costs more than the aggregation itself. Only the types whose Arrow text is the
canonical one are done here (integers, strings, dates of four-digit years); for any other
type, and any string holding a control character (JSON escapes those in several ways), the
callers go a value at a time, with the same result.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence

import pyarrow as pa
import pyarrow.compute as pc

from backfill_assets.core.aggregates import group_vnode
from backfill_assets.core.vnode import SEPARATOR, check_vnode_count

_FIRST_DAY, _LAST_DAY = -354285, 2932896  # 1000-01-01 and 9999-12-31, days since 1970


def canonical_texts(column: pa.Array | pa.ChunkedArray, type_name: str) -> pa.Array | None:
    """Each value's canonical text (null stays null), or None where Arrow's text is not
    proven to be the canonical one."""
    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    t = type_name.strip().lower()  # any other spelling goes a value at a time
    if t in ("int", "bigint") and pa.types.is_integer(array.type):
        return pc.cast(array, pa.string())
    if t == "string" and pa.types.is_string(array.type):
        return array
    if t == "date" and pa.types.is_date32(array.type):
        days = pc.min_max(pc.cast(array, pa.int32())).as_py()
        if days["min"] is not None and (days["min"] < _FIRST_DAY or days["max"] > _LAST_DAY):
            return None
        # four-digit years (checked above): Arrow's cast writes yyyy-MM-dd in one kernel,
        # cheaper than joining the parts or strftime
        return pc.cast(array, pa.string())
    return None


def plain_text(type_name: str) -> bool:
    """Whether every canonical text of the type is free of what JSON escapes (an integer's
    or a date's digits and dashes): its texts need no scan for quotes or control characters."""
    return type_name.strip().lower() in ("int", "bigint", "date")


def json_lists(texts: Sequence[pa.Array], rows: int, plain: Sequence[bool] = ()
               ) -> pa.Array | None:
    """The JSON list of each row's texts as `json.dumps(..., ensure_ascii=False)` writes it
    (a null as JSON null), or None when a text holds a control character. ``plain[i]``: the
    i-th texts are known to need no escaping (`plain_text`), so they are not scanned."""
    if not texts:
        return pa.array(["[]"] * rows, pa.string())
    escaped = []
    for i, t in enumerate(texts):
        if i < len(plain) and plain[i]:
            escaped.append(t)
            continue
        if pc.any(pc.match_substring_regex(t, '[\\x00-\\x1f"\\\\]')).as_py():  # rare: one scan
            if pc.any(pc.match_substring_regex(t, "[\\x00-\\x1f]")).as_py():
                return None
            t = pc.replace_substring(pc.replace_substring(t, "\\", "\\\\"), '"', '\\"')
        escaped.append(t)
    if not any(t.null_count for t in escaped):  # one join: a quarter of joining per column
        pieces: list[object] = ['["']
        for t in escaped:
            pieces += [t, '", "']
        return pc.binary_join_element_wise(*pieces[:-1], '"]', "")
    parts = [pc.fill_null(pc.binary_join_element_wise('"', t, '"', ""), "null")
             for t in escaped]
    inner = parts[0] if len(parts) == 1 else pc.binary_join_element_wise(*parts, ", ")
    return pc.binary_join_element_wise("[", inner, "]", "")


def text_vnodes(texts: Sequence[pa.Array], rows: int, vnode_count: int) -> pa.Array:
    """The vnode of each row's group from its columns' canonical texts: joined by the key
    separator, a null as the empty text, hashed as `group_vnode` hashes."""
    check_vnode_count(vnode_count)
    filled = [pc.fill_null(t, "") for t in texts]
    joined = filled[0] if len(filled) == 1 else pc.binary_join_element_wise(*filled, SEPARATOR)
    if not filled:
        joined = pa.array([""] * rows, pa.string())
    return pa.array([zlib.crc32(s.encode("utf-8")) % vnode_count for s in joined.to_pylist()],
                    pa.int32())


def group_vnodes(columns: Sequence[pa.Array | pa.ChunkedArray], types: Sequence[str],
                 vnode_count: int) -> pa.Array:
    """The vnode of each row's group given its group columns: a column at a time where Arrow
    gives the canonical texts, else a row at a time (`core.aggregates.group_vnode`)."""
    rows = len(columns[0]) if columns else 0
    texts = [canonical_texts(c, t) for c, t in zip(columns, types, strict=True)]
    if all(t is not None for t in texts):
        return text_vnodes(texts, rows, vnode_count)  # type: ignore[arg-type]
    keys = zip(*(c.to_pylist() for c in columns), strict=True)
    return pa.array([group_vnode(k, types, vnode_count) for k in keys], pa.int32())
