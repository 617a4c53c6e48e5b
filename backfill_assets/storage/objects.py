"""Bytes in a table's store: local folders and S3-compatible object stores, one interface.

Every byte the storage layer reads or writes goes through here, so a table works the same on a
local disk, on a cluster whose executors share the store, and on an object store. A store is
named by a table URI plus deltalake-style storage options (``AWS_ENDPOINT_URL``, ...); the
filesystem is rebuilt from those in every Spark task (filesystems do not pickle reliably).

Log entries are published with put-if-absent (``put_if_absent``): a commit never overwrites an
existing version. Locally that is a hard link of a fully written temporary file (atomic, and it
fails when the name exists).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Mapping
from urllib.parse import urlparse

import pyarrow.fs as pafs

StorageOptions = Mapping[str, str] | None


def is_local(uri: str) -> bool:
    return "://" not in uri or uri.startswith("file://")


def local_path(uri: str) -> str:
    return uri[len("file://"):] if uri.startswith("file://") else uri


def join(uri: str, *parts: str) -> str:
    """``uri`` with ``parts`` appended by '/' (URIs and local paths alike)."""
    out = uri.rstrip("/")
    for p in parts:
        out = f"{out}/{p.strip('/')}"
    return out


def filesystem(uri: str, storage_options: StorageOptions = None) -> tuple[pafs.FileSystem, str]:
    """The pyarrow filesystem holding ``uri`` and the path of ``uri`` inside it."""
    if is_local(uri):
        return pafs.LocalFileSystem(), os.path.abspath(local_path(uri))
    parsed = urlparse(uri)
    if parsed.scheme in ("s3", "s3a"):
        return _s3(dict(storage_options or {})), f"{parsed.netloc}{parsed.path}"
    raise ValueError(f"unsupported table URI scheme {parsed.scheme!r} in {uri}: use a local "
                     "path, file:// or s3://")


def _s3(options: dict[str, str]) -> pafs.S3FileSystem:
    lower = {k.lower(): v for k, v in options.items()}
    endpoint = (lower.get("aws_endpoint_url") or lower.get("endpoint_url")
                or lower.get("aws_endpoint"))
    kwargs: dict = {
        "access_key": lower.get("aws_access_key_id"),
        "secret_key": lower.get("aws_secret_access_key"),
        "session_token": lower.get("aws_session_token"),
        "region": lower.get("aws_region") or "us-east-1",
    }
    if endpoint:
        parsed = urlparse(endpoint)
        kwargs["endpoint_override"] = parsed.netloc or endpoint
        kwargs["scheme"] = parsed.scheme or "https"
    return pafs.S3FileSystem(**{k: v for k, v in kwargs.items() if v is not None})


def read_bytes(uri: str, storage_options: StorageOptions = None, offset: int = 0,
               size: int | None = None) -> bytes:
    fs, path = filesystem(uri, storage_options)
    with fs.open_input_file(path) as f:
        if offset:
            f.seek(offset)
        return f.read(size) if size is not None else f.read()


def write_bytes(uri: str, data: bytes, storage_options: StorageOptions = None) -> None:
    """Write (or replace) ``uri``: for data and DV files, whose names are fresh UUIDs."""
    fs, path = filesystem(uri, storage_options)
    if is_local(uri):
        os.makedirs(os.path.dirname(path), exist_ok=True)
    with fs.open_output_stream(path) as f:
        f.write(data)


def put_if_absent(uri: str, data: bytes, storage_options: StorageOptions = None) -> bool:
    """Publish ``data`` at ``uri`` unless something is there already; True when written."""
    if not is_local(uri):
        from backfill_assets.storage.object_put import put_if_absent_s3

        return put_if_absent_s3(uri, data, storage_options)
    path = os.path.abspath(local_path(uri))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.{uuid.uuid4().hex}.tmp"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    try:
        os.link(tmp, path)
        return True
    except FileExistsError:
        return False
    finally:
        os.unlink(tmp)


def exists(uri: str, storage_options: StorageOptions = None) -> bool:
    fs, path = filesystem(uri, storage_options)
    return fs.get_file_info(path).type != pafs.FileType.NotFound


def size(uri: str, storage_options: StorageOptions = None) -> int | None:
    """The size of the file at ``uri``, or None when there is none."""
    fs, path = filesystem(uri, storage_options)
    info = fs.get_file_info(path)
    return None if info.type == pafs.FileType.NotFound else info.size


def list_names(uri: str, storage_options: StorageOptions = None) -> list[str]:
    """Names of the files directly under the folder ``uri`` (empty when it does not exist)."""
    fs, path = filesystem(uri, storage_options)
    infos = fs.get_file_info(pafs.FileSelector(path, allow_not_found=True))
    return [i.base_name for i in infos if i.type == pafs.FileType.File]


def list_recursive(uri: str, storage_options: StorageOptions = None) -> list[tuple[str, float]]:
    """(path relative to ``uri``, modification time in seconds) of every file below ``uri``."""
    fs, path = filesystem(uri, storage_options)
    infos = fs.get_file_info(pafs.FileSelector(path, recursive=True, allow_not_found=True))
    out = []
    for i in infos:
        if i.type == pafs.FileType.File:
            mtime = i.mtime.timestamp() if i.mtime is not None else 0.0
            out.append((i.path[len(path):].lstrip("/"), mtime))
    return out


def delete(uri: str, storage_options: StorageOptions = None) -> None:
    fs, path = filesystem(uri, storage_options)
    fs.delete_file(path)
