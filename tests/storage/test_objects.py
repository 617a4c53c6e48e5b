"""backfill_assets.storage.store.objects against a local folder AND a real S3-compatible server.

Every test runs twice: ``root`` is a fresh local folder, or a fresh prefix in the session's moto
S3 server (tests/infra/s3_server.py). The S3 variant proves the create-only PUT is honoured
by the server (a racing second writer gets False and the first content stays).
"""

from __future__ import annotations

import pickle
import threading

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from backfill_assets.core.errors import ConditionalWritesUnsupported, UnsupportedStorage
from backfill_assets.storage.store import conditional, objects
from tests.infra.s3_proxy import start_proxy


@pytest.fixture(params=["local", "s3"])
def root(request, tmp_path):
    """(root URI, storage options) for a local folder or a fresh S3 prefix."""
    if request.param == "local":
        return str(tmp_path / "store"), None
    s3 = request.getfixturevalue("s3_server")
    return s3.fresh_uri("objects"), dict(s3.storage_options)


def test_put_if_absent_never_overwrites(root):
    base, opts = root
    uri = f"{base}/_delta_log/00000000000000000000.json"
    assert objects.put_if_absent(uri, b"first", opts) is True
    assert objects.put_if_absent(uri, b"second", opts) is False
    assert objects.read_bytes(uri, opts) == b"first"
    assert objects.exists(uri, opts) and objects.size(uri, opts) == 5


