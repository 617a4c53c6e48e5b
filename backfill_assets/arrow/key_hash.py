"""The platform's key hash (core/vnode.py: CRC-32 of the key's canonical text, modulo the
vnode count) over Arrow columns, a column at a time.

Why: a join barrier hashes every index row it writes (the join key's vnode), every dimension
key it reads and every joined row it hands to the aggregate (the fact pk's vnode), tens of
thousands of keys per barrier; a value at a time in Python (`core.vnode.vnodes_of`) cost
about a tenth of a 0.1% fact barrier's join at 20M orders. Here the texts are Arrow's
(`arrow.group_keys.canonical_texts`: only the types whose Arrow text is the canonical one)
and the CRC runs over all keys at once, one byte position at a time (zlib's CRC-32, table
driven, in numpy). Where a type is not covered, or a key holds a null, the callers hash a
value at a time, with the same result.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from backfill_assets.arrow.group_keys import canonical_texts
from backfill_assets.core.vnode import SEPARATOR, check_vnode_count

_LONGEST = 64  # texts longer than this are hashed a value at a time (each byte is one pass)


def _crc_table() -> np.ndarray:
    """zlib's CRC-32 table (reflected polynomial 0xEDB88320)."""
    table = np.arange(256, dtype=np.uint32)
    for _ in range(8):
        table = np.where(table & 1, (table >> 1) ^ np.uint32(0xEDB88320), table >> 1)
    return table.astype(np.uint32)


_TABLE = _crc_table()


def crc32_texts(texts: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """``zlib.crc32`` of each text's UTF-8 bytes (no null among ``texts``), as uint32."""
    array = texts.combine_chunks() if isinstance(texts, pa.ChunkedArray) else texts
    array = array.cast(pa.large_string())
    n = len(array)
    if n == 0:
        return np.zeros(0, np.uint32)
    offsets = np.frombuffer(array.buffers()[1], np.int64)[array.offset:array.offset + n + 1]
    data = np.frombuffer(array.buffers()[2], np.uint8) if array.buffers()[2] is not None \
        else np.zeros(0, np.uint8)
    starts, lengths = offsets[:-1], np.diff(offsets)
    if int(lengths.max()) > _LONGEST:
        return np.array([zlib.crc32(s.encode("utf-8")) for s in array.to_pylist()], np.uint32)
    crc = np.full(n, 0xFFFFFFFF, np.uint32)
    for j in range(int(lengths.max())):
        at = np.nonzero(lengths > j)[0]
        c = crc[at]
        crc[at] = _TABLE[(c ^ data[starts[at] + j]) & 0xFF] ^ (c >> np.uint32(8))
    return crc ^ np.uint32(0xFFFFFFFF)


def key_vnodes(columns: Sequence[pa.Array | pa.ChunkedArray], types: Sequence[str],
               vnode_count: int) -> pa.Array | None:
    """Each row's vnode of the key ``columns`` (of the platform ``types``), as
    `core.vnode.vnodes_of` gives it; None where a type's Arrow text is not proven canonical
    or a value is null (the caller hashes a value at a time: same result, or its refusal)."""
    check_vnode_count(vnode_count)
    if not columns or any(c.null_count for c in columns):
        return None
    texts = [canonical_texts(c, t) for c, t in zip(columns, types, strict=True)]
    if any(t is None for t in texts):
        return None
    joined = texts[0] if len(texts) == 1 else pc.binary_join_element_wise(*texts, SEPARATOR)
    vnodes = crc32_texts(joined) % np.uint32(vnode_count)
    return pa.array(vnodes.astype(np.int32), pa.int32())
