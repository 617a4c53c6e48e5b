"""Issue 38's targets from one bench_vs_baselines run: each target, the platform's figure,
its baseline from the same run, the ratio, whether it is met, and for a miss the phases the
benchmark measured (the binding one first)."""

from __future__ import annotations

from benchmarks import common as C


def _case(cases: list[dict], fraction: float) -> dict | None:
    return next((c for c in cases if abs(c["fraction"] - fraction) < 1e-12), None)


def _top(phases: dict, n: int = 4) -> list[str]:
    """The n phases with the most wall time: 'name wall s (driver cpu / jvm cpu)'."""
    items = sorted(phases.items(), key=lambda kv: -kv[1][0])[:n]
    return [f"{k} {v[0]:.2f}s (driver {v[1]:.2f} / jvm {v[2]:.2f} cpu s)" for k, v in items]


def _with_rest(phases: dict, total: float) -> dict:
    """The phases plus the wall time none of them covers (the profiler wraps named functions
    of the step; glue between them, and work of functions it does not wrap, is the rest)."""
    rest = total - sum(v[0] for v in phases.values())
    return {**phases, "(outside the profiled phases)": [rest, 0.0, 0.0]}


def _case_phases(case: dict) -> list[str]:
    """The top phases of a barrier case's median run, the unprofiled rest among them."""
    run = case["median_run"]
    return _top(_with_rest(run["phases"], run["seconds"]))


def _row(target: str, figure: float | None, baseline: float | None, ratio: float | None,
         met: bool | None, phases: list[str] | None = None, note: str = "") -> dict:
    return {"target": target, "figure_s": figure, "baseline_s": baseline,
            "ratio": None if ratio is None else round(ratio, 2), "met": met,
            "phases": phases if met is False else None, "note": note}


def _bulk(size: dict) -> list[dict]:
    out, n = [], C.human_rows(size["rows"])
    bulk, base = size.get("snapshot_backfill") or {}, size.get("refresh_and_floors") or {}
    e2e = bulk.get("seconds")
    if e2e is None:
        return out
    parts = [b["seconds"] for b in bulk.get("per_barrier", [])]
    note = (f"bulk {sum(parts[:-1]):.2f}s + catch-up {parts[-1]:.2f}s; "
            f"{bulk.get('load', '')}") if len(parts) > 1 else bulk.get("load", "")
    phases = _top(_with_rest(bulk.get("phases") or {}, e2e))
    refresh = base.get("delta_spark_refresh_median")
    if refresh:
        r = e2e / refresh
        out.append(_row(f"snapshot backfill end to end <= 0.7x delta-spark full refresh, {n}",
                        e2e, refresh, r, r <= 0.7, phases, note))
    arrow = base.get("pyarrow_copy_median")
    if arrow:
        r = e2e / arrow
        out.append(_row(f"snapshot backfill end to end <= 1.5x pyarrow copy, {n}", e2e, arrow,
                        r, r <= 1.5, phases, note))
    jvm = base.get("jvm_spark_copy_median")
    if jvm:
        out.append(_row(f"(floor) snapshot backfill against the plain JVM Spark copy, {n}", e2e,
                        jvm, e2e / jvm, None, note="no target"))
    return out


