"""The probe that refuses an object store on which two commits could both win.

Why: the storage layer commits a table version by a create-only write of its log entry
(``objects.put_if_absent``: a conditional PUT with ``If-None-Match: *`` on S3), and the
platform's delta-rs writes (table creation, upstream DML) need the same guarantee. A store that
ignores the header silently overwrites instead, so two concurrent writers could both "commit"
the same version and one of them would be lost. AWS S3 (since August 2024), MinIO,
Cloudflare R2 and moto's server honour it; tests/infra/s3_proxy.py is a store that does not.
:func:`check_conditional_writes` probes a store once per process and raises
``ConditionalWritesUnsupported`` before anything is written.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Mapping

from backfill_assets.core.errors import ConditionalWritesUnsupported
from backfill_assets.storage.store import objects
from backfill_assets.storage.store.lru import LRU
from backfill_assets.storage.store.objects import StorageOptions


def check_conditional_writes(root: str, storage_options: StorageOptions = None) -> None:
    """Probe, once per process and store (bucket + options), that a create-only write under
    ``root`` refuses to overwrite; raise ConditionalWritesUnsupported when the store silently
    replaced it. Every write path of the platform (table creation, the storage layer's
    commits, upstream DML) calls this before its first commit, so an unsafe store is refused
    before anything is written; a refusal is not remembered (a fixed store passes on the next
    call). Local folders need no probe."""
    loc = objects.parse(root)
    if loc.scheme == objects.LOCAL:
        return
    options = objects.canonical_options(storage_options)
    store = (loc.bucket, options)
    with _PROBE_LOCK:
        if store in _PROBED:
            return
        _probe(loc.bucket, loc.key, options)
        _PROBED.put(store, True)


_PROBED: LRU[tuple[str, tuple[tuple[str, str], ...]], bool] = LRU(64, name="probed stores")
_PROBE_LOCK = threading.Lock()


def _probe(bucket: str, key: str, options: tuple[tuple[str, str], ...]) -> None:
    """Two create-only PUTs of one fresh name under ``key``: the second must be refused."""
    uri = objects.join(f"s3://{bucket}", key, "_put_if_absent_probe", uuid.uuid4().hex)
    opts = dict(options)
    endpoint = opts.get("endpoint", "AWS S3")
    try:
        try:
            first = objects.put_if_absent(uri, b"first", _aliased(opts))
            second = objects.put_if_absent(uri, b"second", _aliased(opts))
        except NotImplementedError as exc:  # obstore: conditional put switched off
            raise _unsupported(endpoint, f"the client refused a create-only PUT ({exc})") from exc
        if not first:
            raise ConditionalWritesUnsupported(f"probe object {uri} existed before it was written")
        if second:
            raise _unsupported(endpoint, "it overwrote an object on a create-only PUT "
                               "(If-None-Match: *)")
    finally:
        objects.delete(uri, _aliased(opts))


def _unsupported(endpoint: str, what: str) -> ConditionalWritesUnsupported:
    return ConditionalWritesUnsupported(
        f"the object store at {endpoint} cannot be committed to safely: {what}, so two "
        "concurrent commits could both succeed. Nothing was written. Use a store that supports "
        "conditional writes (AWS S3, MinIO, Cloudflare R2, Ceph RGW 18+) or keep the tables in "
        "a local/shared folder")


def _aliased(canonical: Mapping[str, str]) -> dict[str, str]:
    """Canonical names back to option names objects.py accepts (for the probe's calls)."""
    return {objects.OPTION_ALIASES[k][0]: v for k, v in canonical.items()}
