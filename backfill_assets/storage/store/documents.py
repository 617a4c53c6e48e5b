"""Small JSON documents beside an MV's tables: runtime controls and follower stop requests.

Why through the storage layer: a follower, a per-barrier run, the barrier sensor and the jobs
that write these documents may run on different machines, so the documents must live where the
tables live (a local folder or an object store, reached with the warehouse's storage options),
not in a local file beside the process. A writer replaces the whole document at once
(``objects.replace_bytes``: one PUT on S3, a rename locally) and a reader takes one version
whole (``objects.read_whole``: one GET), so a reader never sees half of one; a document that is
not there reads as None.
"""

from __future__ import annotations

import json
from typing import Any

from backfill_assets.storage.store import objects
from backfill_assets.storage.store.objects import StorageOptions


def read_json(uri: str, storage_options: StorageOptions = None) -> Any | None:
    """The document at ``uri``, or None when there is none (json.JSONDecodeError when the
    object there is not JSON: nothing the platform writes)."""
    try:
        raw = objects.read_whole(uri, storage_options)
    except FileNotFoundError:
        return None
    return json.loads(raw.decode("utf-8"))


def write_json(uri: str, document: Any, storage_options: StorageOptions = None) -> None:
    """Replace the document at ``uri`` atomically (create it when there is none)."""
    objects.replace_bytes(uri, json.dumps(document).encode("utf-8"), storage_options)


def read_sequence(folder: str, storage_options: StorageOptions = None) -> tuple[int, Any | None]:
    """The newest document of a sequence kept in ``folder`` (``00000001.json``, ...) and its
    number; (0, None) when the folder holds none. See ``append_sequence``."""
    numbers = [int(n[:-5]) for n in objects.list_names(folder, storage_options)
               if n.endswith(".json") and n[:-5].isdigit()]
    if not numbers:
        return 0, None
    newest = max(numbers)
    return newest, read_json(objects.join(folder, _sequence_name(newest)), storage_options)


def append_sequence(folder: str, number: int, document: Any,
                    storage_options: StorageOptions = None) -> bool:
    """Write ``document`` as number ``number`` of the sequence in ``folder`` with a create-only
    write (``objects.put_if_absent``): False when another writer took that number first.

    Why a sequence and not ``write_json``: a read-modify-write of one document lets two
    writers that read the same state both replace it, and the second silently undoes the
    first. Here the writer that read number n may only write n + 1; a loser reads again and
    decides on what the winner wrote (a Delta log's commit rule, on the same stores)."""
    data = json.dumps(document).encode("utf-8")
    return objects.put_if_absent(objects.join(folder, _sequence_name(number)), data,
                                 storage_options)


def _sequence_name(number: int) -> str:
    return f"{number:08d}.json"