def _incremental(size: dict) -> list[dict]:
    inc, ss = size.get("incremental"), size.get("streaming_cost")
    if not inc:
        return []
    out, rows, n = [], size["rows"], C.human_rows(size["rows"])
    cases, ss_cases = inc["cases"], (ss or {}).get("cases", [])
    ours, theirs = _case(cases, 0.001), _case(ss_cases, 0.001)
    if ours:
        b = ours["median_seconds"]
        phases = _case_phases(ours)
        if theirs:
            r = theirs["median_merge_seconds"] / b
            out.append(_row(f"0.1% barrier >= 20x cheaper than delta-spark's MERGE of the same "
                            f"changes (foreachBatch: read, net, MERGE), {n}", b,
                            theirs["median_merge_seconds"], r, r >= 20, phases,
                            f"availableNow query {theirs['median_query_seconds']:.2f}s; "
                            f"{inc.get('load', '')}"))
        refresh = (ss or {}).get("delta_spark_refresh_final_median")
        if refresh:
            r = refresh / b
            out.append(_row(f"0.1% barrier >= 40x cheaper than the delta-spark full refresh, "
                            f"{n}", b, refresh, r, r >= 40, phases,
                            f"the project's own parquet refresh {inc['full_refresh_median']:.2f}s"))
    small, theirs_small = _case(cases, 0.0001), _case(ss_cases, 0.0001)
    if small:
        b = small["median_seconds"]
        target = rows == 20_000_000
        out.append(_row(f"0.01% barrier < 100 ms, {n}" + ("" if target else
                                                          " (the target is at 20M)"),
                        b, theirs_small and theirs_small["median_merge_seconds"], None,
                        (b < 0.1) if target else None,
                        _case_phases(small),
                        "baseline: the streaming pattern's MERGE of the same changes"))
    idle = _case(cases, 0.0)
    if idle:
        b = idle["median_seconds"]
        out.append(_row(f"idle barrier < 50 ms, {n}", b, (ss or {}).get("idle_query_seconds"),
                        None, b < 0.05,
                        _case_phases(idle),
                        "baseline: an availableNow query with nothing new"))
    big, theirs_big = _case(cases, 0.01), _case(ss_cases, 0.01)
    if big and theirs_big:
        b = big["median_seconds"]
        out.append(_row(f"(no target) 1% barrier against the streaming MERGE, {n}", b,
                        theirs_big["median_merge_seconds"],
                        theirs_big["median_merge_seconds"] / b, None))
    return out


def _latency(out: dict) -> list[dict]:
    ours = {r["interval"]: r for r in (out.get("latency_ours") or {}).get("results", [])}
    ss: dict[float, list[dict]] = {}
    for r in (out.get("latency_streaming") or {}).get("results", []):
        ss.setdefault(r["interval"], []).append(r)
    rows = []
    for interval, r in sorted(ours.items()):
        lat = r.get("latency") or {}
        if not lat.get("n"):
            continue
        best = min((s for s in ss.get(interval, []) if s["latency"].get("n")),
                   key=lambda s: s["latency"]["median"], default=None)
        base = best["latency"]["median"] if best else None
        trig = f"processingTime {best['trigger_seconds']:g} s" if best else ""
        phases = [f"{k}: median {v['median']:.2f}s, p95 {v['p95']:.2f}s" if v.get("n")
                  else f"{k}: no samples" for k, v in r["breakdown"].items()]
        if interval == 1.0:
            rows.append(_row("continuous, 1 commit/s: commit-to-MV median <= 0.5 s",
                             lat["median"], base, None, lat["median"] <= 0.5, phases))
            rows.append(_row("continuous, 1 commit/s: commit-to-MV p95 <= 1 s", lat["p95"],
                             best and best["latency"]["p95"], None, lat["p95"] <= 1.0, phases))
            if base:
                rows.append(_row("continuous, 1 commit/s: median <= 1/3 of the streaming "
                                 "pattern's median", lat["median"], base, base / lat["median"],
                                 lat["median"] <= base / 3, phases, f"its best trigger: {trig}"))
        else:
            rows.append(_row(f"(no target) continuous, 1 commit per {interval:g} s: median",
                             lat["median"], base, base and base / lat["median"], None,
                             note=f"p95 {lat['p95']:.2f}s; streaming pattern's best: {trig}"))
    return rows


def targets(out: dict) -> list[dict]:
    rows = []
    for size in out.get("sizes", []):
        rows += _bulk(size) + _incremental(size)
    return rows + _latency(out)


def print_targets(out: dict) -> None:
    code = out["machine"].get("code", {}).get("commit")
    print(f"\nIssue 38 targets, one run ({out['machine']['date']}, {code})")
    C.print_table(["target", "figure s", "baseline s", "baseline / figure or ratio", "met"],
                  [[t["target"], t["figure_s"] if t["figure_s"] is not None else "-",
                    t["baseline_s"] if t["baseline_s"] is not None else "-",
                    t["ratio"] if t["ratio"] is not None else "-",
                    {True: "yes", False: "NO", None: "-"}[t["met"]]] for t in out["targets"]])
    for t in out["targets"]:
        if t["note"]:
            print(f"  {t['target']}: {t['note']}")
        if t["met"] is False and t["phases"]:
            print(f"  MISSED {t['target']}: phases " + "; ".join(t["phases"]))
