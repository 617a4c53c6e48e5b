"""bench_bulk's printed report: the baselines, each run against them, and where the time went
(one table each, from a results file's ``baselines`` and ``runs``)."""

from __future__ import annotations

from benchmarks import common as C


def _best(base: dict, key: str) -> float | None:
    vals = base.get(key) or []
    return min(vals) if vals else None


def print_report(out: dict) -> None:
    bases = {(b["rows"], b["pk"]): b for b in out["baselines"]}
    print("\nBaselines (best of repeats, seconds; rows/s on the upstream rows)")
    C.print_table(
        ["rows", "pk", "spark copy s", "pyarrow copy s", "full refresh s",
         "clustered refresh s", "spark copy rows/s"],
        [[C.human_rows(b["rows"]), b["pk"], _best(b, "spark_copy"), _best(b, "pyarrow_copy"),
          _best(b, "full_refresh"), _best(b, "clustered_refresh"),
          b["rows"] / _best(b, "spark_copy")] for b in out["baselines"]])
    print("\nBackfill to completion under a steady change stream")
    rows = []
    for r in out["runs"]:
        if "failed" in r:
            rows.append([C.human_rows(r["rows"]), r["pk"], r["mode"], r["vnodes"], "FAILED",
                         "", "", "", "", "", "", "", "", ""])
            continue
        b = bases.get((r["rows"], r["pk"]), {})
        sc, pa_, fr, cr = (_best(b, k) for k in ("spark_copy", "pyarrow_copy", "full_refresh",
                                                  "clustered_refresh"))
        rows.append([
            C.human_rows(r["rows"]), r["pk"], r["mode"], r["vnodes"], r["barriers"],
            r["seconds"], r["rows_per_second"],
            f"{r['seconds'] / sc:.2f}x" if sc else "-",
            f"{r['seconds'] / pa_:.2f}x" if pa_ else "-",
            f"{r['seconds'] / fr:.2f}x" if fr else "-",
            f"{r['seconds'] / cr:.2f}x" if cr else "-",
            r["driver_peak_mib"], r["jvm_peak_mib"],
            f"{100 * r.get('foreign_cpu_share', 0):.0f}%",
        ])
    C.print_table(["rows", "pk", "mode", "vnodes", "barriers", "seconds", "rows/s",
                   "vs spark copy", "vs pyarrow copy", "vs full refresh",
                   "vs clustered refresh", "driver peak MiB", "JVM peak MiB", "foreign CPU"], rows)
    print("\nWhere the time goes (seconds: wall / driver CPU / JVM CPU, summed over barriers)")
    for r in out["runs"]:
        if "failed" in r:
            continue
        print(f"-- {C.human_rows(r['rows'])} {r['pk']} {r['mode']} ({r['seconds']:.1f}s)")
        C.print_table(["phase", "wall s", "share", "driver cpu s", "jvm cpu s"],
                      [[k, v[0], f"{100 * v[0] / r['seconds']:.0f}%", v[1], v[2]]
                       for k, v in r["phases"].items() if v[0] >= 0.01])
