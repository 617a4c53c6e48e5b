"""Vnode partitions: one Dagster partition per vnode, runs over ranges of them."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import dagster as dg
from dagster._core.errors import DagsterUnknownPartitionError

from backfill_assets.core.errors import UnknownVnodePartition

RANGE_START = "dagster/asset_partition_range_start"
RANGE_END = "dagster/asset_partition_range_end"


def vnode_key(vnode: int, vnode_count: int) -> str:
    """Zero-padded so the UI and range tags sort vnodes numerically."""
    return str(vnode).zfill(len(str(vnode_count - 1)))


class VnodePartitions(dg.StaticPartitionsDefinition):
    """The MV's vnode keys; a range naming a key that does not exist is refused by name.

    Why: Dagster's own refusal is a `DagsterInvalidInvocationError` at the end of a 30-frame
    traceback that lists the wrong keys but not the right ones; an operator who typed `000`
    for a 64-vnode MV needs the keys that exist and a command that works."""

    def __init__(self, vnode_count: int) -> None:
        super().__init__([vnode_key(v, vnode_count) for v in range(vnode_count)])
        self.vnode_count = vnode_count

    def __repr__(self) -> str:  # the hash of Dagster's snapshots: the same as a static def's
        return f"StaticPartitionsDefinition(partition_keys={self.get_partition_keys()})"

    def get_partition_keys_in_range(self, partition_key_range: dg.PartitionKeyRange
                                    ) -> Sequence[str]:
        wrong = [k for k in (partition_key_range.start, partition_key_range.end)
                 if not self.has_partition_key(k)]
        if wrong:
            raise UnknownVnodePartition(unknown_keys_message(wrong, self.vnode_count))
        return super().get_partition_keys_in_range(partition_key_range)

    def validate_partition_key(self, partition_key: str, context) -> None:
        """Dagster's own check (its callers catch `DagsterUnknownPartitionError`), caused by the
        named error, which `named_errors` prints first."""
        if not self.has_partition_key(partition_key):
            named = UnknownVnodePartition(unknown_keys_message([partition_key], self.vnode_count))
            raise DagsterUnknownPartitionError(str(named)) from named
        super().validate_partition_key(partition_key, context)


def unknown_keys_message(wrong: Sequence[str], vnode_count: int) -> str:
    """What a wrong key's refusal says: the keys that exist and a range that works."""
    first, last = vnode_key(0, vnode_count), vnode_key(vnode_count - 1, vnode_count)
    half = vnode_key(vnode_count // 2 - 1, vnode_count) if vnode_count > 1 else last
    return (f"no vnode partition {', '.join(repr(k) for k in wrong)}: this MV has "
            f"{vnode_count} vnodes, keys {first!r}..{last!r} ({len(first)} digits, "
            f"BACKFILL_VNODE_COUNT / vnode_count in the MV definition). Name a range of "
            f"existing keys, e.g. (job execute) --tags '{{\"{RANGE_START}\": \"{first}\", "
            f"\"{RANGE_END}\": \"{half}\"}}' or (asset materialize) --partition-range "
            f"{first}...{half}. A run this launch left NOT_STARTED never runs: the barrier "
            "sensor marks it failed")


def vnode_partitions(vnode_count: int) -> VnodePartitions:
    return VnodePartitions(vnode_count)


def vnodes_of(keys: Iterable[str]) -> list[int]:
    return sorted(int(k) for k in keys)


def vnode_ranges(vnode_count: int, runs: int) -> list[tuple[int, int]]:
    """`runs` contiguous, inclusive vnode ranges covering every vnode (as even as possible)."""
    runs = max(1, min(runs, vnode_count))
    bounds = [round(i * vnode_count / runs) for i in range(runs + 1)]
    return [(bounds[i], bounds[i + 1] - 1) for i in range(runs)]


def range_tags(first: int, last: int, vnode_count: int) -> dict[str, str]:
    """Run tags that select the vnode range [first, last]."""
    return {RANGE_START: vnode_key(first, vnode_count), RANGE_END: vnode_key(last, vnode_count)}


def split(vnodes: Sequence[int]) -> str:
    return f"{vnodes[0]}..{vnodes[-1]}" if vnodes else "none"