def test_put_if_absent_race_has_one_winner(root):
    """Eight writers race for one name, 25 times: each time exactly one wins and its bytes stay.
    (Against moto's plain server, which checks then writes, this failed under load.)"""
    base, opts = root
    for attempt in range(25):
        uri = f"{base}/_delta_log/{attempt:020d}.json"
        results: list[tuple[int, bool]] = []
        barrier = threading.Barrier(8)

        def writer(i: int, uri: str = uri, results: list = results,
                   barrier: threading.Barrier = barrier) -> None:
            barrier.wait()
            results.append((i, objects.put_if_absent(uri, f"writer {i}".encode(), opts)))

        threads = [threading.Thread(target=writer, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        winners = [i for i, won in results if won]
        assert len(results) == 8 and len(winners) == 1, (attempt, results)
        assert objects.read_bytes(uri, opts) == f"writer {winners[0]}".encode()


def test_bytes_roundtrip_list_and_delete(root):
    base, opts = root
    assert objects.list_prefix(base, opts) == []
    assert not objects.exists(f"{base}/a.parquet", opts)
    objects.write_bytes(f"{base}/vnode=1/a.parquet", b"12345", opts)
    objects.write_bytes(f"{base}/vnode=1/a.parquet", b"123", opts)  # data files: overwrite
    objects.write_bytes(f"{base}/b.bin", b"x", opts)
    listed = objects.list_prefix(base, opts)
    head = _uri_head(base)
    assert [(o.uri[len(head) + 1:], o.size) for o in listed] == [
        ("b.bin", 1), ("vnode=1/a.parquet", 3)]
    assert objects.delete(f"{base}/b.bin", opts) is True
    assert objects.delete(f"{base}/b.bin", opts) is False
    with pytest.raises(FileNotFoundError):
        objects.read_bytes(f"{base}/b.bin", opts)
    assert objects.size(f"{base}/b.bin", opts) is None
    assert objects.list_names(f"{base}/vnode=1", opts) == ["a.parquet"]
    assert [rel for rel, _ in objects.list_recursive(base, opts)] == ["vnode=1/a.parquet"]
    assert objects.read_bytes(f"{base}/vnode=1/a.parquet", opts, offset=1, size=1) == b"2"


def test_documents_are_replaced_whole_while_read(root):
    """Runtime controls and stop requests (storage.documents): a reader polling while the
    document is replaced sees one whole version or another, never part of one, and nothing
    but the document is left (no temporary files)."""
    from backfill_assets.storage.store.documents import read_json, write_json

    base, opts = root
    uri = f"{base}/mv/controls.json"
    assert read_json(uri, opts) is None
    seen, errors, done = [], [], threading.Event()

    def reader() -> None:
        while not done.is_set():
            try:
                seen.append(read_json(uri, opts))
            except Exception as exc:  # noqa: BLE001 - any failure is the finding
                errors.append(repr(exc))

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        for i in range(30):
            write_json(uri, {"n": i, "pad": "x" * 4096 * (i % 3)}, opts)
    finally:
        done.set()
        thread.join(30)
    assert errors == [], f"a reader saw part of a document: {errors[:3]}"
    assert len(seen) > 1 and all(d is None or d["pad"] == "x" * 4096 * (d["n"] % 3) for d in seen)
    assert read_json(uri, opts)["n"] == 29
    assert [o.uri.rsplit("/", 1)[1] for o in objects.list_prefix(f"{base}/mv", opts)] == \
        ["controls.json"]
    assert objects.delete(uri, opts) is True and read_json(uri, opts) is None


def _uri_head(base: str) -> str:
    return base if "://" in base else objects.parse(base).path


def test_filesystem_reads_and_writes_parquet(root):
    """The pyarrow filesystem + path is what the Arrow data path hands to parquet."""
    base, opts = root
    fs, path = objects.filesystem(f"{base}/part-0.parquet", opts)
    table = pa.table({"id": [1, 2, 3], "vnode": [0, 1, 0]})
    if isinstance(fs, pafs.LocalFileSystem):
        fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
    pq.write_table(table, path, filesystem=fs)
    assert pq.read_table(path, filesystem=fs).equals(table)
    assert objects.size(f"{base}/part-0.parquet", opts) > 0


def test_check_conditional_writes_passes(root):
    base, opts = root
    conditional.check_conditional_writes(base, opts)  # moto honours If-None-Match: *
    assert objects.list_prefix(base, opts) == []  # the probe cleans up after itself


def test_arguments_pickle_and_rebuild_in_another_process(root):
    """Tasks get (uri, options) and rebuild the clients themselves."""
    import concurrent.futures as cf
    import multiprocessing as mp

    base, opts = root
    objects.write_bytes(f"{base}/p.bin", b"from driver", opts)
    with cf.ProcessPoolExecutor(1, mp_context=mp.get_context("spawn")) as pool:
        got = pool.submit(objects.read_bytes, f"{base}/p.bin", pickle.loads(pickle.dumps(opts)))
        assert got.result(60) == b"from driver"


def test_uri_parsing_and_option_aliases(tmp_path):
    assert objects.parse("s3a://bkt/a/b/").path == "bkt/a/b"
    assert objects.parse("s3://bkt").key == ""
    assert objects.parse(f"file://{tmp_path}").path == str(tmp_path)
    assert objects.parse("rel/dir").path.endswith("/rel/dir")
    for bad in ("gs://bkt/t", "s3:///t"):
        with pytest.raises(UnsupportedStorage, match="s3://"):
            objects.parse(bad)
    canon = dict(objects.canonical_options({"aws_endpoint": "http://h:1", "REGION": "eu-west-1",
                                     "AWS_S3_LOCKING_PROVIDER": "dynamodb"}))
    assert canon == {"endpoint": "http://h:1", "region": "eu-west-1"}


def test_store_ignoring_conditional_writes_is_refused(s3_server):
    """A real endpoint without conditional writes (moto behind a proxy that drops
    If-None-Match, tests/infra/s3_proxy.py): the probe names it, and the platform's write paths
    (here: creating an upstream table through delta-rs) refuse it before writing anything."""
    from backfill_assets.upstream.writer import create_upstream
    from tests.support import simple_spec

    proxy = start_proxy(s3_server.endpoint)
    try:
        unsafe = proxy.storage_options(s3_server.storage_options)
        base = s3_server.fresh_uri("probe")
        with pytest.raises(ConditionalWritesUnsupported, match="If-None-Match"):
            conditional.check_conditional_writes(base, unsafe)
        with pytest.raises(ConditionalWritesUnsupported, match="Nothing was written"):
            create_upstream(f"{base}/orders", simple_spec(8), unsafe)
        assert objects.list_prefix(base, s3_server.storage_options) == []
        # the same bucket through moto itself passes, once per store and process
        conditional.check_conditional_writes(base, s3_server.storage_options)
    finally:
        proxy.stop()
