"""Verification: the independent oracle that recomputes the MV from the upstream and compares
it row for row (oracle.py), shared by verify_job, the matches_oracle check and the tests; and,
at sizes the oracle cannot hold, per-vnode fingerprints against Spark's own recompute
(scale_check.py)."""
