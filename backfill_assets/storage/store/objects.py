"""Objects under a table URI: the one place that turns a URI + storage options into bytes.

Why this module: every table may live in a local folder (the embedded default) or on an
S3-compatible object store, and the code that reads and writes files runs both on the driver
and inside Spark tasks on other machines. So everything here takes plain, picklable arguments
(a URI string and the deltalake-style ``storage_options`` dict, e.g. ``AWS_ENDPOINT_URL``,
``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_REGION``, ``AWS_ALLOW_HTTP``) and
rebuilds its clients in whatever process it runs in (cached per process). Pass the options into
a task's closure, never a filesystem object.

Data files go through ``pyarrow.fs`` (``filesystem(uri, options)``), which parquet readers and
writers take directly. Commits need a write that never overwrites: ``put_if_absent``. Locally
that is a temporary file hard-linked into place (``os.link`` fails when the name exists); on
S3 it is a conditional PUT with ``If-None-Match: *`` (obstore ``mode="create"``), which AWS S3
(since August 2024), MinIO, Cloudflare R2 and moto's server honour (the last one is tested
here). A store that ignores the header would let two writers both "win":
``conditional.check_conditional_writes`` probes a store once and raises
``ConditionalWritesUnsupported``. Documents rewritten in place: ``replace_bytes``/``read_whole``.

The storage layer's own helpers live here too: ``list_names`` (a folder's direct files, e.g.
``_delta_log``) and ``list_recursive`` (relative paths and mtimes, for vacuum); ``join``,
``parse``, ``is_local`` and the options by canonical name come from uris.py (re-exported).

Option names are matched case-insensitively with deltalake's aliases (``aws_endpoint``,
``endpoint_url``, ``region``, ...). Options this module does not need (a DynamoDB locking
provider, ``AWS_S3_ALLOW_UNSAFE_RENAME``, ...) are left to deltalake and ignored here.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass

import pyarrow.fs as pafs

from backfill_assets.storage.store.create_put import put_create
from backfill_assets.storage.store.lru import memoized
from backfill_assets.storage.store.uris import (
    LOCAL,
    OPTION_ALIASES,
    S3,
    Location,
    StorageOptions,
    canonical_options,
    is_local,
    join,
    local_path,
    parse,
)

# the URI helpers are re-exported: callers reach every object through this one module
__all__ = ["LOCAL", "OPTION_ALIASES", "S3", "Location", "ObjectInfo", "StorageOptions",
           "canonical_options", "delete", "delete_prefix", "exists", "filesystem", "is_local",
           "join", "list_names", "list_prefix", "list_recursive", "local_path", "parse",
           "put_if_absent", "read_bytes", "read_whole", "replace_bytes", "size", "stat",
           "write_bytes"]

_DEFAULT_REGION = "us-east-1"


@dataclass(frozen=True)
class ObjectInfo:
    """One object found by ``list_prefix``: its full URI and size in bytes."""

    uri: str
    size: int


def _true(value: str | None) -> bool:
    return str(value).strip().lower() in {"1", "true", "yes", "on"}


@memoized("S3 filesystems", 16)
def _s3_filesystem(options: tuple[tuple[str, str], ...]) -> pafs.S3FileSystem:
    opts = dict(options)
    kwargs: dict[str, object] = {"region": opts.get("region", _DEFAULT_REGION)}
    endpoint = opts.get("endpoint")
    if endpoint:
        scheme, _, host = endpoint.rpartition("://")
        kwargs["endpoint_override"] = host.rstrip("/")
        kwargs["scheme"] = scheme or ("http" if _true(opts.get("allow_http")) else "https")
    if "access_key_id" in opts:
        kwargs["access_key"] = opts["access_key_id"]
        kwargs["secret_key"] = opts.get("secret_access_key", "")
        if "session_token" in opts:
            kwargs["session_token"] = opts["session_token"]
    if _true(opts.get("skip_signature")):
        kwargs["anonymous"] = True
    if _true(opts.get("virtual_hosted")):
        kwargs["force_virtual_addressing"] = True
    return pafs.S3FileSystem(**kwargs)


@memoized("S3 stores", 16)
def _s3_store(bucket: str, options: tuple[tuple[str, str], ...]):
    """An obstore S3 store for conditional writes (pyarrow has no create-only PUT)."""
    from obstore.store import S3Store  # imported here: local-only setups never load it

    opts = dict(options)
    names = {"access_key_id": "AWS_ACCESS_KEY_ID", "secret_access_key": "AWS_SECRET_ACCESS_KEY",
             "session_token": "AWS_SESSION_TOKEN", "endpoint": "AWS_ENDPOINT",
             "virtual_hosted": "AWS_VIRTUAL_HOSTED_STYLE_REQUEST",
             "skip_signature": "AWS_SKIP_SIGNATURE"}
    config = {names[k]: v for k, v in opts.items() if k in names}
    config["AWS_REGION"] = opts.get("region", _DEFAULT_REGION)
    allow_http = _true(opts.get("allow_http"))
    endpoint = opts.get("endpoint", "")
    if endpoint and "://" not in endpoint:
        config["AWS_ENDPOINT"] = f"{'http' if allow_http else 'https'}://{endpoint}"
    allow_http = allow_http or endpoint.startswith("http://")
    return S3Store(bucket, config=config, client_options={"allow_http": allow_http})


def filesystem(uri: str, storage_options: StorageOptions = None) -> tuple[pafs.FileSystem, str]:
    """The pyarrow filesystem for ``uri`` and the path to give it (cached per process)."""
    loc = parse(uri)
    if loc.scheme == LOCAL:
        return pafs.LocalFileSystem(), loc.path
    return _s3_filesystem(canonical_options(storage_options)), loc.path


def put_if_absent(uri: str, data: bytes, storage_options: StorageOptions = None, *,
                  sync: bool = True) -> bool:
    """Write ``data`` at ``uri`` only if nothing is there: True when written, False when the
    object already existed (its content untouched). Two writers racing for one name: exactly
    one gets True. This is the primitive a commit protocol needs (a Delta log entry).
    ``sync``: on a local disk, on disk (fsync) before it is visible; False for an object whose
    loss at a power cut its reader recovers from (a derived table's log entry)."""
    loc = parse(uri)
    if loc.scheme == LOCAL:
        return _put_if_absent_local(loc.path, data, sync)
    return put_create(_s3_store(loc.bucket, canonical_options(storage_options)), loc.key, data,
                      uri)


def _complete_temp(path: str, data: bytes, sync: bool = True) -> str:
    """A temporary file beside ``path`` holding all of ``data`` (on disk, with ``sync``): what
    a local write links or renames into place, so no reader ever sees part of it."""
    folder = os.path.dirname(path)
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".put-", dir=folder)
    with os.fdopen(fd, "wb") as out:
        out.write(data)
        out.flush()
        if sync:
            os.fsync(out.fileno())
    return tmp


