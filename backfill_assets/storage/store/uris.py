"""Where an object is: URIs parsed (``parse``: a local path, ``file://``, ``s3://`` or
``s3a://``) and joined, and the storage options by their canonical names (deltalake's aliases
matched case-insensitively: ``aws_endpoint``, ``endpoint_url``, ``region``, ...). Pure string
work, apart from the IO of objects.py, which re-exports these names.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from backfill_assets.core.errors import UnsupportedStorage

StorageOptions = Mapping[str, str] | None

LOCAL = "file"
S3 = "s3"
_S3_SCHEMES = {"s3", "s3a"}

# canonical option -> the names deltalake / object_store accept for it (lower case)
OPTION_ALIASES: dict[str, tuple[str, ...]] = {
    "access_key_id": ("aws_access_key_id", "access_key_id"),
    "secret_access_key": ("aws_secret_access_key", "secret_access_key"),
    "session_token": ("aws_session_token", "aws_token", "session_token", "token"),
    "region": ("aws_region", "aws_default_region", "region"),
    "endpoint": ("aws_endpoint_url", "aws_endpoint", "endpoint_url", "endpoint"),
    "allow_http": ("aws_allow_http", "allow_http"),
    "virtual_hosted": ("aws_virtual_hosted_style_request", "virtual_hosted_style_request"),
    "skip_signature": ("aws_skip_signature", "skip_signature"),
}

@dataclass(frozen=True)
class Location:
    """A parsed URI: ``scheme`` is "file" or "s3"; ``bucket`` and ``key`` for S3 (key without
    a leading slash), ``path`` the pyarrow filesystem path (``/abs/path`` or ``bucket/key``)."""

    scheme: str
    path: str
    bucket: str = ""
    key: str = ""

    def child_uri(self, fs_path: str) -> str:
        """The URI of a pyarrow filesystem path found below this location."""
        return f"s3://{fs_path}" if self.scheme == S3 else fs_path


def parse(uri: str) -> Location:
    """Split ``uri`` (a local path, ``file://``, ``s3://`` or ``s3a://``) into a Location."""
    if "://" not in uri:
        return Location(LOCAL, os.path.abspath(os.path.expanduser(uri)))
    scheme, rest = uri.split("://", 1)
    scheme = scheme.lower()
    if scheme == LOCAL:
        return Location(LOCAL, os.path.abspath(rest if rest.startswith("/") else "/" + rest))
    if scheme in _S3_SCHEMES:
        bucket, _, key = rest.partition("/")
        if not bucket:
            raise UnsupportedStorage(f"{uri!r} names no bucket: write s3://bucket/prefix/table")
        key = key.strip("/")
        return Location(S3, f"{bucket}/{key}" if key else bucket, bucket, key)
    raise UnsupportedStorage(
        f"{uri!r}: the storage layer reaches local paths, file:// and s3:// URIs (any "
        "S3-compatible store via AWS_ENDPOINT_URL); move the tables there or add the scheme "
        "to backfill_assets/storage/store/objects.py"
    )


def is_local(uri: str) -> bool:
    """True for local paths and file:// URIs."""
    return "://" not in uri or uri.lower().startswith("file://")


def local_path(uri: str) -> str:
    """The local path of a local ``uri`` (file:// stripped)."""
    return uri[len("file://"):] if uri.lower().startswith("file://") else uri


def join(uri: str, *parts: str) -> str:
    """``uri`` with ``parts`` appended by '/' (URIs and local paths alike)."""
    out = uri.rstrip("/")
    for p in parts:
        out = f"{out}/{p.strip('/')}"
    return out


def table_uri(root: str, name: str) -> str:
    """A table's URI from a name in the settings: the name itself when it is a URI or an
    absolute path, else the name under ``root`` (the warehouse)."""
    if "://" in name or name.startswith("/"):
        return name
    return join(root, name)


def canonical_options(storage_options: StorageOptions) -> tuple[tuple[str, str], ...]:
    """The options this module uses, by canonical name (hashable: the cache key)."""
    given = {str(k).lower(): str(v) for k, v in (storage_options or {}).items() if v is not None}
    out: dict[str, str] = {}
    for name, aliases in OPTION_ALIASES.items():
        for alias in aliases:
            if alias in given:
                out[name] = given[alias]
                break
    return tuple(sorted(out.items()))
