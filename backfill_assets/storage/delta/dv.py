"""Deletion vectors: the bytes Delta readers accept (the layout Databricks writes).

A DV file ``[<prefix>/]deletion_vector_<uuid>.bin`` is one version byte (1) followed by DVs:
``uint32 BE size | uint32 LE magic | RoaringTreemap (portable) | uint32 BE CRC-32`` where size
covers magic + bitmap and the CRC too. A descriptor (the ``deletionVector`` of an ``add``)
points at one DV: ``storageType`` 'u' (UUID-named file relative to the table, path = prefix +
Z85 of the UUID), 'p' (absolute path) or 'i' (inline, Z85 of magic + bitmap, ``sizeInBytes``
of any length: ``z85_decode`` reads both writers' padding), as the Delta protocol's "Deletion
Vectors" section lays them out. ``load`` reads one descriptor's rows from the store. Tests:
tests/storage/test_dv_codec.py, tests/interop/test_inline_dvs.py.
"""

from __future__ import annotations

import struct
import uuid
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from pyroaring import BitMap64

from backfill_assets.storage.store import objects

MAGIC = 1681511377
FORMAT_VERSION = 1
Z85 = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"
_Z85_INDEX = {c: i for i, c in enumerate(Z85)}


class DeletionVectorCorrupt(ValueError):
    """A DV's bytes do not match its descriptor (CRC, magic or size)."""


def z85_encode(data: bytes) -> str:
    """Delta's ``Base85Codec.encodeBytes``: bytes of any length, unaligned ones padded with zero
    bytes to a multiple of 4 (a reader keeps ``sizeInBytes`` of them). Delta-Spark, Delta Kernel
    and delta-kernel-rs all read this form; the '#' tail below only the last one reads."""
    padded = data + bytes(-len(data) % 4)
    out = []
    for (word,) in struct.iter_unpack(">I", padded):
        chars = []
        for _ in range(5):
            word, r = divmod(word, 85)
            chars.append(Z85[r])
        out.extend(reversed(chars))
    return "".join(out)


def z85_decode(text: str, size: int | None = None) -> bytes:
    """The bytes of Z85 ``text``, the first ``size`` of them when given (every byte otherwise).

    Two writers' forms of an unaligned payload both decode here. Delta's codec pads the bytes
    with zeros to a multiple of 4 and the reader truncates to ``sizeInBytes``. The z85 crate
    (delta-kernel-rs, and the writer of kernel-rs' ``cdf-table-with-dv``) right-aligns a short
    tail in its last group and turns that group's leading '0's into '#', one per missing byte:
    a group no plain Z85 text can start with, since 84 * 85^4 is past 2^32. So a last group
    that starts with '#' is a tail, never a value to wrap modulo 2^32.
    """
    if len(text) % 5:
        raise DeletionVectorCorrupt(f"Z85 text of {len(text)} characters (not groups of 5)")
    out = bytearray()
    for start in range(0, len(text), 5):
        group = text[start:start + 5]
        missing = len(group) - len(group.lstrip("#"))
        if missing and (missing > 3 or start + 5 != len(text)):
            raise DeletionVectorCorrupt(f"Z85 padding '{group}' outside a last group's tail")
        word = 0
        for c in "0" * missing + group[missing:]:
            if c not in _Z85_INDEX:
                raise DeletionVectorCorrupt(f"{c!r} is not a Z85 character")
            word = word * 85 + _Z85_INDEX[c]
        if word >= 1 << 8 * (4 - missing):
            raise DeletionVectorCorrupt(f"Z85 group '{group}' holds more than {4 - missing} bytes")
        out += word.to_bytes(4, "big")[missing:]
    if size is None:
        return bytes(out)
    if len(out) < size:
        raise DeletionVectorCorrupt(f"inline DV of {len(out)} bytes, descriptor says {size}")
    return bytes(out[:size])


def unique_id(descriptor: Mapping | None) -> str | None:
    """The DV part of a logical file's identity (path, DV id) in the log."""
    if not descriptor:
        return None
    offset = descriptor.get("offset")
    base = f"{descriptor['storageType']}{descriptor['pathOrInlineDv']}"
    return f"{base}@{offset}" if offset is not None else base