def _put_if_absent_local(path: str, data: bytes, sync: bool) -> bool:
    tmp = _complete_temp(path, data, sync)
    try:
        os.link(tmp, path)  # atomic, and fails if the name exists (rename would replace)
        return True
    except FileExistsError:
        return False
    finally:
        os.unlink(tmp)


def replace_bytes(uri: str, data: bytes, storage_options: StorageOptions = None) -> None:
    """Write or replace the object at ``uri`` so that ``read_whole`` gets the old bytes or the
    new ones, never part of them (small documents rewritten in place: controls, stop requests).
    On S3 one PUT is atomic; locally a complete temporary file is renamed over the old one."""
    loc = parse(uri)
    if loc.scheme != LOCAL:
        write_bytes(uri, data, storage_options)
        return
    tmp = _complete_temp(loc.path, data)
    try:
        os.replace(tmp, loc.path)
    except BaseException:
        os.unlink(tmp)
        raise


def read_whole(uri: str, storage_options: StorageOptions = None) -> bytes:
    """One whole version of the object at ``uri`` while ``replace_bytes`` may replace it: one GET
    on S3 (pyarrow's reader takes the size, then the bytes: a replacement in between cuts the new
    bytes at the old size); locally one open file. FileNotFoundError when there is none."""
    loc = parse(uri)
    if loc.scheme == LOCAL:
        try:
            return read_bytes(uri)
        except NotADirectoryError:  # a folder on the way is a file: nothing can be there
            raise FileNotFoundError(f"no object at {uri}") from None
    from obstore import get
    from obstore.exceptions import NotFoundError

    try:
        store = _s3_store(loc.bucket, canonical_options(storage_options))
        return bytes(get(store, loc.key).bytes())
    except NotFoundError:
        raise FileNotFoundError(f"no object at {uri}") from None


