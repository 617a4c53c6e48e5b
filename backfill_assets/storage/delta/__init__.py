"""The Delta log: delta-rs as an adapter, the layer's own log replay (versions, files, deletion
vectors, app transactions, column mapping), heads without file lists, change actions,
file pruning by statistics and the platform's merge-on-read tables."""
