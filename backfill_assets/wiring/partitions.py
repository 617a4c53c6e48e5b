"""Vnode partitions: one Dagster partition per vnode, runs over ranges of them."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import dagster as dg


def vnode_key(vnode: int, vnode_count: int) -> str:
    """Zero-padded so the UI and range tags sort vnodes numerically."""
    return str(vnode).zfill(len(str(vnode_count - 1)))


def vnode_partitions(vnode_count: int) -> dg.StaticPartitionsDefinition:
    return dg.StaticPartitionsDefinition([vnode_key(v, vnode_count) for v in range(vnode_count)])


def vnodes_of(keys: Iterable[str]) -> list[int]:
    return sorted(int(k) for k in keys)


def vnode_ranges(vnode_count: int, runs: int) -> list[tuple[int, int]]:
    """`runs` contiguous, inclusive vnode ranges covering every vnode (as even as possible)."""
    runs = max(1, min(runs, vnode_count))
    bounds = [round(i * vnode_count / runs) for i in range(runs + 1)]
    return [(bounds[i], bounds[i + 1] - 1) for i in range(runs)]


def range_tags(first: int, last: int, vnode_count: int) -> dict[str, str]:
    """Run tags that select the vnode range [first, last]."""
    return {
        "dagster/asset_partition_range_start": vnode_key(first, vnode_count),
        "dagster/asset_partition_range_end": vnode_key(last, vnode_count),
    }


def split(vnodes: Sequence[int]) -> str:
    return f"{vnodes[0]}..{vnodes[-1]}" if vnodes else "none"
