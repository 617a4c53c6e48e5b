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

from backfill_assets.storage import objects
from backfill_assets.storage.objects import StorageOptions


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
