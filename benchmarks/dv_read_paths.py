"""Who should decode deletion vectors on each read path: the storage layer or delta-rs?

delta-rs (1.6.6) decodes DVs too: ``DeltaTable.deletion_vectors()`` (a selection vector per
file of a version) and a DV-aware ``load_cdf``. One table (N rows in F files written by
delta-rs, then one commit that gives every file a DV deleting every 10th row, as a DELETE
does) is read, best of ``--repeat``, on the paths the platform has:

- ``version``: every file's deleted rows at a version (the bulk read, a replica's copy,
  maintenance): ours ``TableVersion.load`` + ``dv.load`` per file; delta-rs ``DeltaTable(uri,
  version)`` + ``deletion_vectors()``;
- ``one_file``: one file's deleted rows (a Python read task, a key lookup, a merge's rewrite):
  ours one ranged read of the DV file; delta-rs has no per-file call: the version's open and
  ``deletion_vectors()``, then the file's row;
- ``change_feed``: the change rows of the DV commit: ours ``read_raw_changes``; delta-rs
  ``load_cdf``.

Each pair is checked equal (same deleted rows; same change rows). No Spark:
``.venv/bin/python -m benchmarks.dv_read_paths``; the figures are in docs/STORAGE.md.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from collections.abc import Callable

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake
from pyroaring import BitMap64

from backfill_assets.storage import TableVersion, dv, read_raw_changes


def _best(fn: Callable[[], object], repeat: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return round(min(times), 4), out


def _table(folder: str, rows: int, files: int) -> str:
    """F appended files, then one commit that gives each a DV of every 10th row."""
    uri = os.path.join(folder, "t")
    per = rows // files
    for f in range(files):
        ids = pa.array(range(f * per, (f + 1) * per), pa.int64())
        write_deltalake(uri, pa.table({"id": ids, "qty": pa.compute.cast(ids, pa.int32())}),
                        mode="append", configuration={"delta.enableDeletionVectors": "true",
                                                      "delta.enableChangeDataFeed": "true"})
    adds = list(TableVersion.load(uri).files)
    packed = dv.encode_file([BitMap64(range(0, a.num_records, 10)) for a in adds])
    with open(os.path.join(uri, packed.relative_path), "wb") as out:
        out.write(packed.data)
    version = DeltaTable(uri).version() + 1
    lines = []
    for a, descriptor in zip(adds, packed.descriptors, strict=True):
        base = {"path": a.path, "partitionValues": {}, "size": a.size, "dataChange": True}
        lines.append({"remove": {**base, "deletionTimestamp": 1, "extendedFileMetadata": True}})
        lines.append({"add": {**base, "modificationTime": 1, "deletionVector": descriptor,
                              "stats": json.dumps({"numRecords": a.num_records})}})
    with open(os.path.join(uri, "_delta_log", f"{version:020d}.json"), "x") as out:
        out.write("".join(json.dumps(line) + "\n" for line in lines))
    return uri


def _ours_version(uri: str) -> dict[str, set[int]]:
    snap = TableVersion.load(uri)
    return {f.path: set(dv.load(uri, f.deletion_vector, None)) for f in snap.files}


def _theirs_version(uri: str) -> dict[str, set[int]]:
    masks = pa.table(DeltaTable(uri).deletion_vectors()).to_pylist()
    return {m["filepath"].rsplit("/", 1)[-1]: {i for i, keep in enumerate(m["selection_vector"])
                                               if not keep} for m in masks}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--out", default="benchmarks/results/dv_read_paths.json")
    args = parser.parse_args(argv)
    uri = _table(tempfile.mkdtemp(prefix="dv-paths-"), args.rows, args.files)
    version = DeltaTable(uri).version()
    snap = TableVersion.load(uri)
    first = snap.files[0]
    result: dict = {"rows": args.rows, "files": args.files, "deleted_per_file": "every 10th"}
    ours, mine = _best(lambda: _ours_version(uri), args.repeat)
    theirs, other = _best(lambda: _theirs_version(uri), args.repeat)
    assert mine == other, "the two decoders disagree on a version's deleted rows"
    result["version"] = {"layer": ours, "delta_rs": theirs}
    ours, one = _best(lambda: set(dv.load(uri, first.deletion_vector, None)), args.repeat)
    theirs, _ = _best(lambda: _theirs_version(uri)[first.path], args.repeat)
    assert one == other[first.path]
    result["one_file"] = {"layer": ours, "delta_rs": theirs}
    ours, mine = _best(lambda: read_raw_changes(uri, version - 1, version, ["id"]), args.repeat)
    theirs, other = _best(lambda: pa.table(DeltaTable(uri).load_cdf(
        starting_version=version, ending_version=version, columns=["id"])), args.repeat)
    assert sorted(mine.column("id").to_pylist()) == sorted(other.column("id").to_pylist())
    result["change_feed"] = {"layer": ours, "delta_rs": theirs, "rows": mine.num_rows}
    print(json.dumps(result, indent=1))
    with open(args.out, "w") as out:
        json.dump(result, out, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
