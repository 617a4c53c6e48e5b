"""The writes a step commits: merge-on-read, bulk slices written by Python tasks, the replica's
copy and maintenance (compaction, vacuum, DV garbage)."""
