"""Bytes in a store, a local folder or an S3-compatible object store: filesystems, create-only
writes for log entries, documents replaced whole, the conditional-write probe, and handing
freed native memory back."""