def write_bytes(uri: str, data: bytes, storage_options: StorageOptions = None) -> None:
    """Write (or overwrite) the object at ``uri``: for data files, whose names are unique."""
    fs, path = filesystem(uri, storage_options)
    if parse(uri).scheme == LOCAL:
        fs.create_dir(os.path.dirname(path), recursive=True)
    with fs.open_output_stream(path) as out:
        out.write(data)


def read_bytes(uri: str, storage_options: StorageOptions = None, offset: int = 0,
               size: int | None = None) -> bytes:
    """The object at ``uri`` (``size`` bytes from ``offset``, default all of it: a deletion
    vector is a slice of a file); FileNotFoundError when there is none."""
    fs, path = filesystem(uri, storage_options)
    if not offset and size is None:
        with fs.open_input_stream(path) as src:
            return src.read()
    with fs.open_input_file(path) as src:
        src.seek(offset)
        return src.read(size) if size is not None else src.read()


def _info(uri: str, storage_options: StorageOptions) -> pafs.FileInfo:
    fs, path = filesystem(uri, storage_options)
    return fs.get_file_info(path)


def exists(uri: str, storage_options: StorageOptions = None) -> bool:
    """True when an object (or a local file) is at ``uri``; folders/prefixes do not count."""
    return _info(uri, storage_options).type == pafs.FileType.File


def size(uri: str, storage_options: StorageOptions = None) -> int | None:
    """Size in bytes of the object at ``uri``, or None when there is none (a commit checks
    every file it adds this way)."""
    info = _info(uri, storage_options)
    return int(info.size) if info.type == pafs.FileType.File else None


def stat(uri: str, storage_options: StorageOptions = None) -> tuple[int, int] | None:
    """(size, modification time in ns) of the object at ``uri``, None when there is none: what
    tells two objects written at the same uri apart."""
    info = _info(uri, storage_options)
    if info.type != pafs.FileType.File:
        return None
    return int(info.size), int(info.mtime_ns or 0)


def list_prefix(uri: str, storage_options: StorageOptions = None) -> list[ObjectInfo]:
    """Every object below the folder ``uri`` (recursively), sorted by URI; [] when none."""
    loc = parse(uri)
    fs, path = filesystem(uri, storage_options)
    selector = pafs.FileSelector(path.rstrip("/"), recursive=True, allow_not_found=True)
    found = [
        ObjectInfo(loc.child_uri(info.path), int(info.size))
        for info in fs.get_file_info(selector)
        if info.type == pafs.FileType.File
    ]
    return sorted(found, key=lambda o: o.uri)


def list_names(uri: str, storage_options: StorageOptions = None) -> list[str]:
    """Names of the files directly under the folder ``uri`` (empty when it does not exist)."""
    fs, path = filesystem(uri, storage_options)
    infos = fs.get_file_info(pafs.FileSelector(path.rstrip("/"), allow_not_found=True))
    return [i.base_name for i in infos if i.type == pafs.FileType.File]


def list_recursive(uri: str, storage_options: StorageOptions = None) -> list[tuple[str, float]]:
    """(path relative to ``uri``, modification time in seconds) of every file below ``uri``."""
    fs, path = filesystem(uri, storage_options)
    path = path.rstrip("/")
    infos = fs.get_file_info(pafs.FileSelector(path, recursive=True, allow_not_found=True))
    out = []
    for i in infos:
        if i.type == pafs.FileType.File:
            mtime = i.mtime.timestamp() if i.mtime is not None else 0.0
            out.append((i.path[len(path):].lstrip("/"), mtime))
    return out


def delete(uri: str, storage_options: StorageOptions = None) -> bool:
    """Delete the object at ``uri``: True when one was there, False when there was none."""
    fs, path = filesystem(uri, storage_options)
    if fs.get_file_info(path).type != pafs.FileType.File:
        return False
    try:
        fs.delete_file(path)
    except FileNotFoundError:
        return False
    return True


def delete_prefix(uri: str, storage_options: StorageOptions = None) -> int:
    """Delete every object below the folder ``uri`` (and the folder, on a local disk); the
    number of objects deleted."""
    found = list_prefix(uri, storage_options)
    for info in found:
        delete(info.uri, storage_options)
    if is_local(uri) and os.path.isdir(local_path(uri)):
        shutil.rmtree(local_path(uri), ignore_errors=True)
    return len(found)