def relative_path(descriptor: Mapping) -> str | None:
    """The DV file of a 'u' descriptor, relative to the table root (None for 'i'/'p')."""
    if descriptor["storageType"] != "u":
        return None
    text = descriptor["pathOrInlineDv"]
    prefix, encoded = text[:-20], text[-20:]
    name = f"deletion_vector_{uuid.UUID(bytes=z85_decode(encoded))}.bin"
    return f"{prefix}/{name}" if prefix else name


def file_span(descriptor: Mapping) -> tuple[int, int]:
    """(offset, bytes) of a stored DV inside its file: size field, payload and CRC."""
    return int(descriptor.get("offset") or 1), 4 + int(descriptor["sizeInBytes"]) + 4


def decode_stored(raw: bytes, descriptor: Mapping) -> BitMap64:
    """The deleted row indexes of a stored DV (the bytes ``file_span`` names)."""
    (size,) = struct.unpack(">I", raw[:4])
    if size != int(descriptor["sizeInBytes"]):
        raise DeletionVectorCorrupt(f"DV size {size} != descriptor {descriptor['sizeInBytes']}")
    payload, (crc,) = raw[4:4 + size], struct.unpack(">I", raw[4 + size:8 + size])
    if zlib.crc32(payload) != crc:
        raise DeletionVectorCorrupt("DV checksum mismatch")
    return _bitmap(payload, descriptor)


def decode_inline(descriptor: Mapping) -> BitMap64:
    """The deleted row indexes of an inline ('i') DV: magic + bitmap, ``sizeInBytes`` long."""
    payload = z85_decode(descriptor["pathOrInlineDv"], int(descriptor["sizeInBytes"]))
    return _bitmap(payload, descriptor)


def encode_inline(bitmap: BitMap64) -> dict:
    """An inline ('i') descriptor of ``bitmap``, as Delta writes one: Z85 of magic + bitmap."""
    payload = struct.pack("<I", MAGIC) + bitmap.serialize()
    return {"storageType": "i", "pathOrInlineDv": z85_encode(payload), "offset": None,
            "sizeInBytes": len(payload), "cardinality": len(bitmap)}


def _bitmap(payload: bytes, descriptor: Mapping) -> BitMap64:
    (magic,) = struct.unpack("<I", payload[:4])
    if magic != MAGIC:
        raise DeletionVectorCorrupt(f"DV magic {magic} is not the portable RoaringTreemap's")
    bitmap = BitMap64.deserialize(payload[4:])
    if len(bitmap) != int(descriptor["cardinality"]):
        raise DeletionVectorCorrupt(
            f"DV holds {len(bitmap)} rows, descriptor says {descriptor['cardinality']}")
    return bitmap


@dataclass(frozen=True)
class DvFile:
    """One new DV file: its bytes, its path relative to the table, one descriptor per DV."""

    relative_path: str
    data: bytes
    descriptors: list[dict]


def encode_file(bitmaps: Iterable[BitMap64], prefix: str = "") -> DvFile:
    """Pack ``bitmaps`` into one DV file; descriptors in the same order."""
    file_id = uuid.uuid4()
    path_text = prefix + z85_encode(file_id.bytes)
    body = bytearray([FORMAT_VERSION])
    descriptors = []
    for bitmap in bitmaps:
        payload = struct.pack("<I", MAGIC) + bitmap.serialize()
        offset = len(body)
        body += struct.pack(">I", len(payload)) + payload + struct.pack(">I", zlib.crc32(payload))
        descriptors.append({"storageType": "u", "pathOrInlineDv": path_text, "offset": offset,
                            "sizeInBytes": len(payload), "cardinality": len(bitmap)})
    name = f"deletion_vector_{file_id}.bin"
    return DvFile(f"{prefix}/{name}" if prefix else name, bytes(body), descriptors)


def load(table_uri: str, descriptor: Mapping | None,
         storage_options: Mapping[str, str] | None) -> BitMap64:
    """The rows a descriptor deletes (empty without one), read from the table's store."""
    if not descriptor:
        return BitMap64()
    if descriptor["storageType"] == "i":
        return decode_inline(descriptor)
    rel = relative_path(descriptor)
    uri = objects.join(table_uri, rel) if rel else descriptor["pathOrInlineDv"]
    offset, size = file_span(descriptor)
    return decode_stored(objects.read_bytes(uri, storage_options, offset, size), descriptor)
